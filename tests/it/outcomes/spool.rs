//! The kept recorder's spool: every kept record is on local disk before
//! `record_kept` returns, a run that ends with everything in Postgres
//! leaves no file, a run that dies leaves its records for replay, replay
//! never writes a record twice, and a live run's files are copied, never
//! taken.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use qbridge::shadow::spool::{self, Spool};
use qbridge::shadow::{OutcomeRecorder, RecorderOptions};

use super::{opts, outcome};
use crate::support;

fn kept() -> RecorderOptions {
    RecorderOptions {
        keep: true,
        ..opts(100, 100)
    }
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

async fn outcomes(pool: &PgPool) -> i64 {
    support::count(pool, "SELECT count(*) FROM qbridge.outcomes").await
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_run_that_ends_with_everything_written_leaves_no_file(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let folder = spool::folder(dir.path(), &pool).await.unwrap();
    let token = CancellationToken::new();
    let (recorder, writer) = OutcomeRecorder::spawn_spooled(
        pool.clone(),
        kept(),
        Some(Spool::open(&folder).unwrap()),
        token,
    );
    for i in 0..5 {
        assert!(recorder.record_kept(outcome(i)).await);
    }
    // On disk before Postgres: the segment holds all five lines now.
    let lines: usize = files(&folder)
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "spool"))
        .map(|p| std::fs::read_to_string(p).unwrap().lines().count())
        .sum();
    assert_eq!(lines, 5);
    drop(recorder);
    let report = writer.await.unwrap();
    assert_eq!(report.written, 5);
    assert_eq!(outcomes(&pool).await, 5);
    // Give the appending thread its moment to end and clean up.
    support::wait_for("no spool file left", Duration::from_secs(5), || async {
        files(&folder).is_empty()
    })
    .await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_dead_runs_records_are_replayed_once_and_a_live_runs_are_left(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let folder = spool::folder(dir.path(), &pool).await.unwrap();
    // A live run: its records are its own, replay leaves them.
    let live = Spool::open(&folder).unwrap();
    let record = spool::SpoolRecord {
        id: uuid::Uuid::new_v4(),
        queue: "q".into(),
        key: "k-live".into(),
        side: "redis".into(),
        mode: "live".into(),
        outcome: "ok".into(),
        error_class: None,
        digest: None,
        attempt: Some(1),
        at: chrono::Utc::now(),
    };
    live.append(&record).await.unwrap();
    // A run that dies before its writer runs: the recorder and its
    // writer are dropped unwritten (what SIGKILL leaves).
    let (recorder, mut writer) =
        OutcomeRecorder::spooled(pool.clone(), kept(), Some(Spool::open(&folder).unwrap()));
    // The first one reached Postgres before the death.
    assert!(recorder.record_kept(outcome(0)).await);
    assert_eq!(writer.run_once().await.written, 1);
    for i in 1..3 {
        assert!(recorder.record_kept(outcome(i)).await);
    }
    drop((recorder, writer));
    // And a write the crash cut short.
    let dead_segment = support_wait_segment(&folder, &live).await;
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&dead_segment)
        .unwrap()
        .write_all(b"{\"queue\":\"q\",\"ke")
        .unwrap();

    let first = spool::replay(&folder, &pool).await.unwrap();
    assert_eq!(
        (first.runs, first.records, first.inserted, first.torn),
        (1, 3, 2, 1),
        "{first:?}"
    );
    assert_eq!(outcomes(&pool).await, 3, "each attempt once");
    let again = spool::replay(&folder, &pool).await.unwrap();
    assert_eq!(again, spool::Replayed::default());
    // Repair also copies a live run's records (its writer may still be
    // waiting for its next try); a second copy, or the run's own write
    // later, is a no-op.
    let live_copy = spool::copy_live(&folder, &pool).await.unwrap();
    assert_eq!(
        (live_copy.runs, live_copy.inserted),
        (1, 1),
        "{live_copy:?}"
    );
    assert_eq!(spool::copy_live(&folder, &pool).await.unwrap().inserted, 0);
    assert_eq!(outcomes(&pool).await, 4);
    // The live run's lock and segment are still there.
    let left = files(&folder);
    assert!(
        left.iter()
            .all(|p| p.to_string_lossy().contains(live.run())),
        "{left:?}"
    );
    assert_eq!(left.len(), 2, "{left:?}");
}

/// The segment of the run that is not `live`, once that run's appending
/// thread has ended and let go of its lock (as a killed process does at
/// once).
async fn support_wait_segment(folder: &Path, live: &Spool) -> PathBuf {
    let other = |ext: &str| {
        files(folder).into_iter().find(|p| {
            p.extension().is_some_and(|x| x == ext) && !p.to_string_lossy().contains(live.run())
        })
    };
    support::wait_for("the dead run's lock let go", Duration::from_secs(5), || {
        let free = other("lock").is_some_and(|lock| {
            let file = std::fs::File::open(lock).unwrap();
            let free = file.try_lock().is_ok();
            drop(file);
            free
        });
        async move { free }
    })
    .await;
    other("spool").expect("the dead run's segment")
}
