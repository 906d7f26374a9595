//! The job types that cross the queue API: what a producer hands in, and what a
//! claim hands out.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A job to enqueue. Build with [`NewJob::new`] and the `with_*` setters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewJob {
    /// Queue name, validated by [`crate::queue::validate::queue_name`].
    pub queue: String,
    /// Job type (Sidekiq class, Celery task name); used by per-kind pools.
    #[serde(default)]
    pub kind: Option<String>,
    /// Idempotency / cross-system identity. A second in-flight live job with
    /// the same (queue, key) is reported as a duplicate and not inserted.
    /// Mirror copies are not held to it: the Redis side stores each key's
    /// mirror once (`qbridge.job_keys`), and a mirror copy being drained
    /// must never keep the live job of its key out (migration 0010).
    #[serde(default)]
    pub key: Option<String>,
    /// The payload, stored as jsonb.
    pub payload: Value,
    /// Larger runs first.
    #[serde(default)]
    pub priority: i32,
    /// Not before this time; `None` means now (by the database clock).
    #[serde(default)]
    pub run_at: Option<DateTime<Utc>>,
    /// Attempts before the job is dead-lettered; `None` uses the table default (25).
    #[serde(default)]
    pub max_attempts: Option<i32>,
    /// Jobs sharing a lock key never run at the same time.
    #[serde(default)]
    pub lock_key: Option<String>,
    /// Live copy (runs for real) or mirror copy of a Redis job (never runs
    /// live). Set by the Redis side; jobs from JSON input are always live.
    #[serde(skip)]
    pub copy: JobCopy,
    /// The Redis list item this job came from or goes to, byte for byte.
    #[serde(skip)]
    pub original: Option<bytes::Bytes>,
}

/// Which copy of a job a row is (ARCHITECTURE.md, "Vocabulary": live copy / mirror copy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, sqlx::Type, Serialize, Deserialize)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum JobCopy {
    /// The copy that must really run: its handler is called live.
    #[default]
    Live,
    /// A mirror of a job whose live run happens on the Redis side. The
    /// Postgres consumer drains it without running the handler live.
    Mirror,
}

impl JobCopy {
    /// The text stored in `jobs.copy`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobCopy::Live => "live",
            JobCopy::Mirror => "mirror",
        }
    }
}

impl NewJob {
    /// A ready-now job with default priority and attempts.
    pub fn new(queue: impl Into<String>, payload: Value) -> Self {
        NewJob {
            queue: queue.into(),
            kind: None,
            key: None,
            payload,
            priority: 0,
            run_at: None,
            max_attempts: None,
            lock_key: None,
            copy: JobCopy::Live,
            original: None,
        }
    }

    /// Marks the job as a live or mirror copy, with the Redis item's bytes.
    pub fn with_copy(mut self, copy: JobCopy, original: Option<bytes::Bytes>) -> Self {
        self.copy = copy;
        self.original = original;
        self
    }

    /// Sets the idempotency key.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the job kind.
    pub fn with_kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Sets the priority (larger runs first).
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Delays the job until `run_at`.
    pub fn with_run_at(mut self, run_at: DateTime<Utc>) -> Self {
        self.run_at = Some(run_at);
        self
    }

    /// Sets the attempt limit.
    pub fn with_max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Sets the serialization lock key.
    pub fn with_lock_key(mut self, lock_key: impl Into<String>) -> Self {
        self.lock_key = Some(lock_key.into());
        self
    }
}

/// The fencing identity of one claimed attempt: every state change names both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobRef {
    /// Row id.
    pub id: i64,
    /// Lease token handed out by this claim; later claims get larger tokens.
    pub lease: i64,
}

/// A job as handed to a worker by a claim.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClaimedJob {
    pub id: i64,
    pub queue: String,
    pub kind: Option<String>,
    pub key: Option<String>,
    pub payload: Value,
    pub priority: i32,
    /// 1 on the first run.
    pub attempts: i32,
    pub max_attempts: i32,
    pub lease: i64,
    pub run_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub lock_key: Option<String>,
    /// Set on queues with a tenant pointer (see `queue::tenants`).
    pub tenant: Option<String>,
    /// A mirror copy never runs its handler live.
    pub copy: JobCopy,
}

impl ClaimedJob {
    /// The (id, lease) pair that fences this attempt.
    pub fn job_ref(&self) -> JobRef {
        JobRef {
            id: self.id,
            lease: self.lease,
        }
    }
}
