//! RQ pushes only a job's id onto `rq:queue:<name>`; the job
//! itself (function, arguments, options) is the hash `rq:job:<id>`. Real
//! RQ enqueues through the proxy in `dual_write`, and each mirror copy must
//! carry its job byte-exact, or Postgres could never run it without Redis.

use base64::Engine as _;
use sqlx::PgPool;

use qbridge::redis::connect::connect_redis;

use crate::exactly_once::{ProxySide, REDIS};
use crate::support;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_rq_mirror_copy_carries_its_job_hash_byte_exact(pool: PgPool) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route, queue) = (format!("rq{}", &id[..12]), format!("qbt_rq_{id}"));
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"rq:queue:{queue}\"\nqueue = \"{route}\"\n\
         format = \"rq\"\nphase = \"dual_write\"\n"
    );
    let side = ProxySide::start(&pool, &toml).await;
    let ids = enqueue(&side.url(), &queue, 5).await;
    assert_eq!(ids.len(), 5);
    support::wait_for_count(
        &pool,
        "every RQ job mirrored",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{route}'"),
        5,
    )
    .await;

    let mut redis = connect_redis(REDIS).await.unwrap();
    for job_id in &ids {
        let payload: serde_json::Value =
            sqlx::query_scalar("SELECT payload FROM qbridge.jobs WHERE queue = $1 AND key = $2")
                .bind(&route)
                .bind(job_id)
                .fetch_one(&pool)
                .await
                .unwrap();
        let hash: Vec<(String, Vec<u8>)> = ::redis::cmd("HGETALL")
            .arg(format!("rq:job:{job_id}"))
            .query_async(&mut redis)
            .await
            .unwrap();
        assert!(!hash.is_empty(), "RQ wrote the job hash");
        let job = &payload["rq_job"];
        for (field, value) in &hash {
            let stored = match &job[field] {
                serde_json::Value::String(text) => text.as_bytes().to_vec(),
                other => base64::engine::general_purpose::STANDARD
                    .decode(other["base64"].as_str().expect("text or base64"))
                    .unwrap(),
            };
            assert_eq!(&stored, value, "field {field} of job {job_id}");
        }
        assert_eq!(job.as_object().unwrap().len(), hash.len(), "{payload}");
        assert_eq!(job["origin"], queue.as_str(), "{payload}");
        assert_eq!(payload["rq_job_id"], job_id.as_str());
    }
    let _: () = ::redis::cmd("DEL")
        .arg(format!("rq:queue:{queue}"))
        .arg(
            ids.iter()
                .map(|i| format!("rq:job:{i}"))
                .collect::<Vec<_>>(),
        )
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// Enqueues `n` jobs with real RQ through `broker`; their ids.
async fn enqueue(broker: &str, queue: &str, n: usize) -> Vec<String> {
    let n = n.to_string();
    let args = ["rq_app.py", "produce", n.as_str()];
    support::python_script_ok(&support::python(), &args, broker, queue).await
}
