//! The proxy's listener: checks the upstream Redis at start-up, accepts up to
//! `max_clients` connections, and on shutdown stops accepting, lets each
//! connection answer what it already read, and closes what is left after a
//! deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::connection::{self, Shared};
use super::error::ProxyError;
use super::frame::{self, Frame, Limits, DEPTH_CAP};
use crate::config::ProxyConfig;
use crate::metrics as m;
use crate::redact::redact_url;
use crate::redis::mirror::Mirror;
use crate::redis::routes::Routes;

/// How long the start-up check waits for the upstream Redis.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// How long shutdown waits for connections to answer what they read.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// What the proxy needs from the rest of the process.
#[derive(Clone)]
pub struct ProxyDeps {
    /// `[proxy]`: the upstream URL, client limits, `max_clients`.
    pub config: ProxyConfig,
    /// The routes and their phases (the cutover watch updates them live).
    pub routes: Routes,
    /// The Postgres writer for mirror and live copies.
    pub mirror: Mirror,
}

/// A bound, checked proxy, ready to [`run`](ProxyServer::run).
pub struct ProxyServer {
    listener: TcpListener,
    local_addr: SocketAddr,
    /// `host:port` of the upstream Redis.
    upstream: Arc<str>,
    /// The upstream URL with its password redacted, for logs.
    upstream_shown: String,
    max_clients: usize,
    drain_timeout: Duration,
    shared: Arc<Shared>,
}

impl ProxyServer {
    /// Listens on `listen` and checks that the upstream Redis of
    /// `deps.config.upstream` answers a PING. Errors are one line naming
    /// the address; passwords are redacted.
    pub async fn bind(listen: &str, deps: ProxyDeps) -> crate::Result<ProxyServer> {
        let shown = redact_url(&deps.config.upstream);
        let upstream = upstream_addr(&deps.config.upstream, &shown)?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| ProxyError::Listen {
                addr: listen.to_string(),
                reason: e.to_string(),
            })?;
        let local_addr = listener.local_addr()?;
        ping(&upstream, &deps.config.upstream)
            .await
            .map_err(|reason| ProxyError::UpstreamUnreachable {
                url: shown.clone(),
                reason,
            })?;
        let limits = Limits {
            max_bulk_len: deps.config.max_bulk_len,
            max_elements: deps.config.max_elements,
            ..Limits::default()
        };
        let reply_limits = Limits {
            max_bulk_len: usize::MAX,
            max_elements: usize::MAX,
            max_depth: DEPTH_CAP,
            max_inline_len: 512 << 20,
        };
        let shared = Shared {
            routes: deps.routes,
            mirror: deps.mirror,
            limits,
            reply_limits,
            commands: metrics::counter!(m::PROXY_COMMANDS),
            latency: metrics::histogram!(m::PROXY_ADDED_LATENCY),
            protocol_errors: metrics::counter!(m::PROXY_PROTOCOL_ERRORS),
        };
        Ok(ProxyServer {
            listener,
            local_addr,
            upstream: upstream.into(),
            upstream_shown: shown,
            max_clients: deps.config.max_clients.max(1),
            drain_timeout: DRAIN_TIMEOUT,
            shared: Arc::new(shared),
        })
    }

    /// The address it listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// How long [`run`](ProxyServer::run) waits, once cancelled, for
    /// connections to answer what they already read (default 10 s).
    pub fn with_drain_timeout(mut self, timeout: Duration) -> ProxyServer {
        self.drain_timeout = timeout;
        self
    }

    /// Serves clients until `token` is cancelled, then drains (see the
    /// module docs) and returns.
    pub async fn run(self, token: CancellationToken) {
        tracing::info!(listen = %self.local_addr, upstream = %self.upstream_shown, "RESP proxy listening");
        let slots = Arc::new(Semaphore::new(self.max_clients));
        let mut conns = JoinSet::new();
        let mut next_id = 0u64;
        loop {
            // A slot first: clients beyond max_clients wait in the backlog.
            let permit = tokio::select! {
                biased;
                _ = token.cancelled() => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => continue,
                permit = Arc::clone(&slots).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
            };
            let stream = tokio::select! {
                biased;
                _ = token.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _peer)) => stream,
                    Err(e) => {
                        // Out of file descriptors, usually: back off briefly
                        // instead of spinning.
                        tracing::warn!(error = %e, "proxy accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            next_id += 1;
            let (upstream, shared, stop) = (
                Arc::clone(&self.upstream),
                Arc::clone(&self.shared),
                token.clone(),
            );
            conns.spawn(async move {
                let _permit = permit;
                connection::serve(next_id, stream, upstream, shared, stop).await;
            });
        }
        drop(self.listener);
        drain(conns, self.drain_timeout).await;
    }
}

