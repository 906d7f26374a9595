//! One client connection: its own upstream Redis connection (a 1:1 splice,
//! never shared, so blocking commands, MULTI, SELECT, AUTH, HELLO and
//! pub/sub keep Redis's per-connection meaning), a reader task and the reply
//! side, joined by a bounded channel of tags.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use super::frame::Limits;
use super::reader::{Fence, Reader};
use super::replies::Replies;
use crate::metrics as m;
use crate::redis::mirror::Mirror;
use crate::redis::routes::Routes;

/// Commands read but not yet answered, per connection. Deep enough for any
/// sane pipeline; when full the reader stops reading that client.
const TAGS_IN_FLIGHT: usize = 1024;

/// How long a new connection waits for the upstream Redis.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What every connection of a server shares.
pub(super) struct Shared {
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
    /// The database the connection's next commands run in, published by the
    /// reply side; the reader routes pushes by it.
    pub db: watch::Sender<Selected>,
}

/// The selected database as of the `done`-th tag the reply side finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Selected {
    /// How many tags the reply side had taken when it published this.
    pub done: u64,
    /// `None` when unknown (a SELECT Redis took but the proxy could not
    /// read): no route matches then.
    pub db: Option<i64>,
}

impl Link {
    pub(super) fn new() -> Link {
        Link {
            attention: Notify::new(),
            pubsub_sent: AtomicU64::new(0),
            db: watch::Sender::new(Selected {
                done: 0,
                db: Some(0),
            }),
        }
    }
}

/// Holds the open-connections gauge up for as long as it lives.
struct Open;

impl Open {
    fn new() -> Open {
        metrics::gauge!(m::PROXY_CONNECTIONS).increment(1.0);
        Open
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        metrics::gauge!(m::PROXY_CONNECTIONS).decrement(1.0);
    }
}

/// Serves one client until it or its upstream connection closes, or the
/// server stops (then the commands already read are still answered).
pub(super) async fn serve(
    id: u64,
    client: TcpStream,
    upstream: Arc<str>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let _open = Open::new();
    let upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&*upstream)).await
    {
        Ok(Ok(stream)) => stream,
        failed => {
            let reason = match failed {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".to_string(),
            };
            tracing::warn!(conn = id, error = %reason, "cannot reach the upstream Redis; refusing the client");
            // The client reads this as the answer to its first command.
            let mut client = client;
            let line = format!("-ERR qbridge: upstream Redis unavailable ({reason})\r\n");
            let _ = client.write_all(line.as_bytes()).await;
            let _ = client.shutdown().await;
            return;
        }
    };
    // Both sides carry small request/reply exchanges: Nagle only adds delay.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let (tags, tag_rx) = mpsc::channel(TAGS_IN_FLIGHT);
    let closed = CancellationToken::new();
    let link = Arc::new(Link::new());
    let reader = Reader {
        id,
        client: client_read,
        upstream: upstream_write,
        tags,
        selected: link.db.subscribe(),
        link: Arc::clone(&link),
        fence: Fence::default(),
        maybe_silenced: false,
        shared: Arc::clone(&shared),
        stop: stop.clone(),
        closed: closed.clone(),
    };
    let reader = tokio::spawn(reader.run());
    Replies::new(id, upstream_read, client_write, tag_rx, link, shared, stop)
        .run()
        .await;
    closed.cancel();
    // The upstream write half (if the reader kept it) is dropped only now,
    // after every reply in flight was read.
    let _ = reader.await;
    tracing::debug!(conn = id, "client connection closed");
}
