//! Enqueue: one or many jobs in a single UNNEST insert per chunk, on the caller's
//! connection or transaction so jobs commit or roll back with business writes.
//! Wake-ups are sent at commit by the `jobs_hint_at_commit` trigger, coalesced
//! per queue (migration 0020).

use std::collections::HashMap;

use sqlx::{PgConnection, PgPool};

use crate::error::Result;
use crate::queue::job::NewJob;
use crate::queue::validate;

/// Rows per INSERT statement. Big enough to amortize the round trip, small
/// enough to keep one statement's parameter arrays modest.
const CHUNK: usize = 10_000;

/// What happened to one job of an enqueue call, in input order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// Inserted with this id.
    Inserted(i64),
    /// An in-flight job with the same (queue, key) exists (or came earlier in
    /// this batch); nothing was inserted. The id is the existing job's when it
    /// was still in flight at lookup time.
    Duplicate(Option<i64>),
}

impl EnqueueOutcome {
    /// True when the job was not inserted because of its key.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, EnqueueOutcome::Duplicate(_))
    }
}

/// The enqueue INSERT, with `$conflict` between its rows and RETURNING.
macro_rules! insert_sql {
    ($conflict:literal) => {
        concat!(
            r#"
INSERT INTO qbridge.jobs (queue, kind, key, payload, priority, run_at, max_attempts, lock_key, tenant,
                          copy, original)
SELECT t.queue, t.kind, t.key, t.payload::jsonb, t.priority, coalesce(t.run_at, now()),
       coalesce(t.max_attempts, 25), t.lock_key,
       CASE WHEN s.tenant_path IS NOT NULL
            THEN coalesce(t.payload::jsonb #>> s.tenant_path, '') END,
       t.copy, t.original
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[],
              $6::timestamptz[], $7::int4[], $8::text[], $9::text[], $10::bytea[])
       WITH ORDINALITY AS t(queue, kind, key, payload, priority, run_at, max_attempts, lock_key,
                            copy, original, ord)
  LEFT JOIN qbridge.queue_settings s ON s.queue = t.queue
 ORDER BY t.ord
"#,
            $conflict,
            "\nRETURNING id, queue, key\n"
        )
    };
}

/// A chunk with keys: a key already in flight makes its row a no-op.
const KEYED_INSERT_SQL: &str =
    insert_sql!("ON CONFLICT (queue, key) WHERE key IS NOT NULL AND copy = 'live' DO NOTHING");

/// A chunk without keys cannot collide on `jobs_key_idx`, whose rows all
/// have a key. Without ON CONFLICT, Postgres inserts each row plainly instead
/// of speculatively (a speculative-insertion lock and a confirmation record
/// per row): the enqueue statement alone ran 7-16% faster under pgbench
/// (`bench/enqueue-statement/run.sh`).
const UNKEYED_INSERT_SQL: &str = insert_sql!("");

const EXISTING_SQL: &str = r#"
SELECT j.id, j.queue, j.key
  FROM qbridge.jobs j
  JOIN unnest($1::text[], $2::text[]) AS t(queue, key) ON j.queue = t.queue AND j.key = t.key
 WHERE j.copy = 'live'
"#;

/// Enqueues `jobs` on `conn` (a pooled connection or `&mut *transaction`).
/// Validates every job first, so a bad one refuses the whole call and nothing is
/// written. Returns one outcome per job, in input order.
pub async fn enqueue(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    payload_limit: usize,
) -> Result<Vec<EnqueueOutcome>> {
    let mut payloads = Vec::with_capacity(jobs.len());
    for job in jobs {
        validate::queue_name(&job.queue)?;
        validate::job_fields(job)?;
        if let Some(m) = job.max_attempts {
            if m < 1 {
                return Err(crate::error::Error::InvalidInput(format!(
                    "max_attempts must be at least 1, got {m}"
                )));
            }
        }
        payloads.push(validate::payload_value(&job.payload, payload_limit)?);
    }
    let mut outcomes = Vec::with_capacity(jobs.len());
    let mut payloads = payloads.into_iter();
    for chunk in jobs.chunks(CHUNK) {
        let texts: Vec<String> = payloads.by_ref().take(chunk.len()).collect();
        outcomes.extend(insert_chunk(conn, chunk, texts).await?);
    }
    Ok(outcomes)
}

