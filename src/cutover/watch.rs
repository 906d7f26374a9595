//! Feeds a process's [`PhaseView`] from the stored phase flag.
//!
//! A poll every `interval` (500 ms in production) is the source of truth:
//! every process learns a change within a second without a LISTEN
//! connection to lose. When Postgres does not answer, the view keeps the last
//! phases it had — the last known good — and never falls back to a default.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::cutover::store::{self, PhaseError};
use crate::cutover::PhaseView;

/// How often [`run`] reads the stored phases.
pub const INTERVAL: Duration = Duration::from_millis(500);

/// Reads every stored phase into `view`; returns how many routes changed.
/// On error `view` is left as it was.
pub async fn run_once(pool: &PgPool, view: &PhaseView) -> Result<usize, PhaseError> {
    let mut changed = 0;
    for state in store::all(pool).await? {
        let before = view.get(&state.route);
        if before != state.phase {
            tracing::info!(route = %state.route, from = %before, to = %state.phase,
                by = %state.changed_by, "route phase changed");
            view.set(&state.route, state.phase);
            changed += 1;
        }
    }
    Ok(changed)
}

/// Polls until `token` is cancelled. A failure is logged once when it starts
/// and once when it ends, not on every poll.
pub async fn run(pool: PgPool, view: PhaseView, interval: Duration, token: CancellationToken) {
    let mut failing = false;
    loop {
        match run_once(&pool, &view).await {
            Ok(_) if failing => {
                tracing::info!("phase store answers again");
                failing = false;
            }
            Ok(_) => {}
            Err(e) if !failing => {
                tracing::warn!(error = %e, "cannot read route phases; keeping the last known ones");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
