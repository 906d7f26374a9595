//! A job due later (a countdown, `perform_in`) gets its settle time from
//! when it came due, not from its push: a countdown task pushed minutes ago
//! that came due a moment ago may be running on the Redis side right now,
//! and calling it "unaccounted" invited an `--assume-lost` that would run
//! it twice. Once settled, the diff says when it came due.

use std::time::Duration;

use sqlx::PgPool;

use qbridge::ops::gates::diff_since;

use super::rig::{Options, Rig};

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_job_due_a_moment_ago_settles_from_its_due_time(pool: PgPool) {
    let rig = Rig::new(
        &pool,
        Options {
            settle: "3s",
            ..Options::default()
        },
    )
    .await;
    let route = rig.route();
    // Mirrored two minutes ago with a countdown that ran out just now; no
    // outcome yet and not in a list qbridge reads (the fleet's worker
    // holds it until it is due).
    sqlx::query(
        "INSERT INTO qbridge.job_keys (queue, key, copy, via, seen_at, pushed_at, due_at, original) \
         VALUES ($1, 'countdown-1', 'mirror', 'proxy', now() - interval '2 minutes', \
                 now() - interval '2 minutes', now(), '{\"id\":\"countdown-1\"}')",
    )
    .bind(&route.queue)
    .execute(&pool)
    .await
    .unwrap();
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let phase = rig.routes.phase(&route);
    let mut conn = rig.redis().await;
    let (d, _) = diff_since(&pool, &mut conn, &route, phase, since)
        .await
        .unwrap();
    assert_eq!(d.only_postgres, 0, "still settling: {}", d.verdict);
    assert_eq!(d.unaccounted, 0, "{}", d.verdict);

    tokio::time::sleep(Duration::from_millis(3500)).await;
    let (d, _) = diff_since(&pool, &mut conn, &route, phase, since)
        .await
        .unwrap();
    assert_eq!(d.unaccounted, 1, "settled now: {}", d.verdict);
    let table = qbridge::ops::diff::table(&d);
    assert!(
        table.contains("countdown-1 (due ") && table.contains(" ago)"),
        "the diff says when it came due: {table}"
    );
}
