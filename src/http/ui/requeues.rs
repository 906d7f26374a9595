//! Dead-letter requeues started from the console: each runs in the
//! background at its bounded rate (`queue::dlq::requeue`, as `qbridge dlq
//! requeue`), [`AT_ONCE`] at a time per process (more wait their turn, so
//! several requeues never add up past the rate each was given), and its
//! progress is shown on the dead-letter page, refreshed in place until it is
//! done. The last [`KEPT`] are remembered, in memory; a running one is
//! never forgotten.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use sqlx::PgPool;

use crate::queue::dlq;

/// Requeues remembered (the oldest finished ones are forgotten first).
const KEPT: usize = 100;

/// Requeues running at once per process.
const AT_ONCE: usize = 1;

/// How one requeue stands.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    pub selected: usize,
    pub moved: u64,
    pub rate: u32,
    pub done: bool,
    pub error: Option<String>,
}

/// The process's console requeues, by id, and their turn to run.
#[derive(Clone)]
pub struct Requeues(
    Arc<Mutex<VecDeque<(String, Progress)>>>,
    Arc<tokio::sync::Semaphore>,
);

impl Default for Requeues {
    fn default() -> Self {
        Requeues(
            Default::default(),
            Arc::new(tokio::sync::Semaphore::new(AT_ONCE)),
        )
    }
}

impl Requeues {
    /// Starts requeuing `ids` at `rate` jobs/s; returns the requeue's id.
    pub fn start(&self, db: PgPool, ids: Vec<i64>, rate: u32, who: String) -> String {
        let id = super::session::random_token()[..16].to_string();
        {
            let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if all.len() >= KEPT {
                if let Some(oldest_done) = all.iter().position(|(_, p)| p.done) {
                    all.remove(oldest_done);
                }
            }
            all.push_back((
                id.clone(),
                Progress {
                    selected: ids.len(),
                    rate,
                    ..Progress::default()
                },
            ));
        }
        let (me, key, turn) = (self.clone(), id.clone(), Arc::clone(&self.1));
        let progress = self.clone();
        let work = tokio::spawn(async move {
            // One requeue at a time: several never add up past their rates.
            let _turn = turn.acquire_owned().await;
            let selected = ids.len();
            let sel = dlq::Selector {
                ids: Some(ids),
                queue: None,
                error_contains: None,
            };
            let result = dlq::requeue(&db, &sel, rate, |moved| {
                progress.update(&key, |p| p.moved = moved)
            })
            .await;
            match &result {
                Ok(moved) => {
                    tracing::info!(by = %who, selected, moved, "console: requeued dead letters")
                }
                Err(e) => {
                    tracing::warn!(by = %who, selected, error = %e, "console: a dead-letter requeue failed")
                }
            }
            result.err().map(|e| e.to_string())
        });
        // Done however the work ended, a panic included.
        let key = id.clone();
        tokio::spawn(async move {
            let error = match work.await {
                Ok(error) => error,
                Err(_) => Some("the requeue task stopped unexpectedly".into()),
            };
            me.update(&key, |p| {
                p.done = true;
                p.error = error;
            });
        });
        id
    }

    fn update(&self, id: &str, change: impl FnOnce(&mut Progress)) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = all.iter_mut().find(|(k, _)| k == id) {
            change(p);
        }
    }

    pub fn get(&self, id: &str) -> Option<Progress> {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.iter().find(|(k, _)| k == id).map(|(_, p)| p.clone())
    }
}
