//! Dead-letter requeues started from the console: each runs in the
//! background at its bounded rate (`queue::dlq::requeue`, as `qbridge dlq
//! requeue`), and its progress is shown on the dead-letter page, refreshed
//! in place until it is done. The last [`KEPT`] are remembered, in memory.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use sqlx::PgPool;

use crate::queue::dlq;

/// Requeues remembered (the oldest are forgotten first).
const KEPT: usize = 100;

/// How one requeue stands.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    pub selected: usize,
    pub moved: u64,
    pub rate: u32,
    pub done: bool,
    pub error: Option<String>,
}

/// The process's console requeues, by id.
#[derive(Clone, Default)]
pub struct Requeues(Arc<Mutex<VecDeque<(String, Progress)>>>);

impl Requeues {
    /// Starts requeuing `ids` at `rate` jobs/s; returns the requeue's id.
    pub fn start(&self, db: PgPool, ids: Vec<i64>, rate: u32, who: String) -> String {
        let id = super::session::random_token()[..16].to_string();
        {
            let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if all.len() >= KEPT {
                all.pop_front();
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
        let (me, key) = (self.clone(), id.clone());
        tokio::spawn(async move {
            let selected = ids.len();
            let sel = dlq::Selector {
                ids: Some(ids),
                queue: None,
                error_contains: None,
            };
            let result = dlq::requeue(&db, &sel, rate, |moved| {
                me.update(&key, |p| p.moved = moved)
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
            me.update(&key, |p| {
                p.done = true;
                p.error = result.err().map(|e| e.to_string());
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
