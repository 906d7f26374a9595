//! What the pieces of a splice share: [`Shared`] across every connection of
//! a server, [`Link`] between the reader and the reply side of one
//! connection, and the [`Selected`] database the reply side publishes. Kept
//! apart from the connection that builds them, so the reader and the reply
//! side depend on these types and not on each other or on `connection`.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tokio::sync::{watch, Notify};

use super::auth::Gate;
use super::frame::Limits;
use crate::mirror::Mirror;
use crate::routes::Routes;

/// What every connection of a server shares.
pub(super) struct Shared {
    /// The proxy's own password, when it has one (see `auth`).
    pub gate: Option<Gate>,
    pub routes: Routes,
    pub mirror: Mirror,
    /// For client commands: `max_bulk_len`/`max_elements` from the config.
    pub limits: Limits,
    /// For replies: Redis is trusted and allows 512 MiB values and lists of
    /// any length, so only the nesting stays capped.
    pub reply_limits: Limits,
    pub commands: metrics::Counter,
    pub latency: metrics::Histogram,
    pub protocol_errors: metrics::Counter,
    /// Scripts seen that take members out of a set (`set_pop`).
    pub pop_scripts: super::pop_scripts::PopScripts,
}

/// What the reader and the reply side of one connection share besides the
/// tag channel.
pub(super) struct Link {
    /// Signalled by the reader for tags that get no reply from Redis.
    pub attention: Notify,
    /// (Un)subscribe commands the reader has written to Redis, counted
    /// *before* the write: a confirmation push that arrives while the reply
    /// side has taken fewer of their tags belongs to a tag still on its way,
    /// whereas one that arrives with none outstanding is unsolicited (Redis
    /// sends `sunsubscribe` on its own when a shard channel's slot moves).
    pub pubsub_sent: AtomicU64,
    /// The database the connection's next commands run in and whether
    /// Redis has it authenticated, published by the reply side; the reader
    /// routes pushes by it.
    pub db: watch::Sender<Selected>,
    /// The `run_id` of the Redis server this connection is spliced to, when
    /// the probe could read it: which server took the pushes mirrored from
    /// here (`redis::epoch::record_acks`). A splice never reconnects, so it
    /// holds for the connection's life.
    pub server: Option<Arc<str>>,
    /// The jobs this connection took off routed lists (`super::list_pop`),
    /// written by the reply side, read by the reader when it pushes.
    pub taken: super::list_pop::Taken,
}

/// The selected database as of the `done`-th tag the reply side finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Selected {
    /// How many tags the reply side had taken when it published this.
    pub done: u64,
    /// `None` when unknown (a SELECT Redis took but the proxy could not
    /// read): no route matches then.
    pub db: Option<i64>,
    /// Whether Redis would run a command on the connection now: the proxy
    /// answers a routed push itself only then (see `auth`).
    pub authed: bool,
}

impl Link {
    /// `authed`: whether the fresh upstream connection needs no AUTH;
    /// `server`: its Redis server's `run_id`, when known.
    pub(super) fn new(authed: bool, server: Option<Arc<str>>) -> Link {
        Link {
            server,
            taken: Default::default(),
            attention: Notify::new(),
            pubsub_sent: AtomicU64::new(0),
            db: watch::Sender::new(Selected {
                done: 0,
                db: Some(0),
                authed,
            }),
        }
    }
}
