//! A proxy per test: routes on Redis keys under a random prefix, a mirror on
//! the test's own database, the server on an ephemeral port, and raw TCP
//! connections that read replies as exact bytes (the proxy's promise is
//! byte identity, so the tests never look through a client library).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use qbridge::config::{ProxyConfig, PushEnd, RouteConfig};
use qbridge::mirror::{Mirror, MirrorOptions};
use qbridge::model::formats::Format;
use qbridge::model::Phase;
use qbridge::proxy::frame::{Decoder, Limits};
use qbridge::proxy::{ProxyDeps, ProxyServer};
use qbridge::routes::Routes;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::support;

/// The shared Redis of the test machine.
pub const REDIS: &str = "127.0.0.1:6379";

/// How long a test waits for a reply before failing.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A random key prefix, so tests never touch each other's keys.
pub fn prefix() -> String {
    format!("qbt{}", uuid::Uuid::new_v4().simple())
}

/// A `json:/id` route on `key` to queue `name`.
pub fn route(name: &str, key: &str, phase: Phase) -> RouteConfig {
    RouteConfig {
        name: name.to_string(),
        redis_key: key.to_string(),
        db: 0,
        queue: name.to_string(),
        format: Format::json("/id").expect("valid pointer"),
        phase,
        push: PushEnd::Lpush,
        dedup_window: Duration::from_secs(86400),
        max_attempts: None,
        handler: None,
        redis_consumer: None,
        redis_side: qbridge::config::RedisSideKind::Fleet,
        keys: Default::default(),
        cutover: Default::default(),
    }
}

/// `[proxy]` with test defaults: upstream is the shared Redis.
pub fn proxy_config() -> ProxyConfig {
    ProxyConfig {
        enabled: true,
        listen: "127.0.0.1:0".into(),
        upstream: format!("redis://{REDIS}"),
        upstream_tls: Default::default(),
        max_bulk_len: 1 << 20,
        max_elements: 1024,
        max_clients: 64,
        mirror_buffer: 1 << 20,
        mirror_batch: 100,
        mirror_writers: 1,
        mirror_linger: qbridge::config::DEFAULT_MIRROR_LINGER,
        password: None,
    }
}

/// A running proxy and its mirror.
pub struct Harness {
    pub addr: SocketAddr,
    pub prefix: String,
    token: CancellationToken,
    server: JoinHandle<()>,
    _writers: JoinSet<()>,
}

/// Starts a proxy with `routes`, mirroring into `pool`.
pub async fn start(pool: &PgPool, prefix: &str, routes: Vec<RouteConfig>) -> Harness {
    start_with(pool, prefix, routes, proxy_config()).await
}

/// Like [`start`] with a given `[proxy]` config.
pub async fn start_with(
    pool: &PgPool,
    prefix: &str,
    routes: Vec<RouteConfig>,
    config: ProxyConfig,
) -> Harness {
    // One writer: a later push's job committing proves the earlier ones
    // were either written or never queued (the tests use it as a barrier).
    let (mirror, writers) = Mirror::start(
        pool.clone(),
        None,
        MirrorOptions {
            buffer_bytes: config.mirror_buffer,
            batch_items: config.mirror_batch,
            writers: 1,
            linger: config.mirror_linger,
            payload_limit: support::LIMIT,
        },
    );
    let deps = ProxyDeps {
        config,
        routes: Routes::from_config(&routes),
        mirror,
    };
    let server = ProxyServer::bind("127.0.0.1:0", deps)
        .await
        .expect("proxy binds");
    let addr = server.local_addr();
    let token = CancellationToken::new();
    let server = tokio::spawn(server.run(token.clone()));
    Harness {
        addr,
        prefix: prefix.to_string(),
        token,
        server,
        _writers: writers,
    }
}

impl Harness {
    /// A new raw connection through the proxy.
    pub async fn conn(&self) -> Raw {
        Raw::connect(&self.addr.to_string()).await
    }

    /// Cancels the server's token (shutdown begins); see [`Harness::stop`].
    pub fn cancel(&self) {
        self.token.cancel();
    }

    /// Whether the server's `run` has returned.
    pub fn finished(&self) -> bool {
        self.server.is_finished()
    }

    /// Stops the server and deletes the test's keys.
    pub async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.server)
            .await
            .expect("proxy drains in time")
            .expect("proxy task");
        let mut direct = Raw::connect(REDIS).await;
        direct
            .send(&cmd(&["EVAL", "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 0", "0", &format!("{}*", self.prefix)]))
            .await;
        direct.frames(1).await;
    }
}

