//! Burn-down: enqueue N no-op jobs in batches (timed), then start W workers and
//! time until the queue is empty. Checks every job ran exactly once. With
//! `--idle-first` the workers start first and poll the empty queue for a
//! while, so the jobs arrive as a burst after an idle spell (the drain clock
//! then starts with the enqueue): the case where a plan made for an empty
//! table met a backlog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bench::harness::{self, Workers};
use crate::bench::{BenchReport, WorkerArgs, BENCH_QUEUE};
use crate::config::Config;
use crate::error::Result;
use crate::handler::Probe;
use crate::queue::{enqueue, NewJob};

pub async fn run(config: &Config, w: &WorkerArgs, as_json: bool) -> Result<BenchReport> {
    let db = harness::prepare(config).await?;
    let n = w.jobs;
    let cfg = harness::worker_config(config, w, Duration::from_millis(100));
    let probe = Arc::new(Probe::default());
    let idle_first = !w.idle_first.is_zero();
    let early = if idle_first {
        let workers = Workers::start(&cfg, w.workers, probe.clone(), true).await?;
        tokio::time::sleep(w.idle_first).await;
        Some(workers)
    } else {
        None
    };

    // Enqueue: like the peers, in calls of `enqueue_batch` jobs, payload {"i": n}.
    // Each call's jobs are built just before it (timed with it): building a
    // million up front held ~600 MiB, which the RSS figure then showed.
    let bar = crate::output::progress(n as u64, as_json, "enqueue");
    let started = Instant::now();
    let step = w.enqueue_batch.max(1);
    for from in (0..n).step_by(step) {
        let chunk: Vec<NewJob> = (from..(from + step).min(n))
            .map(|i| NewJob::new(BENCH_QUEUE, serde_json::json!({ "i": i })))
            .collect();
        enqueue::enqueue_many(&db, &chunk, usize::MAX).await?;
        bar.inc(chunk.len() as u64);
    }
    let enqueue_secs = started.elapsed().as_secs_f64();
    bar.finish_and_clear();

    // Drain: the clock starts before the workers connect (their start-up
    // counts), or with the enqueue when they were already running.
    let rss_stop = tokio_util::sync::CancellationToken::new();
    let rss = harness::sample_rss(rss_stop.clone());
    let bar = crate::output::progress(n as u64, as_json, "drain");
    let (started, workers) = match early {
        Some(workers) => (started, workers),
        None => (
            Instant::now(),
            Workers::start(&cfg, w.workers, probe.clone(), true).await?,
        ),
    };
    let deadline = started + Duration::from_secs(600);
    loop {
        bar.set_position(probe.runs());
        // Poll the database only once the handlers have seen every job.
        if probe.runs() >= n as u64 && harness::remaining(&db).await? == 0 {
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drain_secs = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    rss_stop.cancel();
    let rss_peak = rss.await.unwrap_or(0.0);
    let _ = workers.stop().await?;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let runs = probe.runs();
    let distinct = probe.distinct() as u64;
    let left = harness::remaining(&db).await?;
    let ok = runs == n as u64 && distinct == n as u64 && left == 0;
    let mut notes = Vec::new();
    if !ok {
        notes.push(format!(
            "runs {runs}, distinct {distinct}, left in table {left} (want {n}, {n}, 0)"
        ));
    }
    Ok(BenchReport {
        system: "qbridge".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        mode: "burndown".into(),
        n: n as u64,
        settings: serde_json::json!({
            "workers": w.workers, "batch": w.batch, "concurrency": w.concurrency,
            "completer_batch": w.completer_batch, "enqueue_batch": w.enqueue_batch,
            "idle_first_s": w.idle_first.as_secs_f64(),
        }),
        numbers: vec![
            ("enqueue_jobs_s".into(), n as f64 / enqueue_secs),
            ("drain_jobs_s".into(), n as f64 / drain_secs),
            ("drain_seconds".into(), drain_secs),
            ("rss_peak_mib".into(), rss_peak),
        ],
        ok,
        notes,
    })
}
