//! Oversized input through the real binary: `qbridge proxy` (RESP proxy and
//! HTTP enqueue in one process) is sent a 100 MiB bulk string, a push with
//! one element too many, a large accepted push, a 10 MiB payload and a
//! 100 MiB body. Each must be refused (or taken) without the process's peak
//! resident memory (VmHWM) passing a stated bound, while other clients keep
//! working and nothing stored before changes.

use std::process::Stdio;
use std::time::Duration;

use redis::AsyncCommands;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support;

const MIB: u64 = 1024 * 1024;

/// A running `qbridge proxy` with one `dual_write` route on a raw list.
struct Proxy {
    child: tokio::process::Child,
    resp: String,
    http: String,
    key: String,
    queue: String,
    _config: tempfile::NamedTempFile,
}

impl Proxy {
    async fn start(pool: &PgPool, proxy_extra: &str) -> Proxy {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
        let (resp_port, http_port) = (crate::servers::free_port(), crate::servers::free_port());
        let (key, queue) = (format!("qbt:{id}:big"), format!("big{id}"));
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            config.path(),
            format!(
                "redis_url = \"redis://127.0.0.1:6379\"\n\
                 [http]\nlisten = \"127.0.0.1:{http_port}\"\n\
                 [proxy]\nenabled = true\nlisten = \"127.0.0.1:{resp_port}\"\n\
                 upstream = \"redis://127.0.0.1:6379\"\n{proxy_extra}\n\
                 [[routes]]\nname = \"{queue}\"\nredis_key = \"{key}\"\nqueue = \"{queue}\"\n\
                 format = \"raw\"\nphase = \"dual_write\"\n"
            ),
        )
        .unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
            .args([
                "proxy",
                "--database-url",
                &support::db_url(pool),
                "--config",
            ])
            .arg(config.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("qbridge proxy starts");
        let proxy = Proxy {
            child,
            resp: format!("127.0.0.1:{resp_port}"),
            http: format!("http://127.0.0.1:{http_port}"),
            key,
            queue,
            _config: config,
        };
        let client = reqwest::Client::new();
        support::wait_for("proxy and http up", Duration::from_secs(60), || async {
            TcpStream::connect(&proxy.resp).await.is_ok()
                && client
                    .get(format!("{}/livez", proxy.http))
                    .send()
                    .await
                    .is_ok()
        })
        .await;
        proxy
    }

    /// Peak resident memory of the process so far, in MiB.
    fn peak_mib(&self) -> u64 {
        let pid = self.child.id().expect("running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmHWM in /proc/<pid>/status");
        kb / 1024
    }

    async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open("redis://127.0.0.1:6379")
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// One LPUSH through the proxy on a fresh connection; the raw reply.
    async fn lpush(&self, items: &[&str]) -> Vec<u8> {
        let mut args = vec!["LPUSH", self.key.as_str()];
        args.extend_from_slice(items);
        let mut conn = TcpStream::connect(&self.resp).await.unwrap();
        conn.write_all(&command(&args)).await.unwrap();
        read_line(&mut conn).await
    }

    /// Keys stored for the route: the ledger (a push in dual_write is a
    /// ledger-only mirror copy, with no jobs row).
    async fn jobs(&self, pool: &PgPool) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM qbridge.job_keys WHERE queue = $1")
            .bind(&self.queue)
            .fetch_one(pool)
            .await
            .unwrap()
    }

    async fn stop(mut self) {
        let mut redis = self.redis().await;
        let _: () = redis.del(&self.key).await.unwrap();
        let _ = self.child.kill().await;
    }
}

fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Reads up to the first LF (a RESP reply line, or an HTTP status line),
/// or what arrived before the connection closed.
async fn read_line(conn: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while tokio::time::timeout(Duration::from_secs(60), conn.read(&mut byte))
        .await
        .expect("a reply within a minute")
        .unwrap_or(0)
        == 1
    {
        out.push(byte[0]);
        if byte[0] == b'\n' {
            break;
        }
    }
    out
}

/// Writes `total` bytes of `fill` after `head`, stopping quietly when the
/// server closes the connection (which is the point).
async fn stream(conn: &mut TcpStream, head: &[u8], total: u64) -> u64 {
    if conn.write_all(head).await.is_err() {
        return 0;
    }
    let chunk = vec![b'x'; MIB as usize];
    let mut sent = 0;
    while sent < total {
        let n = chunk.len().min((total - sent) as usize);
        if conn.write_all(&chunk[..n]).await.is_err() {
            break;
        }
        sent += n as u64;
    }
    sent
}

/// Stored before the attack, checked after it.
async fn store_two(proxy: &Proxy, pool: &PgPool) {
    assert_eq!(proxy.lpush(&["keep-1", "keep-2"]).await, b":2\r\n");
    let queue = proxy.queue.clone();
    support::wait_for_count(
        pool,
        "the two items mirrored",
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{queue}'"),
        2,
    )
    .await;
}

async fn list(proxy: &Proxy) -> Vec<String> {
    proxy.redis().await.lrange(&proxy.key, 0, -1).await.unwrap()
}

