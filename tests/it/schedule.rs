//! Recurring schedules: two processes running the scheduler fire each period
//! once; instance keys are unique.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use qbridge::queue::schedule::{self, Cadence, Schedule};
use qbridge::queue::NewJob;
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::support::{self, LIMIT};

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn schedule_fires_once_per_period_with_two_processes(pool: PgPool) {
    let schedules = vec![Schedule {
        name: "tick".into(),
        cadence: Cadence::Every(Duration::from_secs(1)),
        job: NewJob::new("sched", json!({ "task": "tick" })),
    }];
    // Each "process" has its own connections.
    let dbs = [
        support::extra_pool(&pool, 2).await,
        support::extra_pool(&pool, 2).await,
    ];
    let stop = CancellationToken::new();
    let started = Instant::now();
    let tasks: Vec<_> = dbs
        .iter()
        .map(|db| {
            let (db, schedules, stop) = (db.clone(), schedules.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut fired, mut led) = (Vec::new(), 0);
                while !stop.is_cancelled() {
                    let r = schedule::run_once(&db, &schedules, LIMIT)
                        .await
                        .expect("schedule pass");
                    led += usize::from(r.led);
                    fired.extend(r.fired.into_iter().map(|(_, id)| id));
                    // Pace of the scheduler loop (the runtime ticks every second).
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                (fired, led)
            })
        })
        .collect();
    // Let 3 periods pass (by the count of instances, not by sleeping).
    support::wait_for(
        "three schedule instances",
        Duration::from_secs(10),
        || async { support::jobs(&pool).await >= 4 },
    )
    .await;
    stop.cancel();
    let elapsed = started.elapsed().as_secs_f64();
    let mut fired = Vec::new();
    let mut leaders = 0;
    for t in tasks {
        let (f, led) = t.await.unwrap();
        leaders += usize::from(led > 0);
        fired.extend(f);
    }
    for db in dbs {
        db.close().await;
    }

    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT id, key FROM qbridge.jobs ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    let keys: HashSet<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(keys.len(), rows.len(), "duplicate instance keys: {rows:?}");
    let mut fired_sorted = fired.clone();
    fired_sorted.sort_unstable();
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(fired_sorted, ids, "pass reports disagree with the table");
    assert!(leaders >= 1);

    // One instance per period: instance times are a period apart.
    let mut times: Vec<i64> = rows
        .iter()
        .map(|r| r.1.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    times.sort_unstable();
    for w in times.windows(2) {
        assert!(w[1] - w[0] >= 1, "two instances in one period: {times:?}");
    }
    // The first fires at once, then one per elapsed second.
    let expected = elapsed.floor() as i64 + 1;
    assert!(
        (rows.len() as i64 - expected).abs() <= 1,
        "{} instances in {elapsed:.2}s, expected about {expected}",
        rows.len()
    );
}

/// A cron schedule waits for its slot; the schedule row tracks the next run.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn cron_schedule_waits_for_its_slot(pool: PgPool) {
    let schedules = vec![Schedule {
        name: "yearly".into(),
        cadence: Cadence::cron("0 0 0 1 1 *").unwrap(),
        job: NewJob::new("sched", json!({})),
    }];
    let r = schedule::run_once(&pool, &schedules, LIMIT).await.unwrap();
    assert!(r.led);
    assert!(r.fired.is_empty());
    assert_eq!(support::jobs(&pool).await, 0);
    let next: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT next_run_at FROM qbridge.schedules WHERE name = 'yearly'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(next > chrono::Utc::now());
    assert_eq!(next.format("%m-%d %H:%M:%S").to_string(), "01-01 00:00:00");
}

/// A config with schedules and no pools keeps running (and firing) until it
/// is stopped, instead of returning at once.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_schedules_only_runtime_runs_until_stopped(pool: PgPool) {
    let toml = format!(
        "database_url = \"{}\"\n[[schedules]]\nname = \"tick\"\nqueue = \"ticks\"\nevery = \"1s\"\n",
        support::db_url(&pool)
    );
    let config =
        qbridge::config::Config::from_toml(&toml, &qbridge::config::Overrides::default()).unwrap();
    let mut runtime = qbridge::app::Runtime::build(config).await.unwrap();
    runtime.serve_http = false;
    let stop = tokio_util::sync::CancellationToken::new();
    let handle = tokio::spawn(runtime.run_until_stopped(stop.clone()));
    support::wait_for("two periods fired", Duration::from_secs(10), || async {
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs WHERE queue = 'ticks'",
        )
        .await
            >= 2
    })
    .await;
    assert!(
        !handle.is_finished(),
        "runtime returned before it was stopped"
    );
    stop.cancel();
    handle.await.unwrap().unwrap();
}
