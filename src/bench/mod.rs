//! `qbridge bench`: measured, never asserted. Burn-down (enqueue N no-op jobs,
//! then drain), steady state (producers and workers at once), idle pickup
//! latency (with and without NOTIFY) and claim latency over a large dead-letter
//! history; a long soak with a verdict per sampled column; LPUSH direct to Redis vs through the RESP proxy with mirroring.
//! Run it on a scratch database: it only touches its own queue, but it loads
//! the server (and `proxy --slow-postgres` locks `qbridge.job_keys`).

mod activity;
mod burndown;
mod claim_latency;
mod harness;
mod latency;
mod proxy;
mod soak;
mod steady;

use std::time::Duration;

use clap::{Args, Subcommand};
use serde::Serialize;

use crate::config::{parse_duration, Config};
use crate::error::Result;

/// The queue every bench mode uses (and clears first).
pub const BENCH_QUEUE: &str = "qbridge_bench";

/// `qbridge bench …`
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub mode: BenchMode,
    /// Also print `RESULT {json}` (the format of the peer benchmark harness).
    #[arg(long, global = true)]
    pub peer_result: bool,
}

/// Bench modes.
#[derive(Debug, Subcommand)]
pub enum BenchMode {
    /// Enqueue N no-op jobs in batches, then drain them with W workers.
    #[command(
        after_help = "Example:\n  qbridge bench burndown --jobs 50000 --workers 2 --batch 500"
    )]
    Burndown(WorkerArgs),
    /// Producers and workers at once for a duration; enqueue-to-start latency.
    #[command(after_help = "Example:\n  qbridge bench steady --duration 20s --rate 5000")]
    Steady {
        #[command(flatten)]
        workers: WorkerArgs,
        /// How long to run.
        #[arg(long, default_value = "20s", value_parser = parse_dur)]
        duration: Duration,
        /// Target jobs/s over all producers (0 = as fast as possible).
        #[arg(long, default_value_t = 5000)]
        rate: u64,
        /// Producer tasks.
        #[arg(long, default_value_t = 2)]
        producers: usize,
        /// Jobs per producer insert.
        #[arg(long, default_value_t = 50)]
        producer_batch: usize,
        /// Also sample `pg_stat_activity` while it runs: what the database's
        /// backends were doing, per statement (see `bench::activity`).
        #[arg(long)]
        activity: bool,
    },
    /// Idle-queue pickup: jobs enqueued one at a time; with NOTIFY and via the poll backstop.
    #[command(after_help = "Example:\n  qbridge bench latency --samples 200 --interval 20ms")]
    Latency {
        /// Jobs to enqueue one by one.
        #[arg(long, default_value_t = 200)]
        samples: usize,
        /// Pause between enqueues.
        #[arg(long, default_value = "50ms", value_parser = parse_dur)]
        interval: Duration,
        /// Poll interval of the worker (the bound when a NOTIFY is lost).
        #[arg(long, default_value = "250ms", value_parser = parse_dur)]
        poll_interval: Duration,
    },
    /// Claim and completion latency with a large dead-letter and completed history present.
    #[command(
        after_help = "Examples:\n  qbridge bench claim --dead-history 1000000\n  \
        qbridge bench claim --done-history 10000000"
    )]
    Claim {
        /// Dead-letter rows to create first (kept between runs).
        #[arg(long, default_value_t = 1_000_000)]
        dead_history: i64,
        /// Completed-job rows (`jobs_done`, the history every completion
        /// appends to) to create first, within the last day (kept between runs).
        #[arg(long, default_value_t = 0)]
        done_history: i64,
        /// Claims to time.
        #[arg(long, default_value_t = 2000)]
        samples: usize,
        /// Jobs per claim.
        #[arg(long, default_value_t = 10)]
        batch: i64,
    },
    /// LPUSH direct to Redis vs through the RESP proxy in dual_write (mirror lag too).
    #[command(
        after_help = "Examples:\n  qbridge bench proxy --clients 8 --depth 1 --duration 10s\n  \
        qbridge bench proxy --slow-postgres 5s"
    )]
    Proxy(proxy::ProxyArgs),
    /// Steady state held for a long time, sampled every minute: RSS, jobs/s,
    /// queue lag, table size, dead tuples, then a verdict per column.
    #[command(after_help = "Examples:\n  qbridge bench soak --minutes 30\n  \
        qbridge bench soak --minutes 2 --sample-every 10s --rate 500")]
    Soak(soak::SoakArgs),
}

