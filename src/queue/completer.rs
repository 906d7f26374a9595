//! The batched completer: handlers hand their outcomes to a bounded channel; one
//! task writes them one statement per outcome type per batch, flushing when a
//! batch is full or a short tick has passed. When every sender is gone (the
//! pools have stopped) it drains what is left, so shutdown never drops a
//! completion. A flush that fails is retried with backoff; jobs whose outcome
//! could never be written are re-run after their lease expires (at-least-once).

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::Result;
use crate::metrics as m;
use crate::queue::fence;
use crate::queue::job::JobRef;

/// What a handler decided about one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done: the job leaves the queue.
    Complete,
    /// Run again after `delay`.
    Retry { delay: Duration, error: String },
    /// Give up: move to the dead-letter table.
    Dead { error: String },
}

/// One finished attempt on its way to the database.
#[derive(Debug, Clone)]
pub struct Finished {
    pub job: JobRef,
    /// For metric labels only.
    pub queue: Arc<str>,
    pub outcome: Outcome,
}

/// Batch settings.
#[derive(Debug, Clone, Copy)]
pub struct CompleterConfig {
    /// Most outcomes per statement.
    pub batch_size: usize,
    /// Longest an outcome waits for its batch to fill.
    pub tick: Duration,
    /// Keep completed jobs in `jobs_done`.
    pub keep_history: bool,
    /// How long a failing flush is retried before its outcomes are given up
    /// (their leases then expire and the reaper re-runs them).
    pub give_up_after: Duration,
}

impl Default for CompleterConfig {
    fn default() -> Self {
        CompleterConfig {
            batch_size: 1000,
            tick: Duration::from_millis(2),
            keep_history: false,
            give_up_after: Duration::from_secs(30),
        }
    }
}

/// Totals over the completer's life.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CompleterReport {
    pub completed: u64,
    pub retried: u64,
    pub dead: u64,
    /// Outcomes discarded because the lease was gone.
    pub lost_lease: u64,
    /// Outcomes that could not be written at all.
    pub abandoned: u64,
}

impl CompleterReport {
    fn add(&mut self, other: CompleterReport) {
        self.completed += other.completed;
        self.retried += other.retried;
        self.dead += other.dead;
        self.lost_lease += other.lost_lease;
        self.abandoned += other.abandoned;
    }
}

/// Starts the completer task. Drop every clone of the sender to stop it; the
/// join handle yields the totals after the final flush.
pub fn spawn(
    pool: PgPool,
    config: CompleterConfig,
) -> (mpsc::Sender<Finished>, JoinHandle<CompleterReport>) {
    let (tx, rx) = mpsc::channel(config.batch_size.max(1) * 4);
    let handle = tokio::spawn(run(pool, config, rx));
    (tx, handle)
}

async fn run(
    pool: PgPool,
    config: CompleterConfig,
    mut rx: mpsc::Receiver<Finished>,
) -> CompleterReport {
    let mut total = CompleterReport::default();
    let mut batch: Vec<Finished> = Vec::with_capacity(config.batch_size);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + config.tick;
        while batch.len() < config.batch_size {
            // Take what is already queued without waiting, then wait out the tick.
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(item)) => batch.push(item),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
        total.add(flush_with_retry(&pool, &config, &batch).await);
        batch.clear();
    }
    total
}

async fn flush_with_retry(
    pool: &PgPool,
    config: &CompleterConfig,
    batch: &[Finished],
) -> CompleterReport {
    let started = tokio::time::Instant::now();
    let mut wait = Duration::from_millis(50);
    loop {
        match flush(pool, batch, config.keep_history).await {
            Ok(report) => return report,
            Err(err) if started.elapsed() < config.give_up_after => {
                tracing::warn!(error = %err, jobs = batch.len(), "completer flush failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            Err(err) => {
                tracing::error!(error = %err, jobs = batch.len(),
                    "completer gave up on a batch; its jobs will be re-run after their leases expire");
                return CompleterReport {
                    abandoned: batch.len() as u64,
                    ..Default::default()
                };
            }
        }
    }
}

/// Writes one batch: at most one statement per outcome type.
pub async fn flush(
    pool: &PgPool,
    batch: &[Finished],
    keep_history: bool,
) -> Result<CompleterReport> {
    let mut done = Vec::new();
    let mut retries = Vec::new();
    let mut deads = Vec::new();
    for f in batch {
        match &f.outcome {
            Outcome::Complete => done.push(f.job),
            Outcome::Retry { delay, error } => retries.push((f.job, *delay, error.clone())),
            Outcome::Dead { error } => deads.push((f.job, error.clone())),
        }
    }
    // One transaction: a batch that fails half-way is retried whole, and its
    // already-applied half must not come back as "lost lease". A batch of one
    // outcome type needs no BEGIN/COMMIT round trips.
    let kinds = [!done.is_empty(), !retries.is_empty(), !deads.is_empty()];
    let (completed, retried, dead) = if kinds.iter().filter(|k| **k).count() <= 1 {
        (
            fence::complete(pool, &done, keep_history).await?,
            fence::retry(pool, &retries).await?,
            fence::dead_letter(pool, &deads).await?,
        )
    } else {
        let mut tx = pool.begin().await?;
        let c = fence::complete(&mut *tx, &done, keep_history).await?;
        let r = fence::retry(&mut *tx, &retries).await?;
        let d = fence::dead_letter(&mut *tx, &deads).await?;
        tx.commit().await?;
        (c, r, d)
    };

    let lost: std::collections::HashSet<JobRef> = completed
        .lost
        .iter()
        .chain(&retried.lost)
        .chain(&dead.lost)
        .copied()
        .collect();
    // Count per (metric, queue) first: one registry lookup per group, not per job.
    let mut counts: std::collections::HashMap<(&'static str, &str), u64> = Default::default();
    for f in batch {
        let name = match (&f.outcome, lost.contains(&f.job)) {
            (_, true) => m::JOBS_LOST_LEASE,
            (Outcome::Complete, false) => m::JOBS_COMPLETED,
            (Outcome::Retry { .. }, false) => m::JOBS_RETRIED,
            (Outcome::Dead { .. }, false) => m::JOBS_DEAD_LETTERED,
        };
        *counts.entry((name, &f.queue)).or_default() += 1;
    }
    for ((name, queue), n) in counts {
        metrics::counter!(name, "queue" => queue.to_string()).increment(n);
    }
    for job in &lost {
        tracing::warn!(
            job.id = job.id,
            lease = job.lease,
            "lost lease: outcome discarded"
        );
    }
    Ok(CompleterReport {
        completed: completed.applied.len() as u64,
        retried: retried.applied.len() as u64,
        dead: dead.applied.len() as u64,
        lost_lease: lost.len() as u64,
        abandoned: 0,
    })
}
