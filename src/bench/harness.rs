//! Bench plumbing: a clean bench queue, worker runtimes with a probe handler,
//! percentiles and the process's resident memory.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::app::{Runtime, RuntimeReport};
use crate::bench::{WorkerArgs, BENCH_QUEUE};
use crate::config::{Config, HandlerConfig, PoolConfig};
use crate::error::Result;
use crate::handler::Handler;
use crate::handler::Probe;
use crate::queue::backoff::Backoff;

/// Connects, migrates and empties the bench queue (live and dead rows).
pub async fn prepare(config: &Config) -> Result<PgPool> {
    let db = config.open_db(4).await?;
    crate::db::migrate(&db).await?;
    sqlx::query("DELETE FROM qbridge.jobs WHERE queue = $1")
        .bind(BENCH_QUEUE)
        .execute(&db)
        .await?;
    sqlx::query("VACUUM ANALYZE qbridge.jobs")
        .execute(&db)
        .await?;
    sqlx::query("CHECKPOINT").execute(&db).await.ok();
    Ok(db)
}

/// A worker config with one no-op pool on the bench queue.
pub fn worker_config(base: &Config, w: &WorkerArgs, poll: Duration) -> Config {
    let mut cfg = base.clone();
    cfg.max_connections = 4;
    cfg.completer_batch = w.completer_batch;
    cfg.worker_id = format!("bench:{}", std::process::id());
    cfg.schedules = Vec::new();
    cfg.history.retention_days = 0;
    cfg.shutdown_deadline = Duration::from_secs(5);
    cfg.pools = vec![PoolConfig {
        name: "bench".into(),
        queues: vec![BENCH_QUEUE.into()],
        kinds: None,
        concurrency: w.concurrency,
        batch_size: w.batch,
        lease: Duration::from_secs(60),
        poll_interval: poll,
        backoff: Backoff::default(),
        lock_retry_delay: Duration::from_secs(1),
        prefetch_window: w.prefetch_window,
        tenant: None,
        handler: HandlerConfig::Noop {},
    }];
    cfg
}

/// Running worker runtimes.
pub struct Workers {
    pub stop: CancellationToken,
    handles: Vec<JoinHandle<Result<RuntimeReport>>>,
}

impl Workers {
    /// Starts `n` runtimes, each with its own connection pool.
    pub async fn start(cfg: &Config, n: usize, probe: Arc<Probe>, listen: bool) -> Result<Workers> {
        let stop = CancellationToken::new();
        let mut handles = Vec::new();
        for _ in 0..n {
            let mut rt = Runtime::build(cfg.clone()).await?;
            rt.serve_http = false;
            rt.listen = listen;
            rt.gauge_interval = Duration::from_secs(3600);
            rt.handler_override = Some(Arc::new(Handler::Probe(probe.clone())));
            handles.push(tokio::spawn(rt.run_until_stopped(stop.clone())));
        }
        Ok(Workers { stop, handles })
    }

    /// Stops them and waits for their final flush.
    pub async fn stop(self) -> Result<RuntimeReport> {
        self.stop.cancel();
        let mut total = RuntimeReport::default();
        for h in self.handles {
            if let Ok(Ok(r)) = h.await {
                total.claimed += r.claimed;
                total.completer.completed += r.completer.completed;
                total.completer.lost_lease += r.completer.lost_lease;
            }
        }
        Ok(total)
    }
}

/// Rows of the bench queue still in the hot table.
pub async fn remaining(db: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs WHERE queue = $1")
            .bind(BENCH_QUEUE)
            .fetch_one(db)
            .await?,
    )
}

/// The p-th percentile (0..=100) of sorted values (nearest rank).
///
/// Exact, from every sample kept, rather than an `hdrhistogram`: a bench run
/// keeps at most a few million samples (tens of MB), the figures it prints go
/// into the performance page's tables and should not carry a histogram's bucket rounding, and
/// this one rule is shared by every bench (the proxy bench's `pct_ms` too).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Resident memory of this process in MiB (Linux; 0 elsewhere).
pub fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// CPU seconds so far: this process's (user + system) and the whole
/// machine's busy time (Linux; zeros elsewhere). The difference over a
/// window on an otherwise idle machine is the database server's share, so a
/// bench can say where a job's cost goes.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSample {
    pub own: f64,
    pub machine: f64,
}

impl CpuSample {
    pub fn now() -> Self {
        // Clock ticks; 100 a second on every Linux this runs on.
        const TICK: f64 = 100.0;
        let own = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                // Fields after the parenthesised command name: utime is the
                // 12th of them, stime the 13th.
                let rest = s.rsplit_once(')')?.1;
                let f: Vec<&str> = rest.split_whitespace().collect();
                Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
            })
            .unwrap_or(0.0);
        let machine = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let f: Vec<f64> = s
                    .lines()
                    .next()?
                    .split_whitespace()
                    .skip(1)
                    .take(8)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                // Busy: everything but idle and iowait.
                (f.len() == 8).then(|| f.iter().sum::<f64>() - f[3] - f[4])
            })
            .unwrap_or(0.0);
        CpuSample {
            own: own / TICK,
            machine: machine / TICK,
        }
    }

    /// Cores kept busy since `earlier` over `secs`: (this process, the rest
    /// of the machine).
    pub fn cores_since(&self, earlier: &CpuSample, secs: f64) -> (f64, f64) {
        let own = (self.own - earlier.own) / secs;
        let machine = (self.machine - earlier.machine) / secs;
        (own, (machine - own).max(0.0))
    }
}

/// Samples RSS every 20 ms until cancelled; returns the peak.
pub fn sample_rss(token: CancellationToken) -> JoinHandle<f64> {
    tokio::spawn(async move {
        let mut peak: f64 = 0.0;
        while !token.is_cancelled() {
            peak = peak.max(rss_mib());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peak.max(rss_mib())
    })
}
