//! Soak: the steady-state workload (same producers, same no-op workers) held
//! for a long time, sampled once a minute. Each sample is the process's RSS,
//! the jobs/s enqueued and completed since the last sample, the queue lag (age
//! of the oldest due ready job), the hot table's total size and its dead
//! tuples. Rows print as they are taken so a long run shows progress; the end
//! adds a verdict per column (see [`verdict`]).

mod verdict;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::bench::harness::{self, Workers};
use crate::bench::steady::spawn_producers;
use crate::bench::{BenchReport, WorkerArgs, BENCH_QUEUE};
use crate::config::Config;
use crate::error::Result;
use crate::handler::Probe;

pub use verdict::{judge, Column, Verdict};

/// `qbridge bench soak …`
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    #[command(flatten)]
    pub workers: WorkerArgs,
    /// How long to run, in minutes.
    #[arg(long, default_value_t = 30)]
    pub minutes: u64,
    /// Time between samples (a minute; shorter only for a quick trial).
    #[arg(long, default_value = "60s", value_parser = super::parse_dur)]
    pub sample_every: Duration,
    /// Target jobs/s over all producers (0 = as fast as possible).
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Producer tasks.
    #[arg(long, default_value_t = 2)]
    pub producers: usize,
    /// Jobs per producer insert.
    #[arg(long, default_value_t = 50)]
    pub producer_batch: usize,
}

/// One sample row.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub at_s: f64,
    pub rss_mib: f64,
    pub enqueued_s: f64,
    pub completed_s: f64,
    pub lag_s: f64,
    pub table_mib: f64,
    pub dead_tuples: f64,
}

/// A finished soak: its samples and whether every job ran.
pub struct SoakRun {
    pub args: SoakArgs,
    pub samples: Vec<Sample>,
    pub produced: u64,
    pub ran: u64,
}

/// Runs the soak; prints each row as it is taken unless `quiet`.
pub async fn run(config: &Config, args: &SoakArgs, quiet: bool) -> Result<SoakRun> {
    let w = &args.workers;
    let db = harness::prepare(config).await?;
    let cfg = harness::worker_config(config, w, Duration::from_millis(100));
    let probe = Arc::new(Probe::count_only());
    let workers = Workers::start(&cfg, w.workers, probe.clone(), true).await?;
    let produced = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let tasks = spawn_producers(
        &db,
        args.rate,
        args.producers,
        args.producer_batch,
        &produced,
        &stop,
    );

    let started = Instant::now();
    let total = Duration::from_secs(args.minutes.max(1) * 60);
    let every = args.sample_every.max(Duration::from_secs(1));
    if !quiet {
        println!(
            "qbridge bench soak: {} min, target {} jobs/s, {} workers, a sample every {:?}",
            args.minutes, args.rate, w.workers, every
        );
        println!("{}", header());
    }
    let mut samples = Vec::new();
    let (mut last_at, mut last_prod, mut last_ran) = (Instant::now(), 0u64, 0u64);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    while started.elapsed() + Duration::from_millis(500) < total {
        tick.tick().await;
        let (prod, ran) = (produced.load(Ordering::Relaxed), probe.runs());
        let secs = last_at.elapsed().as_secs_f64().max(1e-9);
        let (lag_s, table_mib, dead_tuples) = table_stats(&db).await?;
        let s = Sample {
            at_s: started.elapsed().as_secs_f64(),
            rss_mib: harness::rss_mib(),
            enqueued_s: (prod - last_prod) as f64 / secs,
            completed_s: (ran - last_ran) as f64 / secs,
            lag_s,
            table_mib,
            dead_tuples,
        };
        (last_at, last_prod, last_ran) = (Instant::now(), prod, ran);
        if !quiet {
            println!("{}", row(&s));
            let _ = std::io::stdout().flush();
        }
        samples.push(s);
    }
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    // Let the backlog drain so "every job ran" is a real check.
    let deadline = Instant::now() + Duration::from_secs(120);
    while harness::remaining(&db).await? > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = workers.stop().await?;
    Ok(SoakRun {
        args: args.clone(),
        samples,
        produced: produced.load(Ordering::Relaxed),
        ran: probe.runs(),
    })
}

