//! Outcome recording: one `qbridge.outcomes` row per handler attempt, on
//! either side, for the shadow diff to join by `(queue, key)`.
//!
//! The live path hands records to an [`OutcomeRecorder`] (cheap to clone)
//! and moves on: [`OutcomeRecorder::record`] never waits. Records go through
//! a bounded channel to one [`OutcomeWriter`], which inserts them in batches
//! (one `UNNEST` statement per batch). When the channel is full, or Postgres
//! keeps refusing a batch, records are dropped and counted
//! ([`crate::metrics::OUTCOMES_DROPPED`], label `reason`): a slow or absent
//! Postgres must never slow down or fail the jobs being described. A dropped
//! outcome shows up in the diff as a missing one, never as a wrong one.
//!
//! What is stored never includes a payload or an error text (either may
//! echo personal data): the error class is a fixed `&'static str` chosen by
//! code, and responses are kept only as their SHA-256 ([`digest_hex`]).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::spool::{Spool, SpoolRecord, Spooled};
use crate::error::{Error, Result};
use crate::metrics as m;
use writer::Entry;
pub use writer::{OutcomeWriter, WriterReport};

mod writer;

/// Which consumer ran the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The Redis consumer, or an outside worker fleet consuming Redis.
    Redis,
    /// The Postgres consumer.
    Postgres,
}

/// Whether the run was for real or a shadow run of a mirror copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The run that counts: its effects are real.
    Live,
    /// A shadow run, only for comparison.
    Shadow,
    /// A second shadow run of the same job (sampled): how much the handler
    /// disagrees with itself, the diff's noise baseline.
    Noise,
}

/// What the handler made of the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// Done.
    Ok,
    /// Failed; another attempt follows.
    Failed,
    /// Failed for good: permanent error or out of attempts.
    Dead,
}

impl Side {
    /// The text stored in `outcomes.side`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Redis => "redis",
            Side::Postgres => "postgres",
        }
    }
}

impl Mode {
    /// The text stored in `outcomes.mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Live => "live",
            Mode::Shadow => "shadow",
            Mode::Noise => "noise",
        }
    }
}

impl OutcomeKind {
    /// The text stored in `outcomes.outcome` (also a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Ok => "ok",
            OutcomeKind::Failed => "failed",
            OutcomeKind::Dead => "dead",
        }
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OutcomeKind {
    type Err = Error;

    /// Parses `ok`, `failed` or `dead` (what outside workers report).
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ok" => Ok(OutcomeKind::Ok),
            "failed" => Ok(OutcomeKind::Failed),
            "dead" => Ok(OutcomeKind::Dead),
            other => Err(Error::InvalidInput(format!(
                "outcome must be ok, failed or dead, got {:?}",
                other.chars().take(32).collect::<String>()
            ))),
        }
    }
}

/// One handler attempt, as the diff sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The route's Postgres queue.
    pub queue: String,
    /// The job key (ARCHITECTURE.md, "Vocabulary"), the same on both sides.
    pub key: String,
    /// Which consumer ran it.
    pub side: Side,
    /// Live or shadow run.
    pub mode: Mode,
    /// What came of it.
    pub outcome: OutcomeKind,
    /// Why it failed, as a short fixed text (`"http_5xx"`, `"timeout"`,
    /// `"exit_code"`, …). `&'static` on purpose: an error's own text may
    /// quote the payload and must not reach this table.
    pub error_class: Option<&'static str>,
    /// Hex SHA-256 of the handler's response, when it has one.
    pub digest: Option<String>,
    /// 1 on the first attempt; `None` when unknown (outside workers).
    pub attempt: Option<i32>,
}

impl Outcome {
    /// An outcome reported by a worker qbridge does not run (the HTTP
    /// endpoint): the same row `qbridge.report_outcome` writes — side
    /// `redis`, mode `live`, class `reported` unless ok, and `detail` kept
    /// only as its digest.
    pub fn reported(
        queue: &str,
        key: &str,
        outcome: OutcomeKind,
        detail: Option<&str>,
    ) -> Result<Outcome> {
        if queue.is_empty() || key.is_empty() {
            return Err(Error::InvalidInput(
                "queue and key must be non-empty".into(),
            ));
        }
        Ok(Outcome {
            queue: queue.to_string(),
            key: key.to_string(),
            side: Side::Redis,
            mode: Mode::Live,
            outcome,
            error_class: (outcome != OutcomeKind::Ok).then_some("reported"),
            digest: detail.map(|d| digest_hex(d.as_bytes())),
            attempt: None,
        })
    }
}

impl Outcome {
    /// This outcome as the spool writes it, under record `id`.
    fn spool_record(&self, id: uuid::Uuid) -> SpoolRecord {
        SpoolRecord {
            id,
            queue: self.queue.clone(),
            key: self.key.clone(),
            side: self.side.as_str().into(),
            mode: self.mode.as_str().into(),
            outcome: self.outcome.as_str().into(),
            error_class: self.error_class.map(Into::into),
            digest: self.digest.clone(),
            attempt: self.attempt,
            at: chrono::Utc::now(),
        }
    }
}

