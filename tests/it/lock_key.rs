//! Lock keys: jobs sharing a key never run at the same time, even with a pool
//! whose concurrency would allow it; jobs with other keys still run in parallel.

use std::collections::HashMap;
use std::time::Duration;

use qbridge::queue::NewJob;
use serde_json::json;
use sqlx::PgPool;

use crate::support::{self, PoolBuilder, RunningPool};

/// Each handler run appends "<job id> start <ns> <attempt>" and "<job id> end <ns>".
const RECORD: &str = r#"echo "$QBRIDGE_JOB_ID start $(date +%s%N) $QBRIDGE_ATTEMPT" >> "$1"
sleep 0.1
echo "$QBRIDGE_JOB_ID end $(date +%s%N)" >> "$1""#;

/// Parses the record file into job id → (start, end) in nanoseconds.
fn intervals(text: &str) -> HashMap<i64, (u128, u128)> {
    let mut starts: HashMap<i64, Vec<u128>> = HashMap::new();
    let mut ends: HashMap<i64, Vec<u128>> = HashMap::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        assert!(parts.len() >= 3, "bad record line {line:?}");
        let id: i64 = parts[0].parse().unwrap();
        let at: u128 = parts[2].parse().unwrap();
        match parts[1] {
            "start" => {
                // A job put back because its key was busy gets its attempt refunded.
                assert_eq!(
                    parts.get(3),
                    Some(&"1"),
                    "job {id} started on a later attempt"
                );
                starts.entry(id).or_default().push(at)
            }
            "end" => ends.entry(id).or_default().push(at),
            other => panic!("bad record {other:?}"),
        }
    }
    starts
        .into_iter()
        .map(|(id, s)| {
            let e = ends.get(&id).cloned().unwrap_or_default();
            assert_eq!((s.len(), e.len()), (1, 1), "job {id} ran {} times", s.len());
            assert!(s[0] <= e[0]);
            (id, (s[0], e[0]))
        })
        .collect()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn same_lock_key_never_overlaps(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let log_s = log.to_str().unwrap();

    // Five jobs of account-1 in a row (so one claim batch holds several), three
    // of account-2, two without a key.
    let mut jobs = Vec::new();
    for i in 0..5 {
        jobs.push(NewJob::new("serial", json!({ "i": i })).with_lock_key("account-1"));
    }
    for i in 0..3 {
        jobs.push(NewJob::new("serial", json!({ "i": i })).with_lock_key("account-2"));
    }
    jobs.push(NewJob::new("serial", json!({})));
    jobs.push(NewJob::new("serial", json!({})));
    let ids = support::enqueue_ids(&pool, &jobs).await;
    let key_of: HashMap<i64, Option<String>> = ids
        .iter()
        .zip(&jobs)
        .map(|(id, j)| (*id, j.lock_key.clone()))
        .collect();

    // Two pools, as two processes would be, each allowed to run 4 at once.
    let make = || {
        PoolBuilder::new("serial")
            .concurrency(4)
            .poll(Duration::from_millis(50))
            .handler(support::sh(RECORD, &[log_s]))
            .build()
    };
    let a = RunningPool::start(&pool, make());
    let b = RunningPool::start(&pool, make());
    support::wait_for("every job to complete", Duration::from_secs(60), || async {
        support::jobs(&pool).await == 0
    })
    .await;
    a.stop().await;
    b.stop().await;

    let runs = intervals(&std::fs::read_to_string(&log).unwrap());
    assert_eq!(runs.len(), ids.len(), "not every job ran");
    let mut by_key: HashMap<&str, Vec<(u128, u128, i64)>> = HashMap::new();
    for (id, (s, e)) in &runs {
        if let Some(k) = key_of[id].as_deref() {
            by_key.entry(k).or_default().push((*s, *e, *id));
        }
    }
    for (key, mut spans) in by_key {
        spans.sort();
        for w in spans.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "jobs {} and {} with lock key {key} overlapped: {:?} and {:?}",
                w[0].2,
                w[1].2,
                (w[0].0, w[0].1),
                (w[1].0, w[1].1)
            );
        }
    }
    // Different keys did run side by side (the lock is per key, not global).
    let all: Vec<(u128, u128)> = runs.values().copied().collect();
    let overlapping = all
        .iter()
        .enumerate()
        .any(|(i, a)| all[i + 1..].iter().any(|b| a.0 < b.1 && b.0 < a.1));
    assert!(
        overlapping,
        "no two jobs ever ran at once: lock keys serialized everything"
    );
    assert_eq!(support::dead(&pool).await, 0);
}
