//! Replay: puts into Postgres the spooled outcomes of runs that are gone (a
//! process killed, or one that stopped while Postgres was away), then
//! deletes their files.
//!
//! A run is gone when its lock file can be locked. Each record carries its
//! `outcomes.spool_id`, so one already in (the run wrote it before it
//! died, or an earlier copy did) is not inserted again: replaying twice,
//! or a run that died between its insert and its segment's deletion, never
//! makes one attempt look like two.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use sqlx::PgPool;

use super::SpoolRecord;
use crate::error::Result;

/// What a replay found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Gone runs whose files were taken.
    pub runs: usize,
    /// Records read.
    pub records: u64,
    /// Records inserted (the others were already in Postgres).
    pub inserted: u64,
    /// Lines that were not a whole record (a write the crash cut short:
    /// never synced, so never acked).
    pub torn: u64,
    /// Gone runs that could not be replayed (Postgres refused, a file
    /// could not be read): their files stay for the next pass.
    pub failed: usize,
}

const INSERT_MISSING_SQL: &str = r#"
INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome, error_class, digest, attempt,
                             spool_id, recorded_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                     $6::text[], $7::text[], $8::int4[], $9::uuid[], $10::timestamptz[])
ON CONFLICT (spool_id) WHERE spool_id IS NOT NULL DO NOTHING
"#;

/// Records inserted per statement.
const CHUNK: usize = 500;

/// Replays every gone run in `folder` (nothing when the folder does not
/// exist). A run whose records Postgres refuses keeps its files.
pub async fn replay(folder: &Path, db: &PgPool) -> Result<Replayed> {
    let mut done = Replayed::default();
    for lock_path in lock_files(folder)? {
        let Some(lock) = take_if_gone(&lock_path) else {
            continue;
        };
        match replay_run(folder, &lock_path, db, &mut done).await {
            Ok(()) => done.runs += 1,
            Err(e) => {
                done.failed += 1;
                tracing::warn!(error = %e, "outcome spool: a stopped run could not be replayed; its files stay for the next pass");
            }
        }
        drop(lock);
    }
    if done.runs > 0 {
        tracing::info!(
            runs = done.runs,
            records = done.records,
            inserted = done.inserted,
            torn = done.torn,
            "outcome spool: replayed the records of runs that are gone"
        );
    }
    Ok(done)
}

/// One gone run: its segments in order, each deleted once in Postgres,
/// then its lock file. A file another replay deleted meanwhile is no error.
async fn replay_run(
    folder: &Path,
    lock_path: &Path,
    db: &PgPool,
    done: &mut Replayed,
) -> Result<()> {
    for segment in segments(folder, &stem(lock_path))? {
        match insert_segment(db, &segment, done).await {
            Err(crate::error::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            other => other?,
        }
        remove_if_there(&segment)?;
    }
    remove_if_there(lock_path)
}

fn remove_if_there(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// Inserts the records of the runs in `folder` that still live, leaving
/// their files to them (a record they write later is a no-op). For repair:
/// a live run's record may still wait for its writer's next try after a
/// Postgres outage. Segments that go away meanwhile are passed over.
pub async fn copy_live(folder: &Path, db: &PgPool) -> Result<Replayed> {
    let mut done = Replayed::default();
    for lock_path in lock_files(folder)? {
        for segment in segments(folder, &stem(&lock_path))? {
            match insert_segment(db, &segment, &mut done).await {
                Err(crate::error::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
        done.runs += 1;
    }
    Ok(done)
}

/// The lock files in `folder`, one per run (none when it does not exist).
fn lock_files(folder: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut locks: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "lock"))
        .collect();
    locks.sort();
    Ok(locks)
}

async fn insert_segment(db: &PgPool, segment: &Path, done: &mut Replayed) -> Result<()> {
    let (records, torn) = read_segment(segment)?;
    done.records += records.len() as u64;
    done.torn += torn;
    for chunk in records.chunks(CHUNK) {
        done.inserted += insert_missing(db, chunk).await?;
    }
    Ok(())
}

/// The lock file, locked, when its run is gone; `None` while it lives (or
/// the file went away meanwhile: another replay took it).
fn take_if_gone(path: &Path) -> Option<File> {
    let file = OpenOptions::new().write(true).open(path).ok()?;
    match file.try_lock() {
        Ok(()) => Some(file),
        Err(TryLockError::WouldBlock) => None,
        Err(TryLockError::Error(e)) => {
            tracing::warn!(error = %e, "outcome spool: could not lock a run's lock file; left alone");
            None
        }
    }
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `run`'s segments, in the order they were written.
fn segments(folder: &Path, run: &str) -> Result<Vec<PathBuf>> {
    let prefix = format!("{run}-");
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(folder)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "spool"))
        .filter_map(|p| {
            let n = stem(&p).strip_prefix(&prefix)?.parse().ok()?;
            Some((n, p))
        })
        .collect();
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

fn read_segment(path: &Path) -> Result<(Vec<SpoolRecord>, u64)> {
    let mut records = Vec::new();
    let mut torn = 0;
    for line in BufReader::new(File::open(path)?).split(b'\n') {
        match serde_json::from_slice::<SpoolRecord>(&line?) {
            Ok(r) => records.push(r),
            Err(_) => torn += 1,
        }
    }
    Ok((records, torn))
}

async fn insert_missing(db: &PgPool, records: &[SpoolRecord]) -> Result<u64> {
    let col = |f: fn(&SpoolRecord) -> &str| records.iter().map(f).collect::<Vec<_>>();
    let opt = |f: fn(&SpoolRecord) -> Option<&str>| records.iter().map(f).collect::<Vec<_>>();
    let done = sqlx::query(INSERT_MISSING_SQL)
        .bind(col(|r| &r.queue))
        .bind(col(|r| &r.key))
        .bind(col(|r| &r.side))
        .bind(col(|r| &r.mode))
        .bind(col(|r| &r.outcome))
        .bind(opt(|r| r.error_class.as_deref()))
        .bind(opt(|r| r.digest.as_deref()))
        .bind(records.iter().map(|r| r.attempt).collect::<Vec<_>>())
        .bind(records.iter().map(|r| r.id).collect::<Vec<_>>())
        .bind(records.iter().map(|r| r.at).collect::<Vec<_>>())
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}
