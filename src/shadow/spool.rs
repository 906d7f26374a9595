//! The outcome spool: qbridge's Redis consumer acks an item only once the
//! attempt's outcome is on local disk, so a process killed while Postgres
//! is away does not take the only record that the job ran with it (a Redis
//! restart erases the other one, the ran set, and repair would then push
//! the job back).
//!
//! Layout: `<state_dir>/outcomes/<installation>/` holds, per process run,
//! `<run>.lock` (an exclusive file lock held while the run lives) and
//! segments `<run>-<n>.spool`, one JSON line per outcome (queue, key, side,
//! mode, outcome, error class, digest, attempt: never a payload). Appends
//! are group-committed by one thread (write, then one `fdatasync` for all
//! records waiting). A segment is deleted once it is closed and every
//! record in it is in Postgres; a run that ends with nothing pending
//! deletes its files. The installation id (`qbridge.installation`) keeps two
//! databases' spools on one host apart.
//!
//! Records of a run that is gone (its lock file can be locked) are put into
//! Postgres by [`replay`], which then deletes its files; [`copy_live`]
//! inserts those of live runs too (for repair: a live run may still wait
//! for its writer's next try), leaving their files to them.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};

mod bring_in;
mod replay;

pub use bring_in::{bring_in, BroughtIn};
pub use replay::{copy_live, replay, Replayed};

/// Records per segment before the next one starts.
const SEGMENT_RECORDS: usize = 10_000;

/// Records written with one `fdatasync` at most.
const GROUP: usize = 512;

/// One spooled outcome, as written on a line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpoolRecord {
    /// Its `outcomes.spool_id`: whoever inserts it first (the writer or a
    /// replay), the second insert is a no-op.
    pub id: uuid::Uuid,
    pub queue: String,
    pub key: String,
    pub side: String,
    pub mode: String,
    pub outcome: String,
    pub error_class: Option<String>,
    pub digest: Option<String>,
    pub attempt: Option<i32>,
    /// When it was spooled: its `recorded_at` when a replay inserts it.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// The folder of this installation's spools under `state_dir`.
pub async fn folder(state_dir: &Path, db: &PgPool) -> Result<PathBuf> {
    let id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM qbridge.installation")
        .fetch_one(db)
        .await?;
    Ok(state_dir.join("outcomes").join(id.to_string()))
}

/// Where a record went: its segment (`None` when the write failed) and
/// its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spooled {
    pub segment: Option<u64>,
    pub id: uuid::Uuid,
}

/// This run's spool: cheap to clone.
#[derive(Debug, Clone)]
pub struct Spool {
    appends: mpsc::Sender<Append>,
    files: Arc<Files>,
}

#[derive(Debug)]
struct Append {
    line: Vec<u8>,
    done: oneshot::Sender<io::Result<u64>>,
}

/// What the appending thread and the Postgres writer share.
#[derive(Debug)]
struct Files {
    folder: PathBuf,
    run: String,
    /// Held for the run's life: the lock says the run is alive.
    _lock: File,
    segments: Mutex<Segments>,
}

#[derive(Debug, Default)]
struct Segments {
    current: u64,
    /// Per segment, records not yet in Postgres.
    pending: HashMap<u64, usize>,
}

impl Spool {
    /// Opens a new run's spool in `folder` (created if missing) and starts
    /// its appending thread, which ends once every clone is dropped.
    pub fn open(folder: &Path) -> Result<Spool> {
        let io_err = |what: &str, e: io::Error| {
            Error::Config(format!("outcome spool {folder:?}: {what}: {e}"))
        };
        // Job keys are in here: for this user only.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(folder)
            .map_err(|e| io_err("create", e))?;
        let run = uuid::Uuid::new_v4().simple().to_string();
        // Locked before it has the name a replay looks for, or a replay
        // could take the new run for a gone one between create and lock.
        let unnamed = folder.join(format!("{run}.lock.new"));
        let lock = private_file(OpenOptions::new().write(true).create_new(true), &unnamed)
            .map_err(|e| io_err("create lock", e))?;
        lock.try_lock().map_err(|e| io_err("lock", e.into()))?;
        fs::rename(&unnamed, folder.join(format!("{run}.lock")))
            .map_err(|e| io_err("name lock", e))?;
        let files = Arc::new(Files {
            folder: folder.to_path_buf(),
            run,
            _lock: lock,
            segments: Mutex::new(Segments::default()),
        });
        let first = files
            .segment_file(0)
            .map_err(|e| io_err("create segment", e))?;
        let (appends, rx) = mpsc::channel(GROUP * 4);
        let thread_files = Arc::clone(&files);
        std::thread::Builder::new()
            .name("qbridge-outcome-spool".into())
            .spawn(move || append_loop(&thread_files, first, rx))
            .map_err(|e| io_err("start thread", e))?;
        Ok(Spool { appends, files })
    }

