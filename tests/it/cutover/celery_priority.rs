//! Kombu's Redis transport puts a task sent with a priority into a
//! list of its own, `<queue>\x06\x16<step>`. Real Celery sends through the
//! proxy in `dual_write`: the tasks in those lists are the route's — mirrored
//! with their priority (a lower Celery priority runs first, so the job's is
//! the negated one), seen by the diff as waiting in Redis, found known by the
//! importer, and archived by decommission.

use sqlx::PgPool;

use qbridge::model::Phase;
use qbridge::ops::{gates, import};
use qbridge::redis::connect::connect_redis;

use crate::exactly_once::fleet::produce;
use crate::exactly_once::{ProxySide, REDIS};
use crate::support;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn tasks_in_celerys_priority_lists_are_the_routes(pool: PgPool) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route_name, queue) = (format!("cp{}", &id[..12]), format!("qbt_celery_{id}"));
    let ledger = format!("qbt:{id}:ledger");
    let toml = format!(
        "[[routes]]\nname = \"{route_name}\"\nredis_key = \"{queue}\"\nqueue = \"{route_name}\"\n\
         format = \"celery\"\nphase = \"dual_write\"\ndiff = {{ settle = \"0s\" }}\n\
         shadow = {{ dual_write = \"shadow\" }}\n"
    );
    // Shadow calls in dual_write: the mirror copies get jobs rows (where a
    // job's priority is), not the ledger-only record of the default.
    let side = ProxySide::start(&pool, &toml).await;
    let urgent = produce(&side.url(), &queue, &ledger, 2, None).await;
    let later = produce(&side.url(), &queue, &ledger, 3, Some(7)).await;
    support::wait_for_count(
        &pool,
        "every task mirrored",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{route_name}'"),
        5,
    )
    .await;

    let mut redis = connect_redis(REDIS).await.unwrap();
    let sub_list = format!("{queue}\x06\x166");
    let waiting: i64 = ::redis::cmd("LLEN")
        .arg(&sub_list)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(waiting, 3, "kombu put priority 7 in the list of step 6");
    for (ids, priority) in [(&urgent, 0), (&later, -7)] {
        for task in ids {
            let got: i32 = sqlx::query_scalar(
                "SELECT priority FROM qbridge.jobs WHERE queue = $1 AND key = $2",
            )
            .bind(&route_name)
            .bind(task)
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(got, priority, "task {task}");
        }
    }

    let routes = side.side_routes();
    let route = routes.by_name(&route_name).unwrap().clone();
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let (diff, held) = gates::diff_since(&pool, &mut redis, &route, Phase::DualWrite, since)
        .await
        .unwrap();
    assert_eq!(held.waiting.len(), 5, "{}", diff.verdict);
    assert_eq!(diff.only_postgres, 0, "{}", diff.verdict);

    let imported = import::import(
        &pool,
        &mut redis,
        &route,
        Phase::DualWrite,
        true,
        1 << 20,
        |_, _| {},
    )
    .await
    .unwrap();
    let found: Vec<(usize, usize)> = imported
        .structures
        .iter()
        .map(|s| (s.found, s.known))
        .collect();
    assert_eq!(
        found,
        [(2, 2), (0, 0), (3, 3), (0, 0), (0, 0)],
        "{imported:?}"
    );

    // Decommission archives the priority list with the rest: every task
    // runs in Postgres, none is stranded in Redis.
    let req = qbridge::ops::operate::Request {
        by: "test@ops",
        reason: Some("archive the priority lists"),
        force: true,
        percent: None,
    };
    for to in [Phase::Shadow, Phase::PostgresOnly, Phase::Decommissioned] {
        let done = qbridge::ops::operate::advance(&pool, Some(&mut redis), &route, &req, 1 << 20)
            .await
            .map_err(|_| "refused")
            .unwrap();
        assert_eq!(done.gate.to, to);
    }
    let left: i64 = ::redis::cmd("EXISTS")
        .arg(&queue)
        .arg(&sub_list)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(left, 0, "decommission left a list behind");
    let live: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT key) FROM qbridge.jobs WHERE queue = $1 AND copy = 'live'",
    )
    .bind(&route_name)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(live, 5);

    let _: i64 = ::redis::cmd("DEL")
        .arg(&queue)
        .arg(&sub_list)
        .arg(&ledger)
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// A countdown task (`apply_async(countdown=…)`: kombu pushes it at once,
/// with its `eta` header) is due in Postgres when Celery would run it, as a
/// mirror copy in `dual_write` and as the live job in `postgres_only`.
/// Before the fix both were due at once: after the flip the task ran early.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_countdown_task_is_due_at_its_eta(pool: PgPool) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route_name, queue) = (format!("ce{}", &id[..12]), format!("qbt_celery_{id}"));
    let ledger = format!("qbt:{id}:ledger");
    let toml = format!(
        "[[routes]]\nname = \"{route_name}\"\nredis_key = \"{queue}\"\nqueue = \"{route_name}\"\n\
         format = \"celery\"\nphase = \"dual_write\"\n"
    );
    let side = ProxySide::start(&pool, &toml).await;
    let args = ["produce_in".to_string(), "1".into(), "600".into()];
    let mirrored = crate::exactly_once::fleet::producer(&side.url(), &queue, &ledger, &args).await;
    support::wait_for_count(
        &pool,
        "the task mirrored",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{route_name}'"),
        1,
    )
    .await;
    side.force_to(&route_name, REDIS, Phase::PostgresOnly).await;
    let mut redis = connect_redis(REDIS).await.unwrap();
    let live = crate::exactly_once::fleet::producer(&side.url(), &queue, &ledger, &args).await;
    for (task, copy) in [(&mirrored[0], "mirror"), (&live[0], "live")] {
        let ahead: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM run_at - now())::float8 FROM qbridge.jobs \
              WHERE queue = $1 AND key = $2 AND copy = $3",
        )
        .bind(&route_name)
        .bind(task)
        .bind(copy)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(
            (500.0..=600.0).contains(&ahead),
            "the {copy} copy of {task} is due in {ahead} s, not at its eta (600 s)"
        );
    }
    let _: () = ::redis::cmd("DEL")
        .arg(&queue)
        .query_async(&mut redis)
        .await
        .unwrap();
    side.stop().await;
}

