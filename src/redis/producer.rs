//! The producer API: enqueue a list item on a route, honouring its phase.
//!
//! | phase | Postgres | Redis |
//! | --- | --- | --- |
//! | `redis_only` | nothing | pushed |
//! | `dual_write`, `shadow` | mirror copy, in the caller's transaction | pushed after commit |
//! | `postgres_only`, `decommissioned` | live copy, in the caller's transaction | nothing |
//!
//! The Redis push after commit is the dual-write seam. It is closed with an
//! outbox: the push is written to `qbridge.redis_outbox` in the same
//! transaction as the job, and deleted once Redis took the item. A push that
//! fails (Redis down) or never happens (the process died after commit) stays
//! in the outbox, and [`crate::redis::outbox`] makes it later. Only new jobs
//! are pushed: a re-enqueue of a known key pushes nothing the second time.
//!
//! ```no_run
//! # async fn demo(producer: qbridge::redis::producer::Producer, pool: sqlx::PgPool) -> qbridge::Result<()> {
//! let mut tx = pool.begin().await?;
//! // ... business writes on &mut *tx ...
//! let pending = producer.enqueue_in(&mut tx, "emails", vec![br#"{"id":"7"}"#.to_vec().into()]).await?;
//! tx.commit().await?;
//! let enqueued = pending.push(&producer).await?;
//! assert!(enqueued.push_error.is_none());
//! # Ok(()) }
//! ```

use std::sync::Arc;

use ::redis::aio::ConnectionManager;
use bytes::Bytes;
use sqlx::{PgConnection, PgPool};

use crate::error::{Error, Result};
use crate::ingest::{self, Item, Stored, Via};
use crate::metrics as m;
use crate::model::following::{FOLLOW_WAIT, NOT_FOLLOWED};
use crate::model::formats::decode_bytes;
use crate::model::Phase;
use crate::queue::JobCopy;
use crate::redis::connect::connect_redis;
use crate::redis::outbox::{self, Owed};
use crate::routes::{Route, Routes};

/// Enqueues items on routes. Cheap to clone.
#[derive(Clone)]
pub struct Producer {
    pool: PgPool,
    redis: Option<ConnectionManager>,
    routes: Routes,
    payload_limit: usize,
    via: Via,
}

/// What an enqueue did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    /// The route's phase when the items were written.
    pub phase: Phase,
    /// What became of each item in Postgres, in order (empty in `redis_only`).
    pub stored: Vec<Stored>,
    /// Items Redis took.
    pub pushed: usize,
    /// Items owed to Redis whose push failed; they are in the outbox and the
    /// repair loop pushes them. Retrying the enqueue is not needed.
    pub deferred: usize,
    /// Why the push failed, when it did (one line, no payload).
    pub push_error: Option<String>,
}

/// Postgres writes done in the caller's transaction; the Redis part is owed
/// until [`Pending::push`] runs after commit.
#[must_use = "call push() after the transaction commits, or the Redis copies wait for the repair loop"]
#[derive(Debug)]
pub struct Pending {
    route: Arc<Route>,
    phase: Phase,
    stored: Vec<Stored>,
    /// `redis_only`: items to push, stored nowhere else.
    direct: Vec<Bytes>,
    /// `dual_write`/`shadow`: outbox rows to push and delete.
    owed: Vec<Owed>,
}

impl Producer {
    /// A producer on `pool`. `redis_url` is needed while any route writes
    /// Redis; it is connected now, so an unreachable Redis is a start-up error.
    /// For a `rediss://` Redis with a private CA, connect with
    /// [`connect_redis_with`](crate::redis::connect::connect_redis_with) and use [`Producer::from_parts`].
    pub async fn connect(
        pool: PgPool,
        redis_url: Option<&str>,
        routes: Routes,
        payload_limit: usize,
    ) -> Result<Producer> {
        let redis = match redis_url {
            Some(url) => Some(connect_redis(url).await?),
            None => None,
        };
        Ok(Producer {
            pool,
            redis,
            routes,
            payload_limit,
            via: Via::Producer,
        })
    }

    /// A producer from parts already connected (`redis` may be `None` when
    /// no route writes Redis any more).
    pub fn from_parts(
        pool: PgPool,
        redis: Option<ConnectionManager>,
        routes: Routes,
        payload_limit: usize,
    ) -> Producer {
        Producer {
            pool,
            redis,
            routes,
            payload_limit,
            via: Via::Producer,
        }
    }

    /// The same producer, recording items as coming in by `via` (HTTP).
    pub fn with_via(mut self, via: Via) -> Producer {
        self.via = via;
        self
    }

    /// The routes this producer serves.
    pub fn routes(&self) -> &Routes {
        &self.routes
    }

    /// Its Redis connection (`None` when every route is decommissioned).
    pub fn redis(&self) -> Option<&ConnectionManager> {
        self.redis.as_ref()
    }

    /// Enqueues items on `route` in a transaction of its own, then pushes
    /// what Redis is owed.
    pub async fn enqueue(&self, route: &str, items: Vec<Bytes>) -> Result<Enqueued> {
        // Any wait for a phase change to be followed happens before a
        // connection is taken (`enqueue_in` then finds it followed).
        if let Some(known) = self.routes.by_name(route) {
            let known = Arc::clone(known);
            (self.routes.followed_state(&known, FOLLOW_WAIT).await)
                .ok_or_else(|| not_followed(&known))?;
        }
        let mut tx = self.pool.begin().await?;
        let pending = self.enqueue_in(&mut tx, route, items).await?;
        tx.commit().await?;
        pending.push(self).await
    }

