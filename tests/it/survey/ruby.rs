//! Sidekiq 6.4 as its own code leaves a Redis (`tests/ruby/survey_sidekiq.rb`),
//! plain and under a redis-namespace, with gitlab-sidekiq-fetcher's working
//! list and a real Sidekiq worker killed mid-job.

use std::process::Stdio;
use std::time::Duration;

use super::harness::{self, MARK};
use crate::servers::ThrowawayRedis;
use crate::support;

/// A real `sidekiq` process on `redis` running the queues `failing` and
/// `slow` (`tests/ruby/survey_sidekiq_worker.rb`).
fn sidekiq_worker(redis: &ThrowawayRedis) -> tokio::process::Child {
    let app = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/ruby/survey_sidekiq_worker.rb"
    );
    tokio::process::Command::new("sidekiq")
        .args(["-r", app, "-q", "failing", "-q", "slow", "-c", "2"])
        .env("REDIS_URL", redis.url())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("sidekiq starts (Debian's ruby-sidekiq: ./scripts/test-deps.sh)")
}

#[tokio::test]
async fn sidekiq_plain_and_namespaced_with_reliable_fetch_and_a_real_worker() {
    let redis = ThrowawayRedis::start();
    let url = redis.url();
    support::ruby("survey_sidekiq.rb", &[("REDIS_URL", &url), ("MARK", MARK)]);
    support::ruby(
        "survey_sidekiq.rb",
        &[
            ("REDIS_URL", &url),
            ("MARK", MARK),
            ("SIDEKIQ_NAMESPACE", "acme"),
            ("ALONE", "1"),
        ],
    );
    // The worker fails Boom (Sidekiq's retry puts it in `retry`) and is in
    // the middle of Slow when it is killed: its process hash and busy
    // threads stay for their minute.
    let mut worker = sidekiq_worker(&redis);
    let conn = harness::admin(&redis).await;
    support::wait_for(
        "the worker retried Boom and runs Slow",
        Duration::from_secs(60),
        || {
            let mut conn = conn.clone();
            async move {
                let retrying: u64 = redis::cmd("ZCARD")
                    .arg("retry")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let processes: Vec<String> = redis::cmd("SMEMBERS")
                    .arg("processes")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                // What the last heartbeat recorded as running: Slow alone
                // (a beat taken while Boom still ran would show it too).
                let mut running = Vec::new();
                for p in processes {
                    let jobs: Vec<String> = redis::cmd("HVALS")
                        .arg(format!("{p}:workers"))
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    running.extend(jobs.iter().map(|j| j.contains(r#""queue":"slow""#)));
                }
                retrying == 1 && running == [true]
            }
        },
    )
    .await;
    worker.kill().await.unwrap();

    let s = harness::survey_read_only(&redis, "1s", true).await;
    // waiting, scheduled, retrying, dead, in flight
    assert_eq!(s.counts("sidekiq", "", "default"), [3, 2, 0, 1, 0]);
    assert_eq!(s.counts("sidekiq", "", "mailers"), [1, 0, 0, 0, 1]);
    assert_eq!(s.counts("sidekiq", "", "failing"), [0, 0, 1, 0, 0]);
    assert_eq!(s.counts("sidekiq", "", "slow"), [0, 0, 0, 0, 1]);
    assert_eq!(s.counts("sidekiq", "acme", "default"), [3, 2, 1, 1, 0]);
    assert_eq!(s.counts("sidekiq", "acme", "mailers"), [1, 0, 0, 0, 1]);
    assert_eq!(
        s.row("sidekiq", "acme", "default")["key"],
        "acme:queue:default"
    );
    let payload = &s.row("sidekiq", "", "default")["payload"];
    assert_eq!(payload["sampled"], 3);
    assert!(
        payload["max_bytes"].as_u64().unwrap() > MARK.len() as u64,
        "{payload}"
    );

    for ns in ["", "acme"] {
        let found = s.found("sidekiq", ns);
        assert_eq!(found["workers"], 1, "{found}");
        let hints = found["version_hints"].to_string();
        assert!(hints.contains("Sidekiq before 7.0.2"), "{hints}");
        assert!(hints.contains("created_at in seconds"), "{hints}");
        assert!(
            found["options"]
                .to_string()
                .contains("gitlab-sidekiq-fetcher"),
            "{found}"
        );
    }
    assert!(s.found("sidekiq", "acme")["options"]
        .to_string()
        .contains("redis-namespace"));
    // Nothing of Sidekiq's is taken for a hand-rolled queue (the working
    // lists, the `-signals` lists).
    assert!(
        s.json["queues"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["framework"] != "list"),
        "{}",
        s.json
    );

    let routes: Vec<(&str, &str)> = s
        .draft
        .routes
        .iter()
        .map(|r| (r.name.as_str(), r.redis_key.as_str()))
        .collect();
    assert_eq!(
        routes,
        [
            ("default", "queue:default"),
            ("failing", "queue:failing"),
            ("mailers", "queue:mailers"),
            ("slow", "queue:slow"),
            ("acme-default", "acme:queue:default"),
            ("acme-mailers", "acme:queue:mailers"),
        ]
    );
    assert!(s.draft.routes.iter().all(|r| r.max_attempts == Some(26)));
    assert!(s.text.contains("acme:queue:default"), "{}", s.text);
}