/// Lowercase hex SHA-256 of `bytes` (the same text Postgres'
/// `encode(sha256(…), 'hex')` gives).
pub fn digest_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for b in digest {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

const INSERT_SQL: &str = r#"
INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome, error_class, digest, attempt, spool_id)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                     $6::text[], $7::text[], $8::int4[], $9::uuid[])
ON CONFLICT (spool_id) WHERE spool_id IS NOT NULL DO NOTHING
"#;

/// Inserts `outcomes` in one statement (on a pool, a connection or the
/// caller's transaction) and returns the rows written. For callers that
/// want to wait for the write (the HTTP endpoint); the live path uses an
/// [`OutcomeRecorder`] instead.
pub async fn record<'e>(db: impl sqlx::PgExecutor<'e>, outcomes: &[Outcome]) -> Result<u64> {
    let refs: Vec<&Outcome> = outcomes.iter().collect();
    record_refs(db, &refs, &vec![None; refs.len()]).await
}

/// [`record`] over borrowed records (the writer's batches), each with its
/// spool id when it was spooled (a record already in is not written again).
async fn record_refs<'e>(
    db: impl sqlx::PgExecutor<'e>,
    outcomes: &[&Outcome],
    spool_ids: &[Option<uuid::Uuid>],
) -> Result<u64> {
    if outcomes.is_empty() {
        return Ok(0);
    }
    let col = |f: fn(&Outcome) -> &str| outcomes.iter().map(|o| f(o)).collect::<Vec<_>>();
    let done = sqlx::query(INSERT_SQL)
        .bind(col(|o| &o.queue))
        .bind(col(|o| &o.key))
        .bind(col(|o| o.side.as_str()))
        .bind(col(|o| o.mode.as_str()))
        .bind(col(|o| o.outcome.as_str()))
        .bind(outcomes.iter().map(|o| o.error_class).collect::<Vec<_>>())
        .bind(
            outcomes
                .iter()
                .map(|o| o.digest.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(outcomes.iter().map(|o| o.attempt).collect::<Vec<_>>())
        .bind(spool_ids)
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}

/// Sizes of the recorder.
#[derive(Debug, Clone, Copy)]
pub struct RecorderOptions {
    /// Records buffered at most; beyond this they are dropped and counted.
    pub capacity: usize,
    /// Records per insert statement at most.
    pub batch: usize,
    /// Further tries of a batch Postgres refused, before it is dropped.
    pub retries: u32,
    /// Pause between those tries.
    pub retry_delay: Duration,
    /// Never drop a batch Postgres refuses: try again (every `retry_delay`,
    /// up to [`KEPT_RETRY_MAX`] apart) until it is written. For the Redis
    /// consumer, which acks an item once its outcome is handed over: that
    /// outcome is then the only record that the job ran which a Redis
    /// restart cannot erase, and dropping it made repair push the job back.
    /// Only the shutdown pass may still drop (counted).
    pub keep: bool,
}

/// The longest pause between tries of a kept batch.
pub const KEPT_RETRY_MAX: Duration = Duration::from_secs(5);

impl Default for RecorderOptions {
    fn default() -> Self {
        RecorderOptions {
            capacity: 10_000,
            batch: 500,
            retries: 3,
            retry_delay: Duration::from_secs(1),
            keep: false,
        }
    }
}

/// The live path's handle: hands a record over without waiting. Cheap to
/// clone; the writer stops once every handle is dropped and it has written
/// what was buffered.
#[derive(Debug, Clone)]
pub struct OutcomeRecorder {
    tx: mpsc::Sender<Entry>,
    drops: Arc<AtomicU64>,
    /// A kept recorder's spool: [`OutcomeRecorder::record_kept`] puts each
    /// record on local disk before it returns.
    spool: Option<Spool>,
}

impl OutcomeRecorder {
    /// A recorder and its writer, not yet running: call
    /// [`OutcomeWriter::run`] (or [`OutcomeWriter::run_once`] in tests).
    pub fn new(pool: PgPool, opts: RecorderOptions) -> (OutcomeRecorder, OutcomeWriter) {
        OutcomeRecorder::spooled(pool, opts, None)
    }

    /// [`OutcomeRecorder::new`], with `spool` holding each kept record on
    /// local disk until Postgres has it.
    pub fn spooled(
        pool: PgPool,
        opts: RecorderOptions,
        spool: Option<Spool>,
    ) -> (OutcomeRecorder, OutcomeWriter) {
        let (tx, rx) = mpsc::channel(opts.capacity.max(1));
        let recorder = OutcomeRecorder {
            tx,
            drops: Arc::new(AtomicU64::new(0)),
            spool: spool.clone(),
        };
        let writer = OutcomeWriter {
            rx,
            pool,
            opts,
            spool,
        };
        (recorder, writer)
    }

    /// A recorder whose writer runs on its own task until every recorder is
    /// dropped (then it writes what is left and ends) or `token` is cancelled
    /// (then it writes what is buffered once, without retries, and ends).
    pub fn spawn(
        pool: PgPool,
        opts: RecorderOptions,
        token: CancellationToken,
    ) -> (OutcomeRecorder, JoinHandle<WriterReport>) {
        OutcomeRecorder::spawn_spooled(pool, opts, None, token)
    }

    /// [`OutcomeRecorder::spawn`] with a spool (see
    /// [`OutcomeRecorder::spooled`]).
    pub fn spawn_spooled(
        pool: PgPool,
        opts: RecorderOptions,
        spool: Option<Spool>,
        token: CancellationToken,
    ) -> (OutcomeRecorder, JoinHandle<WriterReport>) {
        let (recorder, writer) = OutcomeRecorder::spooled(pool, opts, spool);
        (recorder, tokio::spawn(writer.run(token)))
    }

    /// Hands `outcome` to the writer. Never waits: returns false when it was
    /// dropped (buffer full, or the writer has stopped), which is counted.
    pub fn record(&self, outcome: Outcome) -> bool {
        let reason = match self.tx.try_send((outcome, None)) {
            Ok(()) => return true,
            Err(mpsc::error::TrySendError::Full(_)) => "full",
            Err(mpsc::error::TrySendError::Closed(_)) => "closed",
        };
        metrics::counter!(m::OUTCOMES_DROPPED, "reason" => reason).increment(1);
        let n = self.drops.fetch_add(1, Ordering::Relaxed) + 1;
        // 1st, 10th, 100th, …: a full buffer drops many at once, one line
        // per order of magnitude says so without flooding the log.
        if is_power_of_ten(n) {
            tracing::warn!(
                dropped = n,
                reason,
                "outcome records dropped (the shadow diff will miss them)"
            );
        }
        false
    }

    /// Hands `outcome` to a kept writer, waiting for room in the buffer
    /// rather than dropping it: the Redis consumer acks only after this
    /// returns, so while Postgres is away it slows down once the buffer is
    /// full instead of acking jobs whose outcome nothing holds. With a
    /// spool, the record is first synced to local disk, so it outlives this
    /// process too; a spool that cannot write is counted and the record is
    /// kept in memory only. Returns false only when the writer has stopped
    /// (counted).
    pub async fn record_kept(&self, outcome: Outcome) -> bool {
        let spooled = match &self.spool {
            Some(spool) => {
                let id = uuid::Uuid::new_v4();
                match spool.append(&outcome.spool_record(id)).await {
                    Ok(spooled) => Some(spooled),
                    Err(_) => {
                        // Counted; the thread logged the error. Still
                        // inserted under its id: a failed sync may have
                        // left the line in the file for a replay.
                        metrics::counter!(m::OUTCOMES_SPOOL_FAILURES).increment(1);
                        Some(Spooled { segment: None, id })
                    }
                }
            }
            None => None,
        };
        if self.tx.send((outcome, spooled)).await.is_ok() {
            return true;
        }
        metrics::counter!(m::OUTCOMES_DROPPED, "reason" => "closed").increment(1);
        self.drops.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Records dropped by this recorder (and its clones) so far.
    pub fn dropped(&self) -> u64 {
        self.drops.load(Ordering::Relaxed)
    }
}

fn is_power_of_ten(mut n: u64) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_lowercase_hex_sha256() {
        assert_eq!(
            digest_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn outcome_names_parse_and_bad_ones_are_clear_errors() {
        for k in [OutcomeKind::Ok, OutcomeKind::Failed, OutcomeKind::Dead] {
            assert_eq!(k.as_str().parse::<OutcomeKind>().unwrap(), k);
        }
        let err = "success".parse::<OutcomeKind>().unwrap_err().to_string();
        assert!(err.contains("ok, failed or dead"), "{err}");
    }

    #[test]
    fn reported_outcomes_keep_only_the_digest_of_the_detail() {
        let o =
            Outcome::reported("q", "k", OutcomeKind::Failed, Some("card 4242 declined")).unwrap();
        assert_eq!(o.error_class, Some("reported"));
        assert_eq!(
            o.digest.as_deref(),
            Some(digest_hex(b"card 4242 declined").as_str())
        );
        assert!(!format!("{o:?}").contains("4242"));
        assert!(Outcome::reported("q", "", OutcomeKind::Ok, None).is_err());
    }

    #[test]
    fn drop_warnings_thin_out() {
        let hits: Vec<u64> = (1..=1000).filter(|&n| is_power_of_ten(n)).collect();
        assert_eq!(hits, vec![1, 10, 100, 1000]);
    }
}
