//! What the writers parked, kept in memory too until they write it
//! themselves. The gap list lives in Redis, and a Redis that restarts
//! without persistence while Postgres is down loses the gap list along with
//! the items (found by the randomized oracle, seed 757). Kept here, the
//! items' Postgres copies survive that, as long as this process does; the
//! gap list still covers this process's crash. Writing an item both ways,
//! even at once, is harmless: ids are keys, content hashes carry their write
//! ids (`ingest::writes` makes two stores of one write take turns).
//!
//! Bounded by the mirror buffer's bytes: past it the oldest requests are let
//! go (they are still in the gap list) and counted.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::ingest::Via;
use crate::metrics as m;
use crate::queue::JobCopy;
use crate::routes::Route;

/// One parked request's items.
#[derive(Clone)]
pub(super) struct Kept {
    pub route: Arc<Route>,
    pub items: Vec<Bytes>,
    pub copy: JobCopy,
    pub via: Via,
    /// Recorded in `job_keys` only (`ingest::Item::ledger_only`).
    pub ledger_only: bool,
    pub writes: uuid::Uuid,
    /// When Redis acknowledged the push.
    pub acked_at: std::time::Instant,
    /// Which Redis server did (its `run_id`), when known.
    pub acked_by: Option<Arc<str>>,
}

impl Kept {
    fn bytes(&self) -> usize {
        self.items.iter().map(|i| i.len() + 64).sum()
    }
}

/// Shared by a mirror's writers.
#[derive(Clone)]
pub(super) struct Retained {
    inner: Arc<Mutex<State>>,
    limit: usize,
}

#[derive(Default)]
struct State {
    kept: VecDeque<Kept>,
    bytes: usize,
}

impl State {
    /// Lets the oldest requests go while past `limit` (always keeping the
    /// newest one), counting what was let go.
    fn evict_past(&mut self, limit: usize) {
        while self.bytes > limit && self.kept.len() > 1 {
            let Some(old) = self.kept.pop_front() else {
                break;
            };
            self.bytes -= old.bytes();
            metrics::counter!(m::MIRROR_RETAIN_DROPPED, "route" => old.route.name.clone())
                .increment(old.items.len() as u64);
        }
    }
}

impl Retained {
    pub(super) fn new(limit: usize) -> Retained {
        Retained {
            inner: Arc::new(Mutex::new(State::default())),
            limit,
        }
    }

    /// Keeps a parked request, letting the oldest go past the bound.
    pub(super) fn keep(&self, kept: Kept) {
        let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        state.bytes += kept.bytes();
        state.kept.push_back(kept);
        state.evict_past(self.limit);
    }

    /// Takes everything kept (to write it); [`Retained::give_back`] if the
    /// write fails.
    pub(super) fn take(&self) -> Vec<Kept> {
        let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        state.bytes = 0;
        state.kept.drain(..).collect()
    }

    /// Puts back what a failed write took, ahead of anything newer.
    pub(super) fn give_back(&self, taken: Vec<Kept>) {
        let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for kept in taken.into_iter().rev() {
            state.bytes += kept.bytes();
            state.kept.push_front(kept);
        }
        state.evict_past(self.limit);
    }

    /// The routes of what is kept.
    pub(super) fn routes(&self) -> Vec<String> {
        let state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut routes: Vec<String> = state.kept.iter().map(|k| k.route.name.clone()).collect();
        routes.sort();
        routes.dedup();
        routes
    }

    pub(super) fn is_empty(&self) -> bool {
        self.inner
            .lock()
            .map(|s| s.kept.is_empty())
            .unwrap_or(false)
    }
}
