//! The background side of a recorder: takes records off the channel and
//! inserts them in batches; for a kept recorder with a spool, tells the
//! spool which of its records are now in Postgres.

use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{is_power_of_ten, record_refs, Outcome, RecorderOptions, KEPT_RETRY_MAX};
use crate::metrics as m;
use crate::shadow::spool::{Spool, Spooled};

/// What a writer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterReport {
    /// Rows inserted.
    pub written: u64,
    /// Records dropped because Postgres refused their batch.
    pub dropped: u64,
    /// Insert statements that succeeded.
    pub batches: u64,
}

impl WriterReport {
    fn add(&mut self, other: WriterReport) {
        self.written += other.written;
        self.dropped += other.dropped;
        self.batches += other.batches;
    }
}

/// The background side of a recorder: takes records off the channel and
/// inserts them in batches.
#[derive(Debug)]
pub struct OutcomeWriter {
    pub(super) rx: mpsc::Receiver<Entry>,
    pub(super) pool: PgPool,
    pub(super) opts: RecorderOptions,
    /// The kept recorder's spool: told which records are in Postgres.
    pub(super) spool: Option<Spool>,
}

/// A record on its way to Postgres, with where it was spooled first.
pub(super) type Entry = (Outcome, Option<Spooled>);

impl OutcomeWriter {
    /// Writes everything buffered right now, in batches, with retries; does
    /// not wait for more. The testable pass of [`OutcomeWriter::run`].
    pub async fn run_once(&mut self) -> WriterReport {
        self.drain(self.opts.retries).await
    }

    /// Writes records as they come until every recorder is dropped or
    /// `token` is cancelled; see [`OutcomeRecorder::spawn`].
    pub async fn run(mut self, token: CancellationToken) -> WriterReport {
        let mut report = WriterReport::default();
        let limit = self.opts.batch.max(1);
        let mut batch = Vec::with_capacity(limit);
        loop {
            let got = tokio::select! {
                biased;
                _ = token.cancelled() => break,
                n = self.rx.recv_many(&mut batch, limit) => n,
            };
            if got == 0 {
                // Every recorder is gone and the channel is empty.
                return report;
            }
            report.add(self.write(&batch, self.opts.retries).await);
            batch.clear();
        }
        // Shutdown: one last pass over what is buffered, no retries, so a
        // down Postgres cannot hold the process up.
        report.add(self.drain(0).await);
        report
    }

    async fn drain(&mut self, retries: u32) -> WriterReport {
        let mut report = WriterReport::default();
        let limit = self.opts.batch.max(1);
        loop {
            let mut batch = Vec::with_capacity(limit);
            while batch.len() < limit {
                match self.rx.try_recv() {
                    Ok(o) => batch.push(o),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                return report;
            }
            report.add(self.write(&batch, retries).await);
        }
    }

    /// Inserts one batch, trying again `retries` times; drops it after that
    /// (a kept writer goes on trying, outside its shutdown pass).
    async fn write(&self, entries: &[Entry], retries: u32) -> WriterReport {
        let batch: Vec<&Outcome> = entries.iter().map(|(o, _)| o).collect();
        let ids: Vec<_> = entries.iter().map(|(_, s)| s.map(|s| s.id)).collect();
        let mut tries = 0;
        let mut delay = self.opts.retry_delay;
        loop {
            match record_refs(&self.pool, &batch, &ids).await {
                Ok(n) => {
                    self.spooled_written(entries);
                    return WriterReport {
                        written: n,
                        dropped: 0,
                        batches: 1,
                    };
                }
                Err(e) if tries < retries => {
                    tries += 1;
                    tracing::debug!(error = %e, tries, "outcome batch refused; trying again");
                    tokio::time::sleep(self.opts.retry_delay).await;
                }
                Err(e) if self.opts.keep && retries > 0 => {
                    tries += 1;
                    if is_power_of_ten(u64::from(tries)) {
                        tracing::warn!(error = %e, tries, kept = batch.len(),
                            "outcome batch refused; kept, trying again until Postgres takes it");
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(KEPT_RETRY_MAX);
                }
                Err(e) => {
                    let n = batch.len() as u64;
                    metrics::counter!(m::OUTCOMES_DROPPED, "reason" => "db").increment(n);
                    // A spooled record stays in its segment, for replay.
                    let spooled = entries
                        .iter()
                        .filter(|(_, s)| s.is_some_and(|s| s.segment.is_some()))
                        .count();
                    tracing::warn!(error = %e, dropped = n, spooled,
                        "outcome batch not written: Postgres refused it (spooled ones are replayed later; the diff misses the rest)");
                    return WriterReport {
                        written: 0,
                        dropped: n,
                        batches: 0,
                    };
                }
            }
        }
    }

    /// Tells the spool its records in `entries` are in Postgres, one call
    /// per segment.
    fn spooled_written(&self, entries: &[Entry]) {
        let Some(spool) = &self.spool else { return };
        let mut run: Option<(u64, usize)> = None;
        for segment in entries
            .iter()
            .filter_map(|(_, s)| s.and_then(|s| s.segment))
        {
            match &mut run {
                Some((seg, n)) if *seg == segment => *n += 1,
                _ => {
                    if let Some((seg, n)) = run.take() {
                        spool.written(seg, n);
                    }
                    run = Some((segment, 1));
                }
            }
        }
        if let Some((seg, n)) = run {
            spool.written(seg, n);
        }
    }
}