/// (lag of the oldest due ready bench job in s, total size of qbridge.jobs in
/// MiB, its dead tuples as the statistics collector last counted them).
async fn table_stats(db: &PgPool) -> Result<(f64, f64, f64)> {
    let lag: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - min(run_at))::float8 FROM qbridge.jobs \
         WHERE queue = $1 AND state = 'ready' AND run_at <= now()",
    )
    .bind(BENCH_QUEUE)
    .fetch_one(db)
    .await?;
    let size: i64 = sqlx::query_scalar("SELECT pg_total_relation_size('qbridge.jobs')")
        .fetch_one(db)
        .await?;
    let dead: Option<i64> = sqlx::query_scalar(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'qbridge' AND relname = 'jobs'",
    )
    .fetch_optional(db)
    .await?;
    Ok((
        lag.unwrap_or(0.0).max(0.0),
        size as f64 / (1024.0 * 1024.0),
        dead.unwrap_or(0) as f64,
    ))
}

fn header() -> String {
    format!(
        "{:>7} {:>9} {:>11} {:>11} {:>8} {:>9} {:>11}",
        "elapsed", "rss_mib", "enq_jobs_s", "done_jobs_s", "lag_s", "table_mib", "dead_tuples"
    )
}

fn row(s: &Sample) -> String {
    format!(
        "{:>4}:{:02} {:>9.1} {:>11.0} {:>11.0} {:>8.2} {:>9.2} {:>11.0}",
        (s.at_s / 60.0) as u64,
        (s.at_s as u64) % 60,
        s.rss_mib,
        s.enqueued_s,
        s.completed_s,
        s.lag_s,
        s.table_mib,
        s.dead_tuples
    )
}

impl SoakRun {
    fn verdicts(&self) -> Vec<(Column, Verdict)> {
        Column::ALL
            .iter()
            .map(|c| (*c, judge(*c, &self.samples)))
            .collect()
    }

    fn all_ran(&self) -> bool {
        self.ran >= self.produced
    }

    /// The closing table: the rule, then one verdict per column.
    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "verdicts ({} samples; first two thirds vs last third): {}\n",
            self.samples.len(),
            verdict::RULE
        ));
        for (c, v) in self.verdicts() {
            out.push_str(&format!("  {:<12} {}\n", c.name(), v.describe()));
        }
        out.push_str(&format!(
            "  jobs: {} enqueued, {} ran{}\n",
            self.produced,
            self.ran,
            if self.all_ran() { "" } else { " (NOT all ran)" }
        ));
        out.push_str(&format!("  ok: {}\n", self.ok()));
        out
    }

    fn ok(&self) -> bool {
        self.all_ran() && self.verdicts().iter().all(|(_, v)| v.passed())
    }

    /// Numbers for `--json`: the last sample of each column and the verdicts.
    pub fn report(&self) -> BenchReport {
        let last = self.samples.last().copied().unwrap_or_default();
        let mut numbers = vec![
            ("rss_mib".to_string(), last.rss_mib),
            ("completed_jobs_s".into(), last.completed_s),
            ("lag_s".into(), last.lag_s),
            ("table_mib".into(), last.table_mib),
            ("dead_tuples".into(), last.dead_tuples),
        ];
        let mut notes = Vec::new();
        for (c, v) in self.verdicts() {
            numbers.push((format!("{}_growth", c.name()), v.growth()));
            notes.push(format!("{}: {}", c.name(), v.describe()));
        }
        BenchReport {
            system: "qbridge".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            mode: "soak".into(),
            n: self.produced,
            settings: serde_json::json!({
                "minutes": self.args.minutes, "target_rate": self.args.rate,
                "workers": self.args.workers.workers, "batch": self.args.workers.batch,
                "concurrency": self.args.workers.concurrency, "producers": self.args.producers,
                "sample_every_s": self.args.sample_every.as_secs_f64(),
            }),
            numbers,
            ok: self.ok(),
            notes,
        }
    }
}