/// A Celery retry after the flip (`Task.retry` pushes the same task id
/// again with its `retries` header and an eta): the fleet reported the
/// failed attempt, so the push runs live in Postgres — due at its eta and
/// starting from the attempts Celery already used, so the route's
/// `max_attempts` bounds the whole task. Before the fix it started from 0.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_celery_retry_after_the_flip_keeps_its_attempts_and_eta(pool: PgPool) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route_name, queue) = (format!("cr{}", &id[..12]), format!("qbt_celery_{id}"));
    let ledger = format!("qbt:{id}:ledger");
    let toml = format!(
        "[[routes]]\nname = \"{route_name}\"\nredis_key = \"{queue}\"\nqueue = \"{route_name}\"\n\
         format = \"celery\"\nphase = \"dual_write\"\nredis_side = \"fleet\"\n"
    );
    let side = ProxySide::start(&pool, &toml).await;
    let task = produce(&side.url(), &queue, &ledger, 1, None)
        .await
        .remove(0);
    support::wait_for_count(
        &pool,
        "the task mirrored",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{route_name}'"),
        1,
    )
    .await;
    // The fleet ran it and reported the failure (Celery then retries).
    sqlx::query("SELECT qbridge.report_outcome($1, $2, 'failed', 'ConnectionError')")
        .bind(&route_name)
        .bind(&task)
        .execute(&pool)
        .await
        .unwrap();
    side.force_to(&route_name, REDIS, Phase::PostgresOnly).await;
    let mut redis = connect_redis(REDIS).await.unwrap();
    let args = [
        "produce_retry".to_string(),
        task.clone(),
        "2".into(),
        "600".into(),
    ];
    crate::exactly_once::fleet::producer(&side.url(), &queue, &ledger, &args).await;
    let (attempts, ahead): (i32, f64) = sqlx::query_as(
        "SELECT attempts, extract(epoch FROM run_at - now())::float8 FROM qbridge.jobs \
          WHERE queue = $1 AND key = $2 AND copy = 'live'",
    )
    .bind(&route_name)
    .bind(&task)
    .fetch_one(&pool)
    .await
    .expect("the retry runs live in Postgres");
    assert_eq!(attempts, 2, "the attempts Celery used (its retries header)");
    assert!(
        (500.0..=600.0).contains(&ahead),
        "due at its eta, not in {ahead} s"
    );
    let _: () = ::redis::cmd("DEL")
        .arg(&queue)
        .query_async(&mut redis)
        .await
        .unwrap();
    side.stop().await;
}

/// The same retry pushed before the fleet's failure report arrives: held
/// (no evidence yet), then released by the settle pass once the report is
/// there — still due at its eta and from the attempts Celery used. Before
/// the fix a released re-push ran at once, from attempt 0.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_held_celery_retry_keeps_its_attempts_and_eta_when_released(pool: PgPool) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (route_name, queue) = (format!("ch{}", &id[..12]), format!("qbt_celery_{id}"));
    let ledger = format!("qbt:{id}:ledger");
    let toml = format!(
        "[[routes]]\nname = \"{route_name}\"\nredis_key = \"{queue}\"\nqueue = \"{route_name}\"\n\
         format = \"celery\"\nphase = \"postgres_only\"\nredis_side = \"fleet\"\n"
    );
    // The task's mirror copy, from before the flip.
    let side = ProxySide::start(&pool, &toml).await;
    let task = uuid::Uuid::new_v4().to_string();
    sqlx::query(
        "INSERT INTO qbridge.job_keys (queue, key, copy, via) VALUES ($1, $2, 'mirror', 'proxy')",
    )
    .bind(&route_name)
    .bind(&task)
    .execute(&pool)
    .await
    .unwrap();
    let args = [
        "produce_retry".to_string(),
        task.clone(),
        "2".into(),
        "600".into(),
    ];
    crate::exactly_once::fleet::producer(&side.url(), &queue, &ledger, &args).await;
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.held_repushes WHERE key = $1")
        .bind(&task)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(held, 1, "held: no evidence yet");
    sqlx::query("SELECT qbridge.report_outcome($1, $2, 'failed', 'ConnectionError')")
        .bind(&route_name)
        .bind(&task)
        .execute(&pool)
        .await
        .unwrap();
    let settled = qbridge::ingest::settle_held_once(&pool, 1 << 20)
        .await
        .unwrap();
    assert_eq!(settled.released, 1);
    let (attempts, ahead): (i32, f64) = sqlx::query_as(
        "SELECT attempts, extract(epoch FROM run_at - now())::float8 FROM qbridge.jobs \
          WHERE queue = $1 AND key = $2 AND copy = 'live'",
    )
    .bind(&route_name)
    .bind(&task)
    .fetch_one(&pool)
    .await
    .expect("released live");
    assert_eq!(attempts, 2, "the attempts Celery used");
    assert!(
        (500.0..=600.0).contains(&ahead),
        "due at its eta, not in {ahead} s"
    );
    side.stop().await;
}
