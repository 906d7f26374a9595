//! A Sidekiq route's jobs also wait in Sidekiq's `schedule`,
//! `retry` and `dead` sets, shared by every queue. Real Sidekiq 6.4 puts
//! them there; qbridge counts the route's own, and the gate into
//! `decommissioned` refuses while any is left (decommissioning carries only
//! the route's lists, so they would be stranded).

use std::sync::Arc;

use sqlx::PgPool;

use qbridge::config::{Config, Overrides};
use qbridge::cutover::store::RouteState;
use qbridge::model::structures::Holding;
use qbridge::model::Phase;
use qbridge::ops::{gates, structures};
use qbridge::redis::connect::connect_redis;
use qbridge::routes::{Route, Routes};

use crate::servers::ThrowawayRedis;
use crate::support;

/// A throwaway Redis where real Sidekiq put jobs in its list and its three
/// sets (`tests/ruby/sidekiq_structures.rb`), and the route of queue
/// "default" in `postgres_only`.
fn sidekiq_jobs_everywhere() -> (ThrowawayRedis, Arc<Route>) {
    let server = ThrowawayRedis::start();
    support::ruby("sidekiq_structures.rb", &[("REDIS_URL", &server.url())]);
    let toml = "[[routes]]\nname = \"mail\"\nredis_key = \"queue:default\"\nqueue = \"mail\"\n\
                format = \"sidekiq\"\nphase = \"postgres_only\"\n";
    let cfg = Config::from_toml(toml, &Overrides::default()).expect("route config");
    let routes = Routes::from_config(&cfg.routes);
    let route = Arc::clone(routes.by_name("mail").unwrap());
    (server, route)
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn sidekiq_jobs_outside_the_list_are_counted_and_hold_decommission(pool: PgPool) {
    let (server, route) = sidekiq_jobs_everywhere();
    let mut conn = connect_redis(&server.url()).await.unwrap();

    let held = structures::read(&mut conn, &route).await.unwrap();
    let counts: Vec<(Holding, &str, u64)> = held
        .iter()
        .map(|h| (h.holding, h.key.as_str(), h.jobs))
        .collect();
    assert_eq!(
        counts,
        [
            (Holding::Scheduled, "schedule", 3),
            (Holding::Retrying, "retry", 1),
            (Holding::Dead, "dead", 1)
        ],
        "the job of queue \"other\" is not the route's"
    );
    let next = held[0].next_at.expect("scheduled jobs have a time");
    let ahead = next - chrono::Utc::now();
    assert!(
        ahead > chrono::Duration::minutes(59) && ahead < chrono::Duration::minutes(61),
        "perform_in(3600) is due in an hour: {next}"
    );

    let state = RouteState {
        route: "mail".into(),
        phase: Phase::PostgresOnly,
        percent: 100,
        since: chrono::Utc::now() - chrono::Duration::hours(1),
        changed_by: "test".into(),
        reason: "test".into(),
    };
    let gate = gates::evaluate(&pool, Some(&mut conn), &route, &state)
        .await
        .unwrap()
        .expect("a gate into decommissioned");
    let check = gate
        .checks
        .iter()
        .find(|c| c.name == "jobs in the framework's other structures")
        .expect("the check is there");
    assert!(!check.passed, "{check:?}");
    assert!(
        check.value.contains("schedule: 3 scheduled") && check.value.contains("retry: 1"),
        "{check:?}"
    );
    assert!(!gate.passed());
    // The diff says where they are, too.
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let (diff, _) = gates::diff_since(&pool, &mut conn, &route, Phase::PostgresOnly, since)
        .await
        .unwrap();
    assert!(
        diff.verdict
            .contains("also only on Redis, outside the list: schedule: 3 scheduled"),
        "{}",
        diff.verdict
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_forced_decommission_carries_them_into_postgres_due_at_their_times(pool: PgPool) {
    use qbridge::ops::operate::{self, Request};

    let (server, route) = sidekiq_jobs_everywhere();
    qbridge::cutover::store::register(&pool, "mail", Phase::PostgresOnly, "test")
        .await
        .unwrap();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    let req = Request {
        by: "test@ops",
        reason: Some("carry Sidekiq's sets"),
        force: true,
        percent: None,
    };
    let done = operate::advance(&pool, Some(&mut conn), &route, &req, 1 << 20)
        .await
        .map_err(|_| "refused")
        .unwrap();
    let carried = done.archived.expect("archived").carried;
    assert_eq!(
        (carried.scheduled, carried.retrying, carried.dead),
        (3, 1, 1)
    );

    let due: Vec<(String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT key, run_at FROM qbridge.jobs WHERE queue = 'mail' AND copy = 'live' \
           AND run_at > now() + interval '10 seconds' ORDER BY run_at",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        due.len(),
        4,
        "3 scheduled in an hour and the retry: {due:?}"
    );
    assert_eq!(due[0].0, "retry-jid", "the retry is due first: {due:?}");
    // Sidekiq's retry handler wrote retry_count 0 after the first failure:
    // the job used one attempt on Redis, and its row starts from it.
    let attempts: i32 =
        sqlx::query_scalar("SELECT attempts FROM qbridge.jobs WHERE key = 'retry-jid'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(attempts, 1);
    let dead: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.jobs_dead WHERE queue = 'mail' AND key = 'dead-jid'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(dead, 1);
    // Only the route's members left Redis: the other queue's job stays.
    for (set, left) in [("schedule", 1), ("retry", 0), ("dead", 0)] {
        let n: i64 = ::redis::cmd("ZCARD")
            .arg(set)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(n, left, "{set}");
    }
}

/// The importer copies what Sidekiq already held before the route was
/// mirrored — the list's backlog, the route's scheduled and retrying jobs
/// (mirror copies due at their times) and its dead job — leaves Redis as it
/// was, stores nothing twice when run again, and a later forced
/// decommission leaves one live job per jid.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn import_copies_the_backlog_and_the_sets_once(pool: PgPool) {
    use qbridge::ops::import;
    use qbridge::ops::operate::{self, Request};

    let (server, route) = sidekiq_jobs_everywhere();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    let importer = conn.clone();
    let run = |dry_run: bool| {
        let (pool, route, mut conn) = (pool.clone(), Arc::clone(&route), importer.clone());
        async move {
            import::import(
                &pool,
                &mut conn,
                &route,
                Phase::DualWrite,
                dry_run,
                1 << 20,
                |_, _| {},
            )
            .await
            .unwrap()
        }
    };
    let summary = |r: &import::ImportReport| -> Vec<(String, usize, usize, usize)> {
        r.structures
            .iter()
            .map(|s| (s.key.clone(), s.found, s.new, s.known))
            .collect()
    };
    let expected_new = vec![
        ("queue:default".to_string(), 2, 2, 0),
        ("schedule".to_string(), 3, 3, 0),
        ("retry".to_string(), 1, 1, 0),
        ("dead".to_string(), 1, 1, 0),
    ];

    let dry = run(true).await;
    assert_eq!(summary(&dry), expected_new);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.job_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 0, "a dry run stores nothing");

    assert_eq!(summary(&run(false).await), expected_new);
    let copies: Vec<(String, bool)> = sqlx::query_as(
        "SELECT key, run_at > now() + interval '10 seconds' FROM qbridge.jobs \
          WHERE queue = 'mail' AND copy = 'mirror' ORDER BY run_at, key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        copies.len(),
        6,
        "2 waiting, 3 scheduled, 1 retrying: {copies:?}"
    );
    assert_eq!(
        copies.iter().filter(|(_, later)| *later).count(),
        4,
        "the scheduled and retrying copies are due at their times: {copies:?}"
    );
    let dead: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.jobs_dead WHERE queue = 'mail' AND key = 'dead-jid'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(dead, 1);
    for (key, left) in [("schedule", 4), ("retry", 1), ("dead", 1)] {
        let n: i64 = ::redis::cmd("ZCARD")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(n, left, "{key} is left as it was");
    }
    let waiting: i64 = ::redis::cmd("LLEN")
        .arg("queue:default")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(waiting, 2);

    // A dry run now, and a real one, find everything known (the dead job
    // in jobs_dead, where it went).
    for dry_run in [true, false] {
        let again = run(dry_run).await;
        assert!(
            again
                .structures
                .iter()
                .all(|s| s.new == 0 && s.known == s.found),
            "{again:?}"
        );
    }

    // Decommission carries the sets into the copies already there: one
    // live job per jid, the dead job once.
    qbridge::cutover::store::register(&pool, "mail", Phase::PostgresOnly, "test")
        .await
        .unwrap();
    let req = Request {
        by: "test@ops",
        reason: Some("carry Sidekiq's sets after an import"),
        force: true,
        percent: None,
    };
    operate::advance(&pool, Some(&mut conn), &route, &req, 1 << 20)
        .await
        .map_err(|_| "refused")
        .unwrap();
    let per_key: Vec<(String, i64)> = sqlx::query_as(
        "SELECT key, count(*) FROM qbridge.jobs WHERE queue = 'mail' AND copy = 'live' \
          GROUP BY key ORDER BY key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(per_key.len(), 6, "every job once, live: {per_key:?}");
    assert!(per_key.iter().all(|(_, n)| *n == 1), "{per_key:?}");
    let dead: i64 =
        sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs_dead WHERE queue = 'mail'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dead, 1);
}

/// RQ keeps jobs in registries of the queue's own: real RQ 3.0 puts one
/// failed job in `rq:failed:<q>` (a SimpleWorker burst), two `enqueue_in`
/// jobs in `rq:scheduled:<q>` and leaves one waiting. qbridge counts them,
/// the importer copies them with their job hashes (the scheduled ones due
/// in an hour), and a forced decommission carries them: one live job per
/// id, the failed one in `jobs_dead`, the registries emptied.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn rq_registries_are_counted_imported_and_carried(pool: PgPool) {
    use qbridge::ops::import;
    use qbridge::ops::operate::{self, Request};

    let server = ThrowawayRedis::start();
    let out = std::process::Command::new(support::python())
        .args(["rq_app.py", "structures"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python"))
        .env("QBT_BROKER", server.url())
        .env("QBT_QUEUE", "reports")
        .output()
        .expect("rq_app.py runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    let (failed, scheduled, waiting) = (&ids[0], &ids[1..3], &ids[3]);
    let toml =
        "[[routes]]\nname = \"reports\"\nredis_key = \"rq:queue:reports\"\nqueue = \"reports\"\n\
                format = \"rq\"\nphase = \"dual_write\"\n";
    let cfg = Config::from_toml(toml, &Overrides::default()).expect("route config");
    let routes = Routes::from_config(&cfg.routes);
    let route = Arc::clone(routes.by_name("reports").unwrap());
    let mut conn = connect_redis(&server.url()).await.unwrap();

    let held = structures::read(&mut conn, &route).await.unwrap();
    let counts: Vec<(Holding, &str, u64)> = held
        .iter()
        .map(|h| (h.holding, h.key.as_str(), h.jobs))
        .collect();
    assert_eq!(
        counts,
        [
            (Holding::Scheduled, "rq:scheduled:reports", 2),
            (Holding::Dead, "rq:failed:reports", 1)
        ]
    );

    let report = import::import(
        &pool,
        &mut conn,
        &route,
        Phase::DualWrite,
        false,
        1 << 20,
        |_, _| {},
    )
    .await
    .unwrap();
    let news: Vec<usize> = report.structures.iter().map(|s| s.new).collect();
    assert_eq!(news, [1, 2, 1], "{report:?}");
    for id in scheduled {
        let (payload, later): (serde_json::Value, bool) = sqlx::query_as(
            "SELECT payload, run_at > now() + interval '59 minutes' FROM qbridge.jobs \
              WHERE queue = 'reports' AND key = $1 AND copy = 'mirror'",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(later, "enqueue_in(1h) is due in an hour");
        assert_eq!(payload["rq_job"]["status"], "scheduled", "{payload}");
    }

    qbridge::cutover::store::register(&pool, "reports", Phase::PostgresOnly, "test")
        .await
        .unwrap();
    let req = Request {
        by: "test@ops",
        reason: Some("carry RQ's registries"),
        force: true,
        percent: None,
    };
    operate::advance(&pool, Some(&mut conn), &route, &req, 1 << 20)
        .await
        .map_err(|_| "refused")
        .unwrap();
    let live: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT key FROM qbridge.jobs WHERE queue = 'reports' AND copy = 'live' ORDER BY key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut expected = vec![scheduled[0].clone(), scheduled[1].clone(), waiting.clone()];
    expected.sort();
    assert_eq!(live, expected);
    let dead: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.jobs_dead WHERE queue = 'reports' AND key = $1",
    )
    .bind(failed)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(dead, 1);
    for set in ["rq:scheduled:reports", "rq:failed:reports"] {
        let n: i64 = ::redis::cmd("ZCARD")
            .arg(set)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(n, 0, "{set}");
    }
}

/// A Sidekiq fleet with a reliable fetch (gitlab-sidekiq-fetcher, real)
/// moves the job a worker runs into the worker's private list: the job is
/// neither in the route's list nor finished. qbridge counts it there as
/// held by a worker, and the gate into `decommissioned` refuses while it is.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_job_in_a_reliable_fetchs_private_list_is_counted_and_holds_decommission(pool: PgPool) {
    let server = ThrowawayRedis::start();
    let app = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ruby");
    let produce = std::process::Command::new("ruby")
        .args(["sidekiq_reliable_fetch.rb", "produce", "2"])
        .current_dir(&app)
        .env("REDIS_URL", server.url())
        .output()
        .expect("ruby runs (./scripts/test-deps.sh installs ruby-gitlab-sidekiq-fetcher)");
    assert!(
        produce.status.success(),
        "{}",
        String::from_utf8_lossy(&produce.stderr)
    );
    let mut worker = tokio::process::Command::new("sidekiq")
        .args([
            "-r",
            "./sidekiq_reliable_fetch.rb",
            "-q",
            "default",
            "-c",
            "1",
        ])
        .current_dir(&app)
        .env("REDIS_URL", server.url())
        .env("QBT_SLEEP", "60")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("sidekiq starts");
    let toml = "[[routes]]\nname = \"mail\"\nredis_key = \"queue:default\"\nqueue = \"mail\"\n\
                format = \"sidekiq\"\nphase = \"postgres_only\"\n";
    let cfg = Config::from_toml(toml, &Overrides::default()).expect("route config");
    let routes = Routes::from_config(&cfg.routes);
    let route = Arc::clone(routes.by_name("mail").unwrap());
    let mut conn = connect_redis(&server.url()).await.unwrap();
    let started = std::time::Instant::now();
    let held = loop {
        let held = structures::read(&mut conn, &route).await.unwrap();
        let private: u64 = held
            .iter()
            .filter(|h| h.key == "working:queue:default:*")
            .map(|h| h.jobs)
            .sum();
        if private == 1 {
            break held;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the worker took a job into its private list: {held:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(
        structures::non_empty(&held),
        ["working:queue:default:*: 1 held by a worker"]
    );
    let state = RouteState {
        route: "mail".into(),
        phase: Phase::PostgresOnly,
        percent: 100,
        since: chrono::Utc::now() - chrono::Duration::hours(1),
        changed_by: "test".into(),
        reason: "test".into(),
    };
    let gate = gates::evaluate(&pool, Some(&mut conn), &route, &state)
        .await
        .unwrap()
        .expect("a gate into decommissioned");
    let check = gate
        .checks
        .iter()
        .find(|c| c.name == "jobs in the framework's other structures")
        .expect("the check is there");
    assert!(!check.passed, "{check:?}");
    assert!(
        check
            .value
            .contains("working:queue:default:*: 1 held by a worker"),
        "{check:?}"
    );
    // The importer copies the held job as a mirror copy (the worker runs
    // it; Postgres never does without evidence), once.
    for (run, new) in [(1, 1), (2, 0)] {
        let (line, report) = super::import_line(
            &pool,
            &mut conn,
            &route,
            Phase::PostgresOnly,
            "working:queue:default:*",
        )
        .await;
        assert_eq!((line.found, line.new), (1, new), "run {run}: {report}");
    }
    let copies: Vec<String> =
        sqlx::query_scalar("SELECT copy FROM qbridge.job_keys WHERE queue = 'mail'")
            .fetch_all(&pool)
            .await
            .unwrap();
    // The held job, and the other one still waiting in the list.
    assert_eq!(copies, ["mirror", "mirror"]);
    let _ = worker.kill().await;
}
