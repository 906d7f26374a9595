//! The proxy's listener: checks the upstream Redis at start-up (over TLS for
//! `rediss://`), accepts up to `max_clients` connections, and on shutdown
//! stops accepting, lets each connection answer what it already read, and
//! closes what is left after a deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::auth::{self, Gate};
use super::connection;
use super::frame::{Frame, Limits, DEPTH_CAP};
use super::link::Shared;
use super::pop_scripts::PopScripts;
use super::upstream::{Stream, Upstream};
use crate::config::tls::hint;
use crate::config::ProxyConfig;
use crate::error::ProxyError;
use crate::metrics as m;
use crate::mirror::Mirror;
use crate::redact::redact_url;
use crate::routes::Routes;

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
    /// The upstream Redis, with its TLS settings when `rediss://`.
    upstream: Arc<Upstream>,
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
    pub async fn bind(listen: &str, deps: ProxyDeps) -> crate::error::Result<ProxyServer> {
        let shown = redact_url(&deps.config.upstream);
        let upstream = Upstream::new(&deps.config.upstream, &shown, &deps.config.upstream_tls)?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| ProxyError::Listen {
                addr: listen.to_string(),
                reason: e.to_string(),
            })?;
        let local_addr = listener.local_addr()?;
        let needs_password = ping(&upstream, &deps.config.upstream)
            .await
            .map_err(|reason| ProxyError::UpstreamUnreachable {
                url: shown.clone(),
                reason,
            })?;
        let gate = deps.config.password.clone().map(|password| Gate {
            password,
            upstream: auth::url_credentials(&deps.config.upstream),
        });
        if gate.as_ref().is_some_and(|g| g.upstream.is_none()) && needs_password {
            return Err(ProxyError::UpstreamNeedsCredentials { url: shown }.into());
        }
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
        let pop_scripts = PopScripts::shared(deps.mirror.pool().clone());
        // What other proxies learned is known before the first client:
        // Postgres down is no reason not to proxy (a refresh follows).
        if let Err(e) = pop_scripts.refresh().await {
            tracing::warn!(error = %e, "cannot read the pop scripts other proxies learned; trying again every second");
        }
        let shared = Shared {
            gate,
            routes: deps.routes,
            mirror: deps.mirror,
            limits,
            reply_limits,
            commands: metrics::counter!(m::PROXY_COMMANDS),
            latency: metrics::histogram!(m::PROXY_ADDED_LATENCY),
            protocol_errors: metrics::counter!(m::PROXY_PROTOCOL_ERRORS),
            pop_scripts,
        };
        Ok(ProxyServer {
            listener,
            local_addr,
            upstream: Arc::new(upstream),
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
        let refresh = {
            let (shared, stop) = (Arc::clone(&self.shared), token.clone());
            tokio::spawn(async move { shared.pop_scripts.keep_refreshed(stop).await })
        };
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
        // A last store of what was learned (bounded like the drain).
        refresh.abort();
        let _ = tokio::time::timeout(PING_TIMEOUT, self.shared.pop_scripts.refresh()).await;
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

/// Checks that Redis answers at `upstream`, authenticating with the URL's
/// credentials when it has some, and says whether Redis still wants a
/// password after that. `-NOAUTH` counts as an answer: clients bring their
/// own AUTH through the splice (unless the proxy has a password of its own).
/// A TLS failure says what to check.
async fn ping(upstream: &Upstream, url: &str) -> Result<bool, String> {
    let check = async {
        let conn = upstream.connect().await.map_err(|e| {
            let reason = e.to_string();
            let hint = hint(&reason, "[proxy] upstream_ca_file");
            format!("{reason}{hint}")
        })?;
        match conn {
            Stream::Plain(tcp) => ping_on(tcp, url).await,
            Stream::Tls(tls) => ping_on(*tls, url).await,
        }
    };
    tokio::time::timeout(PING_TIMEOUT, check)
        .await
        .map_err(|_| format!("no answer within {PING_TIMEOUT:?}"))?
}

/// AUTH (when the URL has a password) and the probe on one open connection.
async fn ping_on<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    url: &str,
) -> Result<bool, String> {
    if let Some((user, password)) = auth::url_credentials(url) {
        conn.write_all(&auth::encode(&[
            Bytes::from_static(b"AUTH"),
            user,
            password,
        ]))
        .await
        .map_err(|e| e.to_string())?;
        if let Frame::Error(e) = auth::read_reply(&mut conn).await? {
            return Err(format!("AUTH failed: {}", String::from_utf8_lossy(&e)));
        }
    }
    auth::probe(&mut conn).await.map(|authed| !authed)
}
