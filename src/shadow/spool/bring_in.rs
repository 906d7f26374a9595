//! Every spooled outcome on this host into Postgres, for repair: before it
//! judges what Redis lost, the runs a consumer acked but Postgres has not
//! seen yet are evidence that those jobs ran (whichever entry point asks
//! for the repair: the CLI, the admin API or the console).

use std::path::{Path, PathBuf};

use sqlx::PgPool;

use super::{copy_live, folder, replay};
use crate::error::Result;

/// What [`bring_in`] read and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BroughtIn {
    /// The folder read.
    pub folder: PathBuf,
    /// Whether it exists (no consumer ever ran here with this `state_dir`).
    pub found: bool,
    /// Records inserted.
    pub inserted: u64,
}

/// Puts every spooled outcome on this host into Postgres (for repair,
/// before it judges what Redis lost): replays the runs that are gone, and
/// copies the records of live ones (which may still wait for their
/// writer's next try after an outage). Refuses when a stopped run could
/// not be replayed: repair would judge on part of the evidence.
pub async fn bring_in(state_dir: &Path, db: &PgPool) -> Result<BroughtIn> {
    let folder = folder(state_dir, db).await?;
    let found = folder.is_dir();
    let gone = replay(&folder, db).await?;
    if gone.failed > 0 {
        return Err(crate::error::Error::Config(format!(
            "{} stopped consumer run(s) in {} could not be replayed (see the log); repair would judge without their outcomes",
            gone.failed,
            folder.display()
        )));
    }
    let live = copy_live(&folder, db).await?;
    Ok(BroughtIn {
        folder,
        found,
        inserted: gone.inserted + live.inserted,
    })
}