/// The proxy's resident memory stays under this through every RESP case; a
/// buffered 100 MiB argument could not.
const RESP_BOUND_MIB: u64 = 64;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_100_mib_bulk_string_is_refused_before_it_is_buffered(pool: PgPool) {
    let proxy = Proxy::start(&pool, "").await;
    store_two(&proxy, &pool).await;
    let before = proxy.peak_mib();

    let mut attacker = TcpStream::connect(&proxy.resp).await.unwrap();
    let head = format!(
        "*3\r\n$5\r\nLPUSH\r\n${}\r\n{}\r\n${}\r\n",
        proxy.key.len(),
        proxy.key,
        100 * MIB
    );
    let sent = stream(&mut attacker, head.as_bytes(), 100 * MIB).await;
    assert_eq!(
        read_line(&mut attacker).await,
        b"-ERR Protocol error: invalid bulk length\r\n"
    );
    // Only that connection failed: another client pushes as before.
    assert_eq!(proxy.lpush(&["after"]).await, b":3\r\n");
    assert_eq!(list(&proxy).await, ["after", "keep-2", "keep-1"]);
    support::wait_for_count(
        &pool,
        "the later push mirrored",
        &format!(
            "SELECT count(*) FROM qbridge.job_keys WHERE queue = '{}'",
            proxy.queue
        ),
        3,
    )
    .await;
    let peak = proxy.peak_mib();
    eprintln!("100 MiB bulk: VmHWM {before} MiB before, {peak} MiB after ({sent} bytes accepted by the socket)");
    assert!(peak < RESP_BOUND_MIB, "VmHWM {peak} MiB");
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_push_one_element_over_the_limit_is_refused_and_a_large_one_mirrored_in_full(
    pool: PgPool,
) {
    // A mirror buffer much smaller than the accepted push below: one
    // command bigger than the whole buffer must still get through.
    let proxy = Proxy::start(&pool, "mirror_buffer = \"1MiB\"").await;
    store_two(&proxy, &pool).await;

    // LPUSH, the key and 1,048,575 items: 1,048,577 elements, one over.
    let mut attacker = TcpStream::connect(&proxy.resp).await.unwrap();
    let head = b"*1048577\r\n$5\r\nLPUSH\r\n";
    attacker.write_all(head).await.unwrap();
    assert_eq!(
        read_line(&mut attacker).await,
        b"-ERR Protocol error: invalid multibulk length\r\n"
    );
    assert_eq!(list(&proxy).await, ["keep-2", "keep-1"]);

    // 100,000 items in one LPUSH (1.8 MB on the wire, ~7 MB of mirror
    // budget). Before the mirror stored a request in chunks, 200,000 items
    // took this process to 605 MiB.
    const N: usize = 100_000;
    let items: Vec<String> = (0..N).map(|i| format!("item-{i:07}")).collect();
    let mut args = vec!["LPUSH", proxy.key.as_str()];
    args.extend(items.iter().map(String::as_str));
    let mut conn = TcpStream::connect(&proxy.resp).await.unwrap();
    conn.write_all(&command(&args)).await.unwrap();
    assert_eq!(
        read_line(&mut conn).await,
        format!(":{}\r\n", N + 2).into_bytes()
    );
    support::wait_for("every item mirrored", Duration::from_secs(300), || async {
        proxy.jobs(&pool).await == (N + 2) as i64
    })
    .await;
    let distinct: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT key) FROM qbridge.job_keys WHERE queue = $1")
            .bind(&proxy.queue)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(distinct, (N + 2) as i64);
    let peak = proxy.peak_mib();
    eprintln!("100,000-item push with a 1 MiB mirror buffer: VmHWM {peak} MiB");
    assert!(peak < 2 * RESP_BOUND_MIB, "VmHWM {peak} MiB");
    proxy.stop().await;
}

/// HTTP bodies: `max_body` is 16 MiB and `payload_limit` 1 MiB by default.
const HTTP_BOUND_MIB: u64 = 96;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn oversized_http_payloads_and_bodies_are_refused_with_bounded_memory(pool: PgPool) {
    let proxy = Proxy::start(&pool, "").await;
    let url = format!("{}/v1/queues/plain/jobs", proxy.http);
    let client = reqwest::Client::new();
    let resp = client
        .post(&url)
        .header("content-type", "application/json")
        .body(r#"{"payload": {"keep": true}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);

    // A 10 MiB payload in a body under max_body: 413, one line, nothing stored.
    let body = format!(r#"{{"payload": "{}"}}"#, "p".repeat(10 * MIB as usize));
    let resp = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let error = resp.json::<serde_json::Value>().await.unwrap()["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        error.starts_with("job 1: payload") && !error.contains('\n') && !error.contains("ppp"),
        "{error}"
    );

    // A 100 MiB body: refused by max_body when its length is announced,
    // before it is read.
    let mut conn = TcpStream::connect(proxy.http.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "POST /v1/queues/plain/jobs HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        100 * MIB
    );
    let sent = stream(&mut conn, head.as_bytes(), 100 * MIB).await;
    let status = read_line(&mut conn).await;
    assert!(
        status.starts_with(b"HTTP/1.1 413"),
        "{:?}",
        String::from_utf8_lossy(&status)
    );

    let rows: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT payload FROM qbridge.jobs WHERE queue = 'plain'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows, vec![serde_json::json!({"keep": true})]);
    let peak = proxy.peak_mib();
    eprintln!("10 MiB payload and 100 MiB body: VmHWM {peak} MiB ({sent} body bytes accepted by the socket)");
    assert!(peak < HTTP_BOUND_MIB, "VmHWM {peak} MiB");
    proxy.stop().await;
}
