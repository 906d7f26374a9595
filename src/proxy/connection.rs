//! One client connection: its own upstream Redis connection (a 1:1 splice
//! over plain TCP or TLS, never shared, so blocking commands, MULTI, SELECT,
//! AUTH, HELLO and pub/sub keep Redis's per-connection meaning), a reader
//! task and the reply side, joined by a bounded channel of tags. Before the
//! splice starts, one PING learns whether the fresh upstream connection
//! needs AUTH (see `auth`).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::auth;
use super::link::{Link, Shared};
use super::reader::{Fence, Reader};
use super::replies::Replies;
use super::upstream::{Stream, Upstream};
use crate::metrics as m;

/// Commands read but not yet answered, per connection. Deep enough for any
/// sane pipeline; when full the reader stops reading that client.
const TAGS_IN_FLIGHT: usize = 1024;

/// How long a new connection waits for the upstream Redis.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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
    upstream: Arc<Upstream>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let _open = Open::new();
    let connected = match tokio::time::timeout(CONNECT_TIMEOUT, upstream.connect()).await {
        Ok(Ok(mut stream)) => match &mut stream {
            Stream::Plain(tcp) => probe(tcp).await,
            Stream::Tls(tls) => probe(&mut **tls).await,
        }
        .map(|(authed, server)| (stream, authed, server)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_string()),
    };
    let (upstream, authed, server) = match connected {
        Ok(connected) => connected,
        Err(reason) => {
            tracing::warn!(conn = id, error = %reason, "cannot reach the upstream Redis; refusing the client");
            // The client reads this as the answer to its first command.
            let mut client = client;
            let line = format!("-ERR qbridge: upstream Redis unavailable ({reason})\r\n");
            let _ = client.write_all(line.as_bytes()).await;
            let _ = client.shutdown().await;
            return;
        }
    };
    // Small request/reply exchanges: Nagle only adds delay (the upstream
    // side turned it off when it connected).
    let _ = client.set_nodelay(true);
    match upstream {
        Stream::Plain(tcp) => {
            let (read, write) = tcp.into_split();
            let link = Link::new(authed, server);
            splice(id, client, read, write, link, shared, stop).await;
        }
        Stream::Tls(tls) => {
            let (read, write) = tokio::io::split(*tls);
            let link = Link::new(authed, server);
            splice(id, client, read, write, link, shared, stop).await;
        }
    }
    tracing::debug!(conn = id, "client connection closed");
}

/// Whether the fresh upstream connection is authenticated, and (when it is)
/// which Redis server it reached.
async fn probe<S>(upstream: &mut S) -> Result<(bool, Option<Arc<str>>), String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let authed = auth::probe(upstream).await?;
    let server = match authed {
        true => auth::server_run(upstream).await,
        false => None,
    };
    Ok((authed, server))
}

/// Runs the reader and the reply side of one connection on the upstream's
/// halves. Generic rather than boxed, so the plain-TCP splice compiles to
/// the same code as before TLS existed.
async fn splice<R, W>(
    id: u64,
    client: TcpStream,
    upstream_read: R,
    upstream_write: W,
    link: Link,
    shared: Arc<Shared>,
    stop: CancellationToken,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (client_read, client_write) = client.into_split();
    let (tags, tag_rx) = mpsc::channel(TAGS_IN_FLIGHT);
    let closed = CancellationToken::new();
    let link = Arc::new(link);
    let reader = Reader {
        id,
        client: client_read,
        upstream: upstream_write,
        tags,
        selected: link.db.subscribe(),
        link: Arc::clone(&link),
        fence: Fence::default(),
        gate_passed: false,
        routed_in_multi: false,
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
}
