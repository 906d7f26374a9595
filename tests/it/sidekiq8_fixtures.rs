//! Sidekiq 8's client through qbridge's proxy, from fixtures: Sidekiq 8
//! needs Ruby 3.2, which these machines lack, so `tests/ruby/sidekiq8_client.rb`
//! pushes exactly as its client does (written after its source, cited
//! there), over redis-client with RESP3 as Sidekiq 8 does. A route in
//! `dual_write` must mirror every job once, keyed by its `jid`, whatever
//! the form of the push: `perform_async` (a pipeline of `SADD queues` then
//! `LPUSH`, integer-millisecond `created_at`/`enqueued_at`), `push_bulk`
//! (slices of 1,000 in one `LPUSH` each), `perform_in` (`ZADD schedule`
//! with a float-seconds score) and `push_bulk` with one `at` per job (one
//! `ZADD` with many scores); a scheduled copy is due at its score.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::PgPool;

use crate::exactly_once::ProxySide;
use crate::servers::ThrowawayRedis;
use crate::support;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// What the fixture printed: ready jids, and scheduled jids with their
/// scores as written in the ZADD.
#[derive(Default)]
struct Pushed {
    ready: Vec<String>,
    scheduled: BTreeMap<String, String>,
}

/// Runs the fixture with `args` against `redis_url` (the proxy).
async fn push(args: &[&str], redis_url: &str, queue: &str, pushed: &mut Pushed) {
    let out = tokio::process::Command::new("ruby")
        .arg(format!("{REPO}/tests/ruby/sidekiq8_client.rb"))
        .args(args)
        .env(
            "RUBYLIB",
            format!("{REPO}/vendor/ruby/redis-client-0.26.4/lib"),
        )
        .env("REDIS_URL", redis_url)
        .env("SIDEKIQ_QUEUE", queue)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("the fixture finished within 120 s")
        .expect("ruby runs (./scripts/test-deps.sh)");
    assert!(
        out.status.success(),
        "sidekiq8_client.rb {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts[..] {
            ["ready", jid] => pushed.ready.push(jid.to_string()),
            ["scheduled", jid, score] => {
                pushed.scheduled.insert(jid.to_string(), score.to_string());
            }
            _ => panic!("unexpected line from the fixture: {line}"),
        }
    }
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn sidekiq_8s_pushes_are_each_mirrored_once_and_scheduled_ones_due_at_their_score(
    pool: PgPool,
) {
    let redis = ThrowawayRedis::start();
    let toml = "[[routes]]\nname = \"mail8\"\nredis_key = \"queue:mail8\"\nqueue = \"mail8\"\n\
                format = \"sidekiq\"\nphase = \"dual_write\"\n";
    let side = ProxySide::start_on(&pool, toml, &redis.url()).await;
    let url = side.url();
    let mut pushed = Pushed::default();
    push(&["async", "20"], &url, "mail8", &mut pushed).await;
    push(&["bulk", "2500"], &url, "mail8", &mut pushed).await;
    push(&["in", "10", "3600"], &url, "mail8", &mut pushed).await;
    push(&["bulk_at", "1500", "7200"], &url, "mail8", &mut pushed).await;
    assert_eq!(
        (pushed.ready.len(), pushed.scheduled.len()),
        (2520, 1510),
        "the fixture pushed what it was asked"
    );
    let total = (pushed.ready.len() + pushed.scheduled.len()) as i64;

    // Every job once, under its jid: no other key, none twice.
    support::wait_for(
        "every Sidekiq 8 job mirrored",
        Duration::from_secs(30),
        || async {
            support::count(
                &pool,
                "SELECT count(*) FROM qbridge.job_keys WHERE queue = 'mail8'",
            )
            .await
                >= total
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let keys: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT key, copy, flagged FROM qbridge.job_keys WHERE queue = 'mail8'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(keys.len() as i64, total, "one entry per job");
    let mut expected: Vec<&String> = pushed.ready.iter().chain(pushed.scheduled.keys()).collect();
    expected.sort();
    let mut got: Vec<&String> = keys.iter().map(|(k, _, _)| k).collect();
    got.sort();
    assert_eq!(got, expected, "keyed by jid");
    assert!(
        keys.iter()
            .all(|(_, copy, flagged)| copy == "mirror" && flagged.is_none()),
        "mirror copies, none flagged"
    );

    // A scheduled copy is due at its ZADD score (float seconds; Postgres
    // keeps microseconds).
    let rows: Vec<(String, f64)> = sqlx::query_as(
        "SELECT key, extract(epoch FROM run_at)::float8 FROM qbridge.jobs \
          WHERE queue = 'mail8' AND key = ANY($1)",
    )
    .bind(pushed.scheduled.keys().cloned().collect::<Vec<_>>())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), pushed.scheduled.len(), "one job row each");
    for (jid, run_at) in rows {
        let score: f64 = pushed.scheduled[&jid].parse().unwrap();
        assert!(
            (run_at - score).abs() < 2e-6,
            "{jid}: run_at {run_at} is not its score {score}"
        );
    }
    side.stop().await;
}
