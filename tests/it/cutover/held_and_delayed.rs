//! Jobs a framework keeps where qbridge does not carry them at decommission
//! — tasks a real Celery worker took and holds until their ETA (kombu's
//! `unacked` hash: imported as mirror copies that never run here), and
//! resque-scheduler's delayed jobs (counted only) — and Resque's `failed`
//! list, which it carries into `qbridge.jobs_dead`.
//!
//! Celery is real (5.7 with kombu's Redis transport, a worker holding
//! countdown tasks). Resque has no client here: its structures are written
//! as Resque's `lib/resque/failure/redis.rb` (`rpush :failed` of
//! `{failed_at, payload, exception, error, backtrace, worker, queue}`;
//! `requeue` sets `retried_at` and leaves the entry) and resque-scheduler's
//! `lib/resque/scheduler/delaying_extensions.rb` (`delayed_push`: `rpush
//! delayed:<ts>` of `{class, args, queue}`, `sadd timestamps:<item>`, `zadd
//! delayed_queue_schedule <ts> <ts>`) write them, under Resque's default
//! namespace `resque:`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use qbridge::config::{Config, Overrides};
use qbridge::cutover::store::RouteState;
use qbridge::model::structures::Holding;
use qbridge::model::Phase;
use qbridge::ops::operate::{self, Request};
use qbridge::ops::{gates, structures};
use qbridge::redis::connect::connect_redis;
use qbridge::routes::{Route, Routes};

use crate::exactly_once::fleet::{producer, worker_on};
use crate::servers::ThrowawayRedis;

fn route_of(toml: &str, name: &str) -> Arc<Route> {
    let cfg = Config::from_toml(toml, &Overrides::default()).expect("route config");
    Arc::clone(Routes::from_config(&cfg.routes).by_name(name).unwrap())
}

/// The gate into `decommissioned` for `route` in `postgres_only`: whether
/// its check of the other structures passed, and what it measured.
async fn structures_check(
    pool: &PgPool,
    conn: &mut ::redis::aio::ConnectionManager,
    route: &Route,
) -> (bool, String) {
    let state = RouteState {
        route: route.name.clone(),
        phase: Phase::PostgresOnly,
        percent: 100,
        since: chrono::Utc::now() - chrono::Duration::hours(1),
        changed_by: "test".into(),
        reason: "test".into(),
    };
    let gate = gates::evaluate(pool, Some(conn), route, &state)
        .await
        .unwrap()
        .expect("a gate into decommissioned");
    let check = gate
        .checks
        .iter()
        .find(|c| c.name == "jobs in the framework's other structures")
        .expect("the check is there");
    (check.passed, check.value.clone())
}