    /// Writes the Postgres part of an enqueue on the caller's connection or
    /// transaction. Nothing reaches Redis until [`Pending::push`].
    pub async fn enqueue_in(
        &self,
        conn: &mut PgConnection,
        route: &str,
        items: Vec<Bytes>,
    ) -> Result<Pending> {
        let route = self
            .routes
            .by_name(route)
            .cloned()
            .ok_or_else(|| Error::InvalidInput(format!("no route named {route:?}")))?;
        // Under a phase every process routing the route's pushes follows:
        // a proxy's push of the same job made under the phase before may
        // still be on its way to Postgres (`model::following`).
        let state = (self.routes.followed_state(&route, FOLLOW_WAIT).await)
            .ok_or_else(|| not_followed(&route))?;
        let phase = state.0;
        metrics::counter!(m::ROUTE_PUSHES, "route" => route.name.clone(),
            "phase" => phase.as_str(), "via" => self.via.as_str())
        .increment(items.len() as u64);
        if !phase.writes_postgres() {
            self.redis_conn(&route)?;
            return Ok(Pending {
                route,
                phase,
                stored: Vec::new(),
                direct: items,
                owed: Vec::new(),
            });
        }
        // Per item: in a partial postgres_only (the gradual flip) keys
        // outside the flipped share stay mirror copies with a Redis push.
        let decoded: Vec<Item<'_>> = items
            .iter()
            .map(|bytes| {
                let decoded = decode_bytes(&route.format, bytes.clone());
                let copy = match Routes::item_phase_in(state, &decoded).postgres_is_live() {
                    true => JobCopy::Live,
                    false => JobCopy::Mirror,
                };
                Item::new(&route, decoded, copy, self.via)
            })
            .collect();
        let copies: Vec<JobCopy> = decoded.iter().map(|i| i.copy).collect();
        let stored = ingest::store(conn, decoded, self.payload_limit).await?;
        // Only new mirror copies: a known key was pushed (or owed) the first time.
        let new: Vec<(&str, &Bytes)> = stored
            .iter()
            .zip(&items)
            .zip(&copies)
            .filter(|((s, _), copy)| {
                matches!(s, Stored::New { .. } | Stored::Recorded { .. })
                    && **copy == JobCopy::Mirror
            })
            .map(|((s, b), _)| (s.key(), b))
            .collect();
        let owed = if new.is_empty() {
            Vec::new()
        } else {
            outbox::owe(conn, &route.queue, &new).await?
        };
        Ok(Pending {
            route,
            phase,
            stored,
            direct: Vec::new(),
            owed,
        })
    }

    fn redis_conn(&self, route: &Route) -> Result<ConnectionManager> {
        self.redis.clone().ok_or_else(|| {
            Error::Config(format!(
                "route {:?} writes Redis in its phase, but this producer has no Redis connection (no Redis URL given, or the process started while every route was decommissioned: restart it after a rollback)",
                route.name
            ))
        })
    }
}

impl Pending {
    /// Pushes what Redis is owed; call it after the transaction committed.
    ///
    /// In `redis_only` a failed push is an error: nothing was stored anywhere.
    /// Otherwise the jobs are stored and a failed push is reported in
    /// [`Enqueued::push_error`] and left in the outbox for repair.
    pub async fn push(self, producer: &Producer) -> Result<Enqueued> {
        let mut enqueued = Enqueued {
            phase: self.phase,
            stored: self.stored,
            pushed: 0,
            deferred: 0,
            push_error: None,
        };
        if !self.direct.is_empty() {
            let mut conn = producer.redis_conn(&self.route)?;
            let refs: Vec<&[u8]> = self.direct.iter().map(|b| b.as_ref()).collect();
            outbox::push_items(&mut conn, &self.route, &refs)
                .await
                .map_err(|e| {
                    Error::redis(
                        format!(
                            "push to route {:?} failed, nothing was enqueued",
                            self.route.name
                        ),
                        e,
                    )
                })?;
            enqueued.pushed = self.direct.len();
        }
        if !self.owed.is_empty() {
            let n = self.owed.len();
            let mut conn = producer.redis_conn(&self.route)?;
            match outbox::pay(&producer.pool, &mut conn, &self.route, &self.owed).await {
                Ok(paid) => enqueued.pushed += paid,
                Err(e) => {
                    metrics::counter!(m::PRODUCER_PUSH_FAILURES, "route" => self.route.name.clone())
                        .increment(n as u64);
                    tracing::warn!(route = %self.route.name, items = n, error = %e,
                        "Redis push failed after commit; left in the outbox for repair");
                    enqueued.deferred = n;
                    enqueued.push_error = Some(e.to_string());
                }
            }
        }
        Ok(enqueued)
    }
}

/// The refusal of a push whose route's latest phase change not every
/// proxy follows yet, counted.
fn not_followed(route: &Route) -> Error {
    metrics::counter!(m::PUSHES_NOT_FOLLOWED, "route" => route.name.clone()).increment(1);
    Error::Refused(NOT_FOLLOWED.into())
}