/// Worker settings shared by burn-down and steady state.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Jobs to enqueue (burn-down).
    #[arg(long, default_value_t = 50_000)]
    pub jobs: usize,
    /// Worker runtimes, each with its own connection pool (like worker processes).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Jobs per claim.
    #[arg(long, default_value_t = 500)]
    pub batch: i64,
    /// Handlers running at once per worker.
    #[arg(long, default_value_t = 1000)]
    pub concurrency: usize,
    /// Outcomes per completer statement.
    #[arg(long, default_value_t = 1000)]
    pub completer_batch: usize,
    /// Jobs per enqueue call (burn-down).
    #[arg(long, default_value_t = 5000)]
    pub enqueue_batch: usize,
    /// The pools' prefetch window (`[[pools]] prefetch_window`; 0s: off).
    #[arg(long, default_value = "50ms", value_parser = parse_dur)]
    pub prefetch_window: Duration,
    /// Burn-down: start the workers this long before enqueuing, polling an
    /// empty queue, so the backlog arrives as a burst after an idle spell
    /// (0s: enqueue first, then start them).
    #[arg(long, default_value = "0s", value_parser = parse_dur)]
    pub idle_first: Duration,
}

fn parse_dur(s: &str) -> std::result::Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// One bench result: printed as a table for people, JSON for scripts.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub system: String,
    pub version: String,
    pub mode: String,
    pub n: u64,
    pub settings: serde_json::Value,
    /// name → value, in print order.
    pub numbers: Vec<(String, f64)>,
    pub ok: bool,
    pub notes: Vec<String>,
}

impl BenchReport {
    fn print(&self, as_json: bool, peer_result: bool) {
        if as_json {
            let mut obj = serde_json::Map::new();
            obj.insert("system".into(), self.system.clone().into());
            obj.insert("version".into(), self.version.clone().into());
            obj.insert("mode".into(), self.mode.clone().into());
            obj.insert("n".into(), self.n.into());
            obj.insert("settings".into(), self.settings.clone());
            for (k, v) in &self.numbers {
                obj.insert(k.clone(), serde_json::json!((v * 1000.0).round() / 1000.0));
            }
            obj.insert("ok".into(), self.ok.into());
            obj.insert("notes".into(), self.notes.clone().into());
            let text = serde_json::Value::Object(obj).to_string();
            if peer_result {
                println!("RESULT {text}");
            } else {
                println!("{text}");
            }
            return;
        }
        println!(
            "qbridge bench {} (n = {}, settings {})",
            self.mode, self.n, self.settings
        );
        for (k, v) in &self.numbers {
            println!("  {k:<28} {v:>12.1}");
        }
        for note in &self.notes {
            println!("  note: {note}");
        }
        println!("  ok: {}", self.ok);
    }
}

/// Runs one bench mode.
pub async fn run(config: &Config, args: BenchArgs, as_json: bool) -> Result<()> {
    // A mode may bring its own table for people; JSON is always the report.
    let mut human = None;
    let report = match args.mode {
        BenchMode::Burndown(w) => burndown::run(config, &w, as_json).await?,
        BenchMode::Steady {
            workers,
            duration,
            rate,
            producers,
            producer_batch,
            activity,
        } => {
            let load = steady::Load {
                duration,
                rate,
                producers,
                producer_batch,
                activity,
            };
            steady::run(config, &workers, &load).await?
        }
        BenchMode::Latency {
            samples,
            interval,
            poll_interval,
        } => latency::run(config, samples, interval, poll_interval).await?,
        BenchMode::Claim {
            dead_history,
            done_history,
            samples,
            batch,
        } => {
            let history = claim_latency::History {
                dead: dead_history,
                done: done_history,
            };
            claim_latency::run(config, history, samples, batch).await?
        }
        BenchMode::Proxy(p) => {
            let run = proxy::run(config, &p).await?;
            human = Some(run.table());
            run.report()
        }
        BenchMode::Soak(s) => {
            let run = soak::run(config, &s, as_json || args.peer_result).await?;
            human = Some(run.table());
            run.report()
        }
    };
    match human {
        Some(text) if !(as_json || args.peer_result) => print!("{text}"),
        _ => report.print(as_json || args.peer_result, args.peer_result),
    }
    if report.ok {
        Ok(())
    } else {
        Err(crate::error::Error::InvalidInput(
            "bench finished but its checks failed (see ok/notes above)".into(),
        ))
    }
}