/// Waits for the connections to finish, up to `timeout`, then aborts the rest.
async fn drain(mut conns: JoinSet<()>, timeout: Duration) {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => {
                tracing::warn!(open = conns.len(), "proxy drain deadline passed; closing the remaining connections");
                conns.abort_all();
                while conns.join_next().await.is_some() {}
                return;
            }
            joined = conns.join_next() => if joined.is_none() {
                return;
            },
        }
    }
}

/// `host:port` of a `redis://` URL (port 6379 unless given).
fn upstream_addr(url: &str, shown: &str) -> Result<String, ProxyError> {
    let bad = |reason: &str| ProxyError::UpstreamUrl {
        url: shown.to_string(),
        reason: reason.to_string(),
    };
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    match parsed.scheme() {
        "redis" => {}
        "rediss" => {
            return Err(ProxyError::UpstreamTls {
                url: shown.to_string(),
            })
        }
        _ => return Err(bad("must start with redis://")),
    }
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad("has no host"))?;
    Ok(format!("{host}:{}", parsed.port().unwrap_or(6379)))
}

/// Checks that Redis answers at `addr`, authenticating with the URL's
/// credentials when it has some. `-NOAUTH` counts as an answer: clients
/// bring their own AUTH through the splice.
async fn ping(addr: &str, url: &str) -> Result<(), String> {
    let check = async {
        let mut conn = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let parsed = url::Url::parse(url).map_err(|e| e.to_string())?;
        if let Some(password) = parsed.password() {
            let user = match parsed.username() {
                "" => "default",
                user => user,
            };
            let user = percent_decode(user);
            let password = percent_decode(password);
            conn.write_all(&command(&[b"AUTH", &user, &password]))
                .await
                .map_err(|e| e.to_string())?;
            if let Frame::Error(e) = reply(&mut conn).await? {
                return Err(format!("AUTH failed: {}", String::from_utf8_lossy(&e)));
            }
        }
        conn.write_all(&command(&[b"PING"]))
            .await
            .map_err(|e| e.to_string())?;
        match reply(&mut conn).await? {
            Frame::Simple(s) if s.as_ref() == b"PONG" => Ok(()),
            Frame::Error(e) if e.starts_with(b"NOAUTH") => Ok(()),
            Frame::Error(e) => Err(format!("PING answered: {}", String::from_utf8_lossy(&e))),
            _ => Err("PING answered something other than PONG".to_string()),
        }
    };
    tokio::time::timeout(PING_TIMEOUT, check)
        .await
        .map_err(|_| format!("no answer within {PING_TIMEOUT:?}"))?
}

/// URL user info is percent-encoded; Redis wants the raw bytes.
fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let hex = |b: u8| {
        char::from(b)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&hi), Some(&lo)) => hex(hi).zip(hex(lo)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        match decoded {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

fn command(args: &[&[u8]]) -> Vec<u8> {
    let frame = Frame::Array(
        args.iter()
            .map(|a| Frame::Bulk(bytes::Bytes::copy_from_slice(a)))
            .collect(),
    );
    frame.to_bytes()
}

async fn reply(conn: &mut TcpStream) -> Result<Frame, String> {
    let mut buf = BytesMut::with_capacity(512);
    loop {
        if let Some((frame, _)) =
            frame::parse(&buf, &Limits::default()).map_err(|e| e.to_string())?
        {
            return Ok(frame);
        }
        if conn.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("connection closed".to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        assert_eq!(upstream_addr("redis://h", "").unwrap(), "h:6379");
        assert_eq!(upstream_addr("redis://:pw@h:7000/2", "").unwrap(), "h:7000");
        assert_eq!(
            upstream_addr("redis://[::1]:7000", "").unwrap(),
            "[::1]:7000"
        );
        let tls = upstream_addr("rediss://u:secret@h", "rediss://u:***@h").unwrap_err();
        assert!(
            tls.to_string().contains("TLS to the upstream comes later"),
            "{tls}"
        );
        assert!(!tls.to_string().contains("secret"));
    }

    #[test]
    fn passwords_are_percent_decoded() {
        assert_eq!(percent_decode("a%2Bb+c%"), b"a+b+c%");
    }
}
