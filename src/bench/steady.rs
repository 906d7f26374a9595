//! Steady state: producers enqueue at a target rate while W workers drain, for
//! a fixed duration. Reports achieved enqueue and completion rates and the
//! enqueue-to-start latency of every job. Its producers also drive the soak.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::bench::activity;
use crate::bench::harness::{self, Workers};
use crate::bench::{BenchReport, WorkerArgs, BENCH_QUEUE};
use crate::config::Config;
use crate::error::Result;
use crate::handler::Probe;
use crate::queue::{enqueue, NewJob};

/// The producers' side of a steady-state run.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub duration: Duration,
    /// Jobs a second over all producers; 0: as fast as they can.
    pub rate: u64,
    pub producers: usize,
    pub producer_batch: usize,
    /// Sample what the database's backends do (`bench::activity`).
    pub activity: bool,
}

pub async fn run(config: &Config, w: &WorkerArgs, load: &Load) -> Result<BenchReport> {
    let Load {
        duration,
        rate,
        producers,
        producer_batch,
        activity,
    } = *load;
    let db = harness::prepare(config).await?;
    let cfg = harness::worker_config(config, w, Duration::from_millis(100));
    let probe = Arc::new(Probe::default());
    let workers = Workers::start(&cfg, w.workers, probe.clone(), true).await?;
    let rss_stop = CancellationToken::new();
    let rss = harness::sample_rss(rss_stop.clone());

    let produced = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let cpu_before = harness::CpuSample::now();
    let stop = CancellationToken::new();
    let sampler = activity.then(|| activity::sample(db.clone(), stop.clone()));
    let tasks = spawn_producers(&db, rate, producers, producer_batch, &produced, &stop);
    let producers = producers.max(1);
    let batch = producer_batch.max(1);
    tokio::time::sleep(duration).await;
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    let produce_secs = started.elapsed().as_secs_f64();
    let notes = match sampler {
        Some(s) => s.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let (own_cores, other_cores) = harness::CpuSample::now().cores_since(&cpu_before, produce_secs);
    let produced = produced.load(Ordering::Relaxed);
    let ran_in_window = probe.runs();
    // Let the backlog finish so every job's latency is counted.
    let deadline = Instant::now() + Duration::from_secs(120);
    while harness::remaining(&db).await? > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rss_stop.cancel();
    let rss_peak = rss.await.unwrap_or(0.0);
    let _ = workers.stop().await?;
    let lat = probe.latencies();
    let ok = probe.runs() == produced && probe.distinct() as u64 == produced;
    Ok(BenchReport {
        system: "qbridge".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        mode: "steady".into(),
        n: produced,
        settings: serde_json::json!({
            "workers": w.workers, "batch": w.batch, "concurrency": w.concurrency,
            "target_rate": rate, "producers": producers, "producer_batch": batch,
            "seconds": duration.as_secs_f64(),
        }),
        numbers: vec![
            ("enqueue_jobs_s".into(), produced as f64 / produce_secs),
            (
                "completed_jobs_s".into(),
                ran_in_window as f64 / produce_secs,
            ),
            (
                "latency_p50_ms".into(),
                harness::percentile(&lat, 50.0) * 1000.0,
            ),
            (
                "latency_p99_ms".into(),
                harness::percentile(&lat, 99.0) * 1000.0,
            ),
            (
                "latency_max_ms".into(),
                harness::percentile(&lat, 100.0) * 1000.0,
            ),
            ("rss_peak_mib".into(), rss_peak),
            // Where the window's CPU went: this process (producers, workers,
            // completer) and everything else (the database server).
            ("qbridge_cores".into(), own_cores),
            ("other_cores".into(), other_cores),
        ],
        ok,
        notes,
    })
}

/// Starts `producers` tasks that together enqueue about `rate` no-op jobs a
/// second (0 = as fast as they can) in inserts of `batch`, adding what they
/// stored to `produced`, until `stop` is cancelled. Steady state and soak share it.
pub fn spawn_producers(
    db: &PgPool,
    rate: u64,
    producers: usize,
    batch: usize,
    produced: &Arc<AtomicU64>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let producers = producers.max(1);
    let batch = batch.max(1);
    (0..producers)
        .map(|p| {
            let (db, produced, stop) = (db.clone(), produced.clone(), stop.clone());
            tokio::spawn(async move {
                // Each producer sends `batch` jobs every `period` to hit its share of the rate.
                let share = rate as f64 / producers as f64;
                let period = if rate == 0 {
                    Duration::ZERO
                } else {
                    Duration::from_secs_f64(batch as f64 / share)
                };
                let mut next = Instant::now();
                let mut i = 0u64;
                while !stop.is_cancelled() {
                    let jobs: Vec<NewJob> = (0..batch)
                        .map(|k| {
                            NewJob::new(
                                BENCH_QUEUE,
                                serde_json::json!({ "p": p, "i": i + k as u64 }),
                            )
                        })
                        .collect();
                    i += batch as u64;
                    if enqueue::enqueue_many(&db, &jobs, usize::MAX).await.is_ok() {
                        produced.fetch_add(batch as u64, Ordering::Relaxed);
                    }
                    next += period;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = stop.cancelled() => {}
                        }
                    }
                }
            })
        })
        .collect()
}