    /// Puts `record` on disk; returns where once it is synced. The caller
    /// chose its id and inserts it under that id whether or not this
    /// succeeds: a record whose write failed after all is still inserted
    /// once.
    pub async fn append(&self, record: &SpoolRecord) -> io::Result<Spooled> {
        let id = record.id;
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        let (done, synced) = oneshot::channel();
        let gone = || io::Error::other("the spool thread has stopped");
        self.appends
            .send(Append { line, done })
            .await
            .map_err(|_| gone())?;
        let segment = synced.await.map_err(|_| gone())??;
        Ok(Spooled {
            segment: Some(segment),
            id,
        })
    }

    /// Says `n` records of `segment` are in Postgres; deletes the segment
    /// when it is closed and nothing in it is pending.
    pub fn written(&self, segment: u64, n: usize) {
        let mut s = self.files.lock();
        let left = s.pending.entry(segment).or_default();
        *left = left.saturating_sub(n);
        if *left == 0 && segment != s.current {
            s.pending.remove(&segment);
            self.files.remove_segment(segment);
        }
    }

    /// This run's name (the stem of its files).
    pub fn run(&self) -> &str {
        &self.files.run
    }
}

impl Files {
    fn lock(&self) -> std::sync::MutexGuard<'_, Segments> {
        self.segments.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn segment_path(&self, n: u64) -> PathBuf {
        self.folder.join(format!("{}-{n}.spool", self.run))
    }

    fn segment_file(&self, n: u64) -> io::Result<File> {
        let file = private_file(
            OpenOptions::new().create_new(true).append(true),
            &self.segment_path(n),
        )?;
        // The new name must survive a crash too.
        File::open(&self.folder)?.sync_all()?;
        Ok(file)
    }

    fn remove_segment(&self, n: u64) {
        if let Err(e) = fs::remove_file(self.segment_path(n)) {
            tracing::warn!(error = %e, segment = n, "outcome spool: could not delete a written segment");
        }
    }
}

impl Drop for Files {
    /// A run that ends with every record in Postgres leaves nothing behind;
    /// otherwise its files stay for [`replay`].
    fn drop(&mut self) {
        let s = self.segments.get_mut().unwrap_or_else(|p| p.into_inner());
        if s.pending.values().all(|&n| n == 0) {
            let current = s.current;
            let _ = fs::remove_file(self.segment_path(current));
            let _ = fs::remove_file(self.folder.join(format!("{}.lock", self.run)));
        }
    }
}

/// Opens `path` with `opts`, readable and writable by this user only.
fn private_file(opts: &mut OpenOptions, path: &Path) -> io::Result<File> {
    opts.mode(0o600).open(path)
}

/// The appending thread: takes what waits, writes it, syncs once, answers.
/// A group that fails is cut off the file again (a partial line would
/// swallow the next group's first record) and answered with the error.
fn append_loop(files: &Files, mut file: File, mut rx: mpsc::Receiver<Append>) {
    let mut in_segment = 0usize;
    let mut good_len = 0u64;
    while let Some(first) = rx.blocking_recv() {
        let mut group = vec![first];
        while group.len() < GROUP {
            match rx.try_recv() {
                Ok(a) => group.push(a),
                Err(_) => break,
            }
        }
        let mut buf = Vec::with_capacity(group.iter().map(|a| a.line.len()).sum());
        for a in &group {
            buf.extend_from_slice(&a.line);
        }
        let synced = file.write_all(&buf).and_then(|()| file.sync_data());
        match &synced {
            Ok(()) => good_len += buf.len() as u64,
            Err(e) => {
                tracing::warn!(error = %e, "outcome spool: a write failed; its records are kept in memory only");
                if let Err(e) = file.set_len(good_len).and_then(|()| file.sync_data()) {
                    tracing::warn!(error = %e, "outcome spool: could not cut a failed write off; starting a new segment");
                    in_segment = SEGMENT_RECORDS;
                }
            }
        }
        let segment = {
            let mut s = files.lock();
            if synced.is_ok() {
                let current = s.current;
                *s.pending.entry(current).or_default() += group.len();
            }
            s.current
        };
        let n = group.len();
        for a in group.drain(..) {
            let answer = match &synced {
                Ok(()) => Ok(segment),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            let _ = a.done.send(answer);
        }
        in_segment += n;
        if in_segment >= SEGMENT_RECORDS {
            match files.segment_file(segment + 1) {
                Ok(next) => {
                    file = next;
                    in_segment = 0;
                    good_len = 0;
                    let mut s = files.lock();
                    s.current = segment + 1;
                    if s.pending.get(&segment).is_none_or(|&n| n == 0) {
                        s.pending.remove(&segment);
                        files.remove_segment(segment);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "outcome spool: could not start a new segment; going on in this one")
                }
            }
        }
    }
}
