//! Idle pickup latency: one idle worker, jobs enqueued one at a time on a fixed
//! schedule; enqueue-to-handler-start per job. Measured twice: with the LISTEN
//! connection (NOTIFY wake-up), and without it (the poll backstop alone, i.e. a
//! lost NOTIFY), which must stay within the poll interval.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bench::harness::{self, Workers};
use crate::bench::{BenchReport, WorkerArgs, BENCH_QUEUE};
use crate::config::Config;
use crate::error::Result;
use crate::handler::Probe;
use crate::queue::{enqueue, NewJob};

async fn measure(
    config: &Config,
    samples: usize,
    interval: Duration,
    poll: Duration,
    listen: bool,
) -> Result<Vec<f64>> {
    let db = harness::prepare(config).await?;
    let w = WorkerArgs {
        jobs: samples,
        workers: 1,
        batch: 10,
        concurrency: 10,
        completer_batch: 100,
        enqueue_batch: 1,
        prefetch_window: crate::config::DEFAULT_PREFETCH_WINDOW,
        idle_first: Duration::ZERO,
    };
    let cfg = harness::worker_config(config, &w, poll);
    let probe = Arc::new(Probe::default());
    let workers = Workers::start(&cfg, 1, probe.clone(), listen).await?;
    // Let the worker settle into its idle wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut conn = db.acquire().await?;
    for i in 0..samples {
        let job = NewJob::new(BENCH_QUEUE, serde_json::json!({ "i": i }));
        enqueue::enqueue(&mut conn, &[job], usize::MAX).await?;
        tokio::time::sleep(interval).await;
    }
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(30);
    while probe.runs() < samples as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    workers.stop().await?;
    Ok(probe.latencies())
}

pub async fn run(
    config: &Config,
    samples: usize,
    interval: Duration,
    poll: Duration,
) -> Result<BenchReport> {
    let notify = measure(config, samples, interval, poll, true).await?;
    let polled = measure(config, samples.min(100), interval, poll, false).await?;
    let ms = |v: &[f64], p: f64| harness::percentile(v, p) * 1000.0;
    // A lost NOTIFY may cost one poll interval plus the claim that follows it.
    let poll_bound_ms = poll.as_secs_f64() * 1000.0 + 25.0;
    let ok = notify.len() == samples
        && polled.len() == samples.min(100)
        && ms(&polled, 100.0) <= poll_bound_ms;
    Ok(BenchReport {
        system: "qbridge".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        mode: "latency".into(),
        n: samples as u64,
        settings: serde_json::json!({
            "interval_ms": interval.as_millis() as u64, "poll_interval_ms": poll.as_millis() as u64,
        }),
        numbers: vec![
            ("notify_p50_ms".into(), ms(&notify, 50.0)),
            ("notify_p99_ms".into(), ms(&notify, 99.0)),
            ("notify_max_ms".into(), ms(&notify, 100.0)),
            ("poll_only_p50_ms".into(), ms(&polled, 50.0)),
            ("poll_only_p99_ms".into(), ms(&polled, 99.0)),
            ("poll_only_max_ms".into(), ms(&polled, 100.0)),
        ],
        ok,
        notes: vec![
            "poll_only = no LISTEN connection: what a lost NOTIFY costs".into(),
            format!("ok requires poll_only_max <= poll interval + 25 ms = {poll_bound_ms:.0} ms"),
        ],
    })
}
