//! Celery 5.7 and RQ 3.0 as their own code leaves a Redis
//! (`tests/python/survey_celery.py`, `tests/python/survey_rq.py`), with a
//! real Celery worker holding a countdown task and a real RQ worker.

use std::process::Stdio;
use std::time::Duration;

use super::harness::{self, MARK};
use crate::servers::ThrowawayRedis;
use crate::support;

/// A real process of the test venv (`python -m <module> <args>`) in
/// `tests/python`, killed when dropped.
fn spawn_python(module: &str, args: &[&str], env: &[(&str, &str)]) -> tokio::process::Child {
    tokio::process::Command::new(support::python())
        .args(["-m", module])
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python"))
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts")
}

/// Waits until `key`'s cardinality (by `cmd`: HLEN, SCARD) is `n`.
async fn wait_until(redis: &ThrowawayRedis, what: &str, cmd: &str, key: &str, n: u64) {
    let conn = harness::admin(redis).await;
    support::wait_for(what, Duration::from_secs(90), || {
        let mut conn = conn.clone();
        async move {
            redis::cmd(cmd)
                .arg(key)
                .query_async::<u64>(&mut conn)
                .await
                .unwrap()
                == n
        }
    })
    .await;
}

#[tokio::test]
async fn celery_queues_with_priorities_unacked_and_a_key_prefix() {
    let redis = ThrowawayRedis::start();
    let url = redis.url();
    let env = [("QBT_BROKER", url.as_str()), ("QBT_MARK", MARK)];
    // A countdown task, taken by a real worker that holds it in `unacked`
    // until it is due, then killed (so it keeps holding it).
    harness::python("survey_celery.py", &["later"], &env).await;
    let mut worker = spawn_python(
        "celery",
        &[
            "-A",
            "survey_celery",
            "worker",
            "-Q",
            "orders",
            "--pool",
            "solo",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "WARNING",
        ],
        &env,
    );
    wait_until(
        &redis,
        "the worker holds the countdown task",
        "HLEN",
        "unacked",
        1,
    )
    .await;
    worker.kill().await.unwrap();
    harness::python("survey_celery.py", &["produce"], &env).await;
    let prefixed = [
        ("QBT_BROKER", url.as_str()),
        ("QBT_MARK", MARK),
        ("QBT_PREFIX", "acme:"),
    ];
    harness::python("survey_celery.py", &["produce"], &prefixed).await;

    let s = harness::survey_read_only(&redis, "1s", true).await;
    // waiting (with the priority lists), scheduled, retrying, dead, in flight
    assert_eq!(s.counts("celery", "", "orders"), [4, -1, -1, -1, 1]);
    assert_eq!(
        s.row("celery", "", "orders")["priority_steps"],
        serde_json::json!([3, 9])
    );
    assert_eq!(s.counts("celery", "acme:", "orders"), [4, -1, -1, -1, 0]);
    assert_eq!(s.row("celery", "acme:", "orders")["key"], "acme:orders");
    let plain = s.found("celery", "");
    assert_eq!(plain["workers"], 1, "{plain}");
    assert!(
        plain["version_hints"]
            .to_string()
            .contains("task protocol 2"),
        "{plain}"
    );
    let prefix = s.found("celery", "acme:");
    assert!(
        prefix["options"].to_string().contains("global_keyprefix"),
        "{prefix}"
    );
    // Celery's remote-control plumbing is not a queue.
    assert_eq!(s.json["queues"].as_array().unwrap().len(), 2, "{}", s.json);

    let routes: Vec<(&str, &str, Option<&[u8]>)> = s
        .draft
        .routes
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.redis_key.as_str(),
                r.keys.priority_steps.as_deref(),
            )
        })
        .collect();
    let steps: &[u8] = &[3, 6, 9];
    assert_eq!(
        routes,
        [
            ("orders", "orders", Some(steps)),
            ("acme-orders", "acme:orders", Some(steps))
        ]
    );
    assert!(
        s.draft_text
            .contains("key_prefix = \"acme:\"   # kombu's global_keyprefix"),
        "{}",
        s.draft_text
    );
    let prefixes: Vec<Option<&str>> = s
        .draft
        .routes
        .iter()
        .map(|r| r.keys.prefix.as_deref())
        .collect();
    assert_eq!(
        prefixes,
        [None, Some("acme:")],
        "the draft's route states the prefix"
    );
    assert!(s.text.contains("4 incl. prio [3, 9]"), "{}", s.text);
}

#[tokio::test]
async fn rq_queues_registries_and_worker_version() {
    let redis = ThrowawayRedis::start();
    let url = redis.url();
    let env = [("QBT_BROKER", url.as_str()), ("QBT_MARK", MARK)];
    harness::python("survey_rq.py", &["fill"], &env).await;
    // A real RQ worker registers itself (with its version), then is killed:
    // its hash outlives it for its TTL.
    let mut worker = spawn_python("rq.cli", &["worker", "--url", &url, "idle"], &env);
    wait_until(&redis, "the RQ worker registered", "SCARD", "rq:workers", 1).await;
    worker.kill().await.unwrap();

    let s = harness::survey_read_only(&redis, "1s", true).await;
    assert_eq!(s.counts("rq", "", "reports"), [2, 2, -1, 1, 0]);
    let row = s.row("rq", "", "reports");
    assert_eq!(row["key"], "rq:queue:reports");
    assert_eq!(row["push"], "rpush");
    assert_eq!(row["payload"]["of"], "rq job data");
    assert_eq!(row["payload"]["sampled"], 2);
    let found = s.found("rq", "");
    assert!(
        found["version_hints"].to_string().contains("RQ 3.0.0"),
        "{found}"
    );
    assert_eq!(found["workers"], 1);
    let route = &s.draft.routes[0];
    assert_eq!(
        (
            route.redis_key.as_str(),
            route.format.to_string(),
            route.max_attempts
        ),
        ("rq:queue:reports", "rq".to_string(), Some(1))
    );
    assert_eq!(route.push, qbridge::config::PushEnd::Rpush);
}
