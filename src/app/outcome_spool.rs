//! The Redis consumers' outcome spool, as a process runs it: the folder
//! under `state_dir` for this database, a replay of runs that are gone
//! before the consumers start (a restarted worker gets its last run's
//! records into Postgres first), and a replay every few seconds while the
//! process lives (a sibling on the same host that died is recovered
//! without waiting for its restart). What repair reads first is
//! `shadow::spool::bring_in`.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::Result;
use crate::shadow::spool::{self, Spool};

/// How often a live process replays the runs that are gone.
const REPLAY_EVERY: Duration = Duration::from_secs(5);

/// Opens this process's spool after one replay, and replays every
/// [`REPLAY_EVERY`] until `intake` is cancelled.
pub async fn open(cfg: &Config, db: &PgPool, intake: &CancellationToken) -> Result<Spool> {
    let folder = spool::folder(&cfg.state_dir, db).await?;
    // A run that cannot be replayed now is left for the next pass: it must
    // not keep this process's consumers from starting.
    if let Err(e) = spool::replay(&folder, db).await {
        tracing::warn!(error = %e, "outcome spool: replay at start failed; trying again later");
    }
    let opened = Spool::open(&folder)?;
    let (db, intake) = (db.clone(), intake.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = intake.cancelled() => return,
                _ = tokio::time::sleep(REPLAY_EVERY) => {}
            }
            if let Err(e) = spool::replay(&folder, &db).await {
                tracing::warn!(error = %e, "outcome spool: replay failed; trying again later");
            }
        }
    });
    Ok(opened)
}