/// Enqueues on a pool inside one transaction: all jobs land or none do.
pub async fn enqueue_many(
    pool: &PgPool,
    jobs: &[NewJob],
    payload_limit: usize,
) -> Result<Vec<EnqueueOutcome>> {
    if jobs.len() <= CHUNK {
        // One statement is atomic on its own: skip BEGIN/COMMIT round trips.
        let mut conn = pool.acquire().await?;
        return enqueue(&mut conn, jobs, payload_limit).await;
    }
    let mut tx = pool.begin().await?;
    let outcomes = enqueue(&mut tx, jobs, payload_limit).await?;
    tx.commit().await?;
    Ok(outcomes)
}

async fn insert_chunk(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    payloads: Vec<String>,
) -> Result<Vec<EnqueueOutcome>> {
    let sql = if jobs.iter().any(|j| j.key.is_some()) {
        KEYED_INSERT_SQL
    } else {
        UNKEYED_INSERT_SQL
    };
    let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(sql)
        .bind(jobs.iter().map(|j| j.queue.as_str()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.kind.as_deref()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.key.as_deref()).collect::<Vec<_>>())
        .bind(payloads)
        .bind(jobs.iter().map(|j| j.priority).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.run_at).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.max_attempts).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| j.lock_key.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(jobs.iter().map(|j| j.copy.as_str()).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| j.original.as_deref())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await?;

    // Keyed rows map back by (queue, key). Unkeyed rows are never duplicates;
    // identity values are drawn in insertion order (ORDER BY ord), so sorting
    // their ids restores input order whatever order RETURNING used.
    let mut keyed: HashMap<(String, String), i64> = HashMap::new();
    let mut unkeyed: Vec<i64> = Vec::new();
    for (id, queue, key) in rows {
        match key {
            Some(k) => {
                keyed.insert((queue, k), id);
            }
            None => unkeyed.push(id),
        }
    }
    unkeyed.sort_unstable();
    let mut unkeyed = unkeyed.into_iter();

    let mut outcomes = Vec::with_capacity(jobs.len());
    let mut missing: Vec<usize> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        match &job.key {
            None => match unkeyed.next() {
                Some(id) => outcomes.push(EnqueueOutcome::Inserted(id)),
                None => {
                    return Err(crate::error::Error::InvalidInput(
                        "enqueue: database returned fewer rows than inserted".into(),
                    ))
                }
            },
            // The first job of a batch with a given key wins; later ones are
            // duplicates of it.
            Some(k) => match keyed.remove(&(job.queue.clone(), k.clone())) {
                Some(id) => outcomes.push(EnqueueOutcome::Inserted(id)),
                None => {
                    outcomes.push(EnqueueOutcome::Duplicate(None));
                    missing.push(i);
                }
            },
        }
    }
    if !missing.is_empty() {
        fill_existing_ids(conn, jobs, &missing, &mut outcomes).await?;
    }
    Ok(outcomes)
}

/// Looks up the in-flight job each duplicate collided with.
async fn fill_existing_ids(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    missing: &[usize],
    outcomes: &mut [EnqueueOutcome],
) -> Result<()> {
    let queues: Vec<&str> = missing.iter().map(|&i| jobs[i].queue.as_str()).collect();
    let keys: Vec<Option<&str>> = missing.iter().map(|&i| jobs[i].key.as_deref()).collect();
    let rows: Vec<(i64, String, String)> = sqlx::query_as(EXISTING_SQL)
        .bind(queues)
        .bind(keys)
        .fetch_all(&mut *conn)
        .await?;
    let found: HashMap<(String, String), i64> =
        rows.into_iter().map(|(id, q, k)| ((q, k), id)).collect();
    for &i in missing {
        if let Some(k) = &jobs[i].key {
            let id = found.get(&(jobs[i].queue.clone(), k.clone())).copied();
            outcomes[i] = EnqueueOutcome::Duplicate(id);
        }
    }
    Ok(())
}
