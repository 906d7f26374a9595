//! Advances and rollbacks under load: producers keep enqueueing while the
//! route goes dual_write → shadow → postgres_only, back to shadow with jobs
//! in flight, and forward again. Every job ran live exactly once, counted by
//! the test handler; shadow calls never count as live.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use qbridge::model::Phase;

use super::rig::{Options, Rig};
use crate::support;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn every_job_runs_live_once_across_advances_and_a_rollback(pool: PgPool) {
    let mut rig = Rig::new(
        &pool,
        Options {
            handler_delay: Duration::from_millis(15),
            ..Options::default()
        },
    )
    .await;
    rig.start().await;
    let rig = Arc::new(rig);
    let produced = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (rig, produced, stop) = (rig.clone(), produced.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let n = produced.load(Ordering::SeqCst);
                let batch: Vec<String> = (n..n + 5).map(|i| format!("k{i}")).collect();
                rig.produce(&batch).await;
                produced.fetch_add(5, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let step = |want: Phase| {
        let rig = rig.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let done = rig.advance(true).await.map_err(|_| "advance").unwrap();
            assert_eq!(done.state.phase, want);
            rig.until_phase(want).await;
        }
    };
    step(Phase::Shadow).await;
    step(Phase::PostgresOnly).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Jobs are in flight on both sides (the handler takes 15 ms each).
    assert_eq!(rig.rollback().await, Phase::Shadow);
    rig.until_phase(Phase::Shadow).await;
    step(Phase::PostgresOnly).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    producer.await.unwrap();
    let total = produced.load(Ordering::SeqCst);
    assert!(total >= 100, "only {total} jobs produced");

    let calls = rig.calls.clone();
    support::wait_for("every job ran live", Duration::from_secs(60), || {
        let n = calls.live_counts().len();
        async move { n == total }
    })
    .await;
    // Settle: nothing may run a second time afterwards either.
    support::wait_for_count(
        &pool,
        "Postgres queue empty",
        "SELECT count(*) FROM qbridge.jobs",
        0,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let live = rig.calls.live_counts();
    let twice: Vec<_> = live.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "jobs run live more than once: {twice:?}");
    assert_eq!(live.len(), total);
    let shadowed = (0..total)
        .filter(|i| rig.calls.shadow(&format!("k{i}")) > 0)
        .count();
    assert!(shadowed > 0, "the shadow phase made shadow calls");
    // Every step is in the audit log, the forced ones marked.
    let audit: Vec<(Option<String>, String, bool)> = sqlx::query_as(
        "SELECT from_phase, to_phase, forced FROM qbridge.phase_audit WHERE route = $1 ORDER BY id",
    )
    .bind(&rig.name)
    .fetch_all(&pool)
    .await
    .unwrap();
    let steps: Vec<(Option<&str>, &str)> = audit
        .iter()
        .map(|(f, t, _)| (f.as_deref(), t.as_str()))
        .collect();
    assert_eq!(
        steps,
        vec![
            (None, "dual_write"),
            (Some("dual_write"), "shadow"),
            (Some("shadow"), "postgres_only"),
            (Some("postgres_only"), "shadow"),
            (Some("shadow"), "postgres_only"),
        ]
    );
    let rig = Arc::try_unwrap(rig).ok().expect("no other handle");
    rig.finish().await;
}