/// Advances `route` (registered in `postgres_only`) into `decommissioned`
/// by force; the archive's report of the framework's structures.
async fn force_decommission(
    pool: &PgPool,
    conn: &mut ::redis::aio::ConnectionManager,
    route: &Route,
) -> qbridge::ops::decommission::Carried {
    qbridge::cutover::store::register(pool, &route.name, Phase::PostgresOnly, "test")
        .await
        .unwrap();
    let req = Request {
        by: "test@ops",
        reason: Some("decommission with jobs left in the framework's structures"),
        force: true,
        percent: None,
    };
    let done = operate::advance(pool, Some(conn), route, &req, 1 << 20)
        .await
        .map_err(|_| "refused")
        .unwrap();
    done.archived.expect("archived").carried
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn countdown_tasks_a_celery_worker_holds_are_counted_gated_imported_as_mirror_copies_and_left_to_it(
    pool: PgPool,
) {
    let server = ThrowawayRedis::start();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let queue = format!("qbt_eta_{}", &id[..12]);
    let toml = format!(
        "[[routes]]\nname = \"eta\"\nredis_key = \"{queue}\"\nqueue = \"eta\"\n\
         format = \"celery\"\nphase = \"postgres_only\"\n"
    );
    let route = route_of(&toml, "eta");
    let ledger = format!("qbt:{id}:ledger");
    let args = ["produce_in", "3", "3600"].map(String::from);
    let ids = producer(&server.url(), &queue, &ledger, &args).await;
    assert_eq!(ids.len(), 3);
    let mut worker = worker_on(&server.url(), &queue, &ledger);
    let mut conn = connect_redis(&server.url()).await.unwrap();
    // The worker takes each task at once and holds it until its ETA.
    let started = std::time::Instant::now();
    let held = loop {
        let held = structures::read(&mut conn, &route).await.unwrap();
        if held.iter().any(|h| h.jobs == 3) {
            break held;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the Celery worker did not take the 3 tasks: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let unacked = &held[0];
    assert_eq!(
        (unacked.holding, unacked.key.as_str(), unacked.jobs),
        (Holding::Held, "unacked", 3)
    );
    let ahead = unacked.next_at.expect("due at the ETA") - chrono::Utc::now();
    assert!(
        ahead > chrono::Duration::minutes(59) && ahead < chrono::Duration::minutes(61),
        "countdown=3600 is due in an hour: {unacked:?}"
    );

    let (passed, value) = structures_check(&pool, &mut conn, &route).await;
    assert!(
        !passed && value.contains("unacked: 3 held by a worker"),
        "{value}"
    );
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let (diff, _) = gates::diff_since(&pool, &mut conn, &route, Phase::PostgresOnly, since)
        .await
        .unwrap();
    assert!(
        diff.verdict.contains("unacked: 3 held by a worker"),
        "{}",
        diff.verdict
    );
    let (line, report) =
        super::import_line(&pool, &mut conn, &route, Phase::PostgresOnly, "unacked").await;
    assert_eq!(
        (line.found, line.new, line.not_copied),
        (3, 3, 0),
        "{report}"
    );
    // Mirror copies, due at the ETA, as if the push had come through the
    // proxy: the diff can match the worker's run when it comes.
    let due: Vec<(String, String, Option<chrono::DateTime<chrono::Utc>>)> = sqlx::query_as(
        "SELECT key, copy::text, due_at FROM qbridge.job_keys WHERE queue = 'eta' ORDER BY key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut keys: Vec<String> = due.iter().map(|(k, _, _)| k.clone()).collect();
    let mut sent = ids.clone();
    keys.sort();
    sent.sort();
    assert_eq!(keys, sent, "the held tasks' ids");
    for (key, copy, due_at) in &due {
        assert_eq!(copy, "mirror", "{key}");
        let ahead = due_at.expect("due at the ETA") - chrono::Utc::now();
        assert!(ahead > chrono::Duration::minutes(59), "{key}: {due_at:?}");
    }
    let (line, again) =
        super::import_line(&pool, &mut conn, &route, Phase::PostgresOnly, "unacked").await;
    assert_eq!((line.new, line.known), (0, 3), "{again}");

    // A forced decommission leaves them to the worker that holds them.
    let carried = force_decommission(&pool, &mut conn, &route).await;
    assert_eq!(carried.left.len(), 1, "{carried:?}");
    assert!(
        carried.left[0].contains("3 held by a worker"),
        "{carried:?}"
    );
    let still: i64 = ::redis::cmd("HLEN")
        .arg("unacked")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(still, 3, "the worker's tasks were taken from it");
    let live: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM qbridge.job_keys WHERE queue = 'eta' AND copy <> 'mirror') \
              + (SELECT count(*) FROM qbridge.jobs WHERE queue = 'eta' AND copy = 'live')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(live, 0, "a held task run by Postgres too would run twice");
    let _ = worker.kill().await;
}

/// A Resque job as `Resque::Job.create` pushes it.
fn resque_job(class: &str, n: u32) -> String {
    format!(r#"{{"class":"{class}","args":[{n}]}}"#)
}

/// A failed entry as `Resque::Failure::Redis#save` writes it.
fn failed_entry(queue: &str, class: &str, n: u32, retried: bool) -> String {
    let retried_at = match retried {
        true => r#","retried_at":"2026/11/26 01:00:00""#,
        false => "",
    };
    format!(
        r#"{{"failed_at":"2026/11/26 00:59:00 UTC","payload":{{"class":"{class}","args":[{n}]}},"exception":"RuntimeError","error":"boom","backtrace":["app/jobs/mail.rb:3"],"worker":"host:42:mail","queue":"{queue}"{retried_at}}}"#
    )
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn resques_failed_list_is_carried_and_its_delayed_jobs_are_counted(pool: PgPool) {
    let server = ThrowawayRedis::start();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    let route = route_of(
        "[[routes]]\nname = \"mail\"\nredis_key = \"resque:queue:mail\"\nqueue = \"mail\"\n\
         format = \"resque\"\nphase = \"postgres_only\"\n",
        "mail",
    );
    let failed = [
        failed_entry("mail", "Mailer", 1, false),
        failed_entry("mail", "Mailer", 2, true),
        failed_entry("reports", "Report", 3, false),
    ];
    for entry in &failed {
        let _: i64 = ::redis::cmd("RPUSH")
            .arg("resque:failed")
            .arg(entry)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let in_an_hour = chrono::Utc::now().timestamp() + 3600;
    for (ts, queue, n) in [
        (in_an_hour, "mail", 4),
        (in_an_hour + 60, "mail", 5),
        (in_an_hour, "reports", 6),
    ] {
        let item = format!(r#"{{"class":"Mailer","args":[{n}],"queue":"{queue}"}}"#);
        let list = format!("resque:delayed:{ts}");
        let _: () = ::redis::pipe()
            .cmd("RPUSH")
            .arg(&list)
            .arg(&item)
            .ignore()
            .cmd("SADD")
            .arg(format!("resque:timestamps:{item}"))
            .arg(&list)
            .ignore()
            .cmd("ZADD")
            .arg("resque:delayed_queue_schedule")
            .arg(ts)
            .arg(ts)
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let _: i64 = ::redis::cmd("RPUSH")
        .arg("resque:queue:mail")
        .arg(resque_job("Mailer", 7))
        .query_async(&mut conn)
        .await
        .unwrap();

    let held = structures::read(&mut conn, &route).await.unwrap();
    let counts: Vec<(Holding, &str, u64)> = held
        .iter()
        .map(|h| (h.holding, h.key.as_str(), h.jobs))
        .collect();
    assert_eq!(
        counts,
        [
            (Holding::Scheduled, "resque:delayed_queue_schedule", 2),
            (Holding::Dead, "resque:failed", 1)
        ],
        "another queue's entries and a requeued failure are not the route's"
    );
    let (next, last) = (held[0].next_at.unwrap(), held[0].last_at.unwrap());
    assert_eq!(
        (next.timestamp(), last.timestamp()),
        (in_an_hour, in_an_hour + 60)
    );
    let (passed, value) = structures_check(&pool, &mut conn, &route).await;
    assert!(!passed, "{value}");
    assert!(
        value.contains("resque:delayed_queue_schedule: 2 scheduled")
            && value.contains("resque:failed: 1 dead"),
        "{value}"
    );

    let carried = force_decommission(&pool, &mut conn, &route).await;
    assert_eq!(carried.dead, 1, "{carried:?}");
    assert_eq!(carried.left.len(), 1, "{carried:?}");
    assert!(
        carried.left[0].starts_with("resque:delayed_queue_schedule: 2 scheduled"),
        "{carried:?}"
    );
    let original: Vec<u8> = sqlx::query_scalar(
        "SELECT original FROM qbridge.jobs_dead WHERE queue = 'mail' AND copy = 'live'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        original,
        failed[0].as_bytes(),
        "the entry is kept byte for byte"
    );
    let (kind, args): (Option<String>, serde_json::Value) = sqlx::query_as(
        "SELECT kind, payload->'args' FROM qbridge.jobs_dead WHERE queue = 'mail' AND copy = 'live'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        kind.as_deref(),
        Some("Mailer"),
        "the dead job is the failed job"
    );
    assert_eq!(args, serde_json::json!([1]));
    let left: Vec<String> = ::redis::cmd("LRANGE")
        .arg("resque:failed")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        left,
        failed[1..],
        "only the route's unrequeued entry left the list"
    );
    let delayed: i64 = ::redis::cmd("ZCARD")
        .arg("resque:delayed_queue_schedule")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(delayed, 2, "the delayed jobs stay for resque-scheduler");
}