/// A RESP command as bytes.
pub fn cmd<S: AsRef<[u8]>>(args: &[S]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A TCP connection that sends bytes and reads whole reply frames.
pub struct Raw {
    pub stream: TcpStream,
    buf: BytesMut,
}

impl Raw {
    pub async fn connect(addr: &str) -> Raw {
        let stream = TcpStream::connect(addr).await.expect("connects");
        stream.set_nodelay(true).expect("nodelay");
        Raw {
            stream,
            buf: BytesMut::new(),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("sends");
    }

    /// Sends one command and returns its single reply.
    pub async fn call<S: AsRef<[u8]>>(&mut self, args: &[S]) -> Vec<u8> {
        self.send(&cmd(args)).await;
        self.frames(1).await.remove(0)
    }

    /// Reads exactly `n` frames (panics after a timeout or on EOF).
    pub async fn frames(&mut self, n: usize) -> Vec<Vec<u8>> {
        let limits = Limits {
            max_bulk_len: usize::MAX,
            max_elements: usize::MAX,
            ..Limits::default()
        };
        let mut out = Vec::new();
        let mut decoder = Decoder::new(limits);
        while out.len() < n {
            if let Some(len) = decoder.frame_len(&self.buf).expect("valid RESP") {
                out.push(self.buf.split_to(len).to_vec());
                continue;
            }
            let read = tokio::time::timeout(REPLY_TIMEOUT, self.stream.read_buf(&mut self.buf))
                .await
                .unwrap_or_else(|_| {
                    panic!("no reply {} of {n} within {REPLY_TIMEOUT:?}", out.len() + 1)
                })
                .expect("reads");
            assert!(
                read > 0,
                "connection closed after {} of {n} replies",
                out.len()
            );
        }
        out
    }

    /// Reads until the other side closes; returns everything read.
    pub async fn until_closed(&mut self) -> Vec<u8> {
        loop {
            let read = tokio::time::timeout(REPLY_TIMEOUT, self.stream.read_buf(&mut self.buf))
                .await
                .expect("connection closes in time");
            match read {
                Ok(0) | Err(_) => return self.buf.split().to_vec(),
                Ok(_) => {}
            }
        }
    }

    /// Whether a reply is waiting or arrives within `within` (for "still
    /// blocked" checks only; never used to wait for something to happen).
    pub async fn has_data(&mut self, within: Duration) -> bool {
        if !self.buf.is_empty() {
            return true;
        }
        matches!(
            tokio::time::timeout(within, self.stream.read_buf(&mut self.buf)).await,
            Ok(Ok(n)) if n > 0
        )
    }
}

/// Redis's CLIENT LIST, read on a fresh direct connection.
pub async fn client_list() -> String {
    let mut direct = Raw::connect(REDIS).await;
    String::from_utf8_lossy(&direct.call(&["CLIENT", "LIST"]).await).to_string()
}

/// What qbridge stored for a queue, by key: each key of the ledger
/// (`job_keys`) with its copy and the bytes kept for it. A mirror copy the
/// proxy took in `dual_write` with shadow calls off has no `jobs` row
/// (`ingest::Item::ledger_only`), so the ledger, not `jobs`, is where every
/// routed push shows.
pub async fn jobs(pool: &PgPool, queue: &str) -> Vec<(String, String, Vec<u8>)> {
    sqlx::query_as(ORIGINALS_SQL)
        .bind(queue)
        .fetch_all(pool)
        .await
        .expect("jobs query")
}

/// The keys of a queue with their copy and bytes (a live copy's in its job
/// row, a mirror copy's in the ledger).
pub const ORIGINALS_SQL: &str = "SELECT k.key, k.copy, coalesce(j.original, k.original) \
     FROM qbridge.job_keys k LEFT JOIN qbridge.jobs j ON j.queue = k.queue AND j.key = k.key \
     WHERE k.queue = $1 ORDER BY k.key";

/// Waits until `queue` has `n` keys stored (see [`jobs`]).
pub async fn wait_for_jobs(pool: &PgPool, queue: &str, n: i64) {
    support::wait_for(
        &format!("{n} jobs on {queue}"),
        Duration::from_secs(10),
        || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM qbridge.job_keys WHERE queue = $1")
                .bind(queue)
                .fetch_one(pool)
                .await
                .expect("count")
                == n
        },
    )
    .await;
}

/// A JSON item with this id, as the `json:/id` routes read it.
pub fn item(id: &str) -> String {
    format!(r#"{{"id":"{id}","payload":"x\u00e9"}}"#)
}
