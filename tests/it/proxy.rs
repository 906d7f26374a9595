//! The RESP proxy against the real Redis and Postgres: replies byte-identical
//! to direct Redis, blocking commands, CLIENT REPLY, bad
//! input (here); pub/sub pairing (`pubsub`); routed pushes by phase, MULTI/EXEC and killed clients
//! (`phases`); routes matched by database and key (`select`); real client
//! libraries (`clients`); AUTH, ACL users and the proxy's password (`auth`);
//! the connection state as a property over random command sequences
//! (`state_props`).

mod auth;
mod clients;
pub(crate) mod harness;
mod phases;
mod pubsub;
mod select;
mod state_props;

use std::time::Duration;

use qbridge::model::Phase;
use sqlx::PgPool;

use harness::{cmd, item, Raw, REDIS};

/// The commands of the identity test, with `{p}` for the key prefix.
/// Every kind of reply: status, bulk, nil, integer, errors, arrays, and after
/// HELLO 3 maps, sets, doubles and RESP3 nulls; one command inline.
const PIPELINE: &[&[&str]] = &[
    &["SET", "{p}:k", "hello"],
    &["GET", "{p}:k"],
    &["GET", "{p}:missing"],
    &["INCR", "{p}:n"],
    &["INCR", "{p}:k"],
    &["LPUSH", "{p}:jobs", "@a1", "@a2"],
    &["LRANGE", "{p}:jobs", "0", "-1"],
    &["HSET", "{p}:h", "f1", "v1", "f2", "v2"],
    &["HGETALL", "{p}:h"],
    &["ZADD", "{p}:z", "1.5", "m"],
    &["ZSCORE", "{p}:z", "m"],
    &["SADD", "{p}:s", "x"],
    &["NOSUCHCOMMAND", "x"],
    &["INLINE PING"],
    &["HELLO", "3"],
    &["HGETALL", "{p}:h"],
    &["ZSCORE", "{p}:z", "m"],
    &["SMEMBERS", "{p}:s"],
    &["GET", "{p}:missing"],
    &["INCR", "{p}:k"],
    &["LPUSH", "{p}:jobs", "@a3"],
    &["EXISTS", "{p}:k", "{p}:missing"],
    &["HELLO", "2"],
    &["GET", "{p}:missing"],
];

fn pipeline(prefix: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for command in PIPELINE {
        if command[0] == "INLINE PING" {
            out.extend_from_slice(b"PING\r\n");
            continue;
        }
        let args: Vec<String> = command
            .iter()
            .map(|a| match a.strip_prefix('@') {
                Some(id) => item(id),
                None => a.replace("{p}", prefix),
            })
            .collect();
        out.extend_from_slice(&cmd(&args));
    }
    out
}

async fn run_pipeline(addr: &str, prefix: &str) -> Vec<Vec<u8>> {
    let mut conn = Raw::connect(addr).await;
    let keys: Vec<String> = ["k", "n", "jobs", "h", "z", "s"]
        .iter()
        .map(|k| format!("{prefix}:{k}"))
        .collect();
    let mut del = vec!["DEL".to_string()];
    del.extend(keys);
    conn.call(&del).await;
    conn.send(&pipeline(prefix)).await;
    conn.frames(PIPELINE.len()).await
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn pipelined_replies_are_byte_identical_to_direct_redis(pool: PgPool) {
    let prefix = harness::prefix();
    let proxy = harness::start(
        &pool,
        &prefix,
        vec![harness::route(
            "jobs",
            &format!("{prefix}:jobs"),
            Phase::DualWrite,
        )],
    )
    .await;
    let direct = run_pipeline(REDIS, &prefix).await;
    let proxied = run_pipeline(&proxy.addr.to_string(), &prefix).await;
    for (i, (d, p)) in direct.iter().zip(&proxied).enumerate() {
        if PIPELINE[i][0] == "HELLO" {
            // Same shape; the client id inside differs per connection.
            assert_eq!(d[0], p[0], "HELLO reply {i} changed type");
            continue;
        }
        assert_eq!(
            String::from_utf8_lossy(p),
            String::from_utf8_lossy(d),
            "reply {i} ({}) differs",
            PIPELINE[i][0]
        );
    }
    // The RESP3 replies really were RESP3, and errors passed through.
    assert_eq!(proxied[15][0], b'%');
    assert_eq!(proxied[16], b",1.5\r\n");
    assert_eq!(proxied[18], b"_\r\n");
    assert!(proxied[12].starts_with(b"-ERR unknown command"));
    // The routed pushes of the proxied run were mirrored, byte for byte.
    harness::wait_for_jobs(&pool, "jobs", 3).await;
    let jobs = harness::jobs(&pool, "jobs").await;
    let expected: Vec<(String, String, Vec<u8>)> = ["a1", "a2", "a3"]
        .iter()
        .map(|id| (id.to_string(), "mirror".to_string(), item(id).into_bytes()))
        .collect();
    assert_eq!(jobs, expected);
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn blpop_through_the_proxy_blocks_and_wakes(pool: PgPool) {
    let prefix = harness::prefix();
    let proxy = harness::start(&pool, &prefix, Vec::new()).await;
    let queue = format!("{prefix}:q");
    let name = format!("{prefix}blk");
    let mut conn = proxy.conn().await;
    assert_eq!(conn.call(&["CLIENT", "SETNAME", &name]).await, b"+OK\r\n");
    conn.send(&cmd(&["BLPOP", &queue, "0"])).await;
    // Redis itself reports the proxied connection blocked in BLPOP.
    crate::support::wait_for(
        "the upstream connection to block",
        Duration::from_secs(10),
        || async {
            harness::client_list()
                .await
                .lines()
                .any(|l| l.contains(&format!("name={name} ")) && l.contains("cmd=blpop"))
        },
    )
    .await;
    let mut direct = Raw::connect(REDIS).await;
    assert!(
        !conn.has_data(Duration::from_millis(50)).await,
        "BLPOP answered before a push"
    );
    assert_eq!(direct.call(&["RPUSH", &queue, "wake"]).await, b":1\r\n");
    let expected = format!("*2\r\n${}\r\n{queue}\r\n$4\r\nwake\r\n", queue.len());
    assert_eq!(conn.frames(1).await[0], expected.as_bytes());
    // Pairing goes on after the blocking command.
    assert_eq!(conn.call(&["PING"]).await, b"+PONG\r\n");
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn client_reply_skip_and_off_keep_pairing_and_still_mirror(pool: PgPool) {
    let prefix = harness::prefix();
    let jobs_key = format!("{prefix}:jobs");
    let proxy = harness::start(
        &pool,
        &prefix,
        vec![harness::route("jobs", &jobs_key, Phase::DualWrite)],
    )
    .await;
    let mut conn = proxy.conn().await;
    let mut pipeline = cmd(&["CLIENT", "REPLY", "SKIP"]);
    pipeline.extend(cmd(&["LPUSH", &jobs_key, &item("skipped")]));
    pipeline.extend(cmd(&["PING"]));
    pipeline.extend(cmd(&["CLIENT", "REPLY", "OFF"]));
    pipeline.extend(cmd(&["LPUSH", &jobs_key, &item("off")]));
    pipeline.extend(cmd(&["GET", "x"]));
    pipeline.extend(cmd(&["CLIENT", "REPLY", "ON"]));
    pipeline.extend(cmd(&["LPUSH", &jobs_key, &item("on")]));
    conn.send(&pipeline).await;
    assert_eq!(
        conn.frames(3).await,
        vec![
            b"+PONG\r\n".to_vec(),
            b"+OK\r\n".to_vec(),
            b":3\r\n".to_vec()
        ]
    );
    harness::wait_for_jobs(&pool, "jobs", 3).await;
    let keys: Vec<String> = harness::jobs(&pool, "jobs")
        .await
        .into_iter()
        .map(|j| j.0)
        .collect();
    assert_eq!(keys, ["off", "on", "skipped"]);
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn malformed_resp_closes_only_that_connection(pool: PgPool) {
    let prefix = harness::prefix();
    let proxy = harness::start(&pool, &prefix, Vec::new()).await;
    let mut other = proxy.conn().await;
    assert_eq!(other.call(&["PING"]).await, b"+PONG\r\n");
    let bad = b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n!bad\r\n";
    // Redis's own answer, for comparison: the reply before, then the error.
    let mut direct = Raw::connect(REDIS).await;
    direct.send(bad).await;
    let from_redis = direct.until_closed().await;
    let mut conn = proxy.conn().await;
    conn.send(bad).await;
    let from_proxy = conn.until_closed().await;
    assert_eq!(
        String::from_utf8_lossy(&from_proxy),
        "+PONG\r\n-ERR Protocol error: expected '$', got '!'\r\n"
    );
    assert_eq!(from_proxy, from_redis);
    // The other connection is untouched.
    assert_eq!(
        other.call(&["ECHO", "still here"]).await,
        b"$10\r\nstill here\r\n"
    );
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_over_limit_bulk_string_is_refused_before_it_arrives(pool: PgPool) {
    let prefix = harness::prefix();
    let key = format!("{prefix}:jobs");
    let mut config = harness::proxy_config();
    config.max_bulk_len = 1024;
    let proxy = harness::start_with(
        &pool,
        &prefix,
        vec![harness::route("jobs", &key, Phase::DualWrite)],
        config,
    )
    .await;
    let mut conn = proxy.conn().await;
    // Only the header of a 2000-byte argument: refused without the body.
    let header = format!("*3\r\n$5\r\nLPUSH\r\n${}\r\n{key}\r\n$2000\r\n", key.len());
    conn.send(header.as_bytes()).await;
    assert_eq!(
        conn.until_closed().await,
        b"-ERR Protocol error: invalid bulk length\r\n"
    );
    // A command at the limit still passes.
    let mut ok = proxy.conn().await;
    let big = format!(r#"{{"id":"big","pad":"{}"}}"#, "x".repeat(1000));
    assert_eq!(big.len(), 1021);
    assert_eq!(ok.call(&["LPUSH", &key, &big]).await, b":1\r\n");
    harness::wait_for_jobs(&pool, "jobs", 1).await;
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_unreachable_upstream_is_a_clear_startup_error(pool: PgPool) {
    let (mirror, _writers) = qbridge::mirror::Mirror::start(
        pool.clone(),
        None,
        qbridge::mirror::MirrorOptions {
            buffer_bytes: 1 << 20,
            batch_items: 10,
            writers: 1,
            linger: qbridge::config::DEFAULT_MIRROR_LINGER,
            payload_limit: crate::support::LIMIT,
        },
    );
    let mut config = harness::proxy_config();
    config.upstream = "redis://:s3cret@127.0.0.1:1".into();
    let deps = qbridge::proxy::ProxyDeps {
        config: config.clone(),
        routes: Default::default(),
        mirror: mirror.clone(),
    };
    let err = qbridge::proxy::ProxyServer::bind("127.0.0.1:0", deps)
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("upstream Redis at redis://:***@127.0.0.1:1 does not answer"),
        "{text}"
    );
    assert!(!text.contains("s3cret") && !text.contains('\n'), "{text}");

    // A taken port is named.
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    config.upstream = format!("redis://{REDIS}");
    let deps = qbridge::proxy::ProxyDeps {
        config,
        routes: Default::default(),
        mirror,
    };
    let err = qbridge::proxy::ProxyServer::bind(&addr, deps)
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains(&format!("cannot listen on {addr}")),
        "{err}"
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn max_clients_holds_extra_clients_until_a_slot_frees(pool: PgPool) {
    let prefix = harness::prefix();
    let mut config = harness::proxy_config();
    config.max_clients = 1;
    let proxy = harness::start_with(&pool, &prefix, Vec::new(), config).await;
    let mut first = proxy.conn().await;
    assert_eq!(first.call(&["PING"]).await, b"+PONG\r\n");
    // The second connection waits in the backlog: its PING is not served.
    let mut second = proxy.conn().await;
    second.send(&cmd(&["PING"])).await;
    assert!(
        !second.has_data(Duration::from_millis(200)).await,
        "a client over max_clients was served"
    );
    drop(first);
    assert_eq!(second.frames(1).await[0], b"+PONG\r\n");
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn shutdown_answers_commands_in_flight_then_closes(pool: PgPool) {
    let prefix = harness::prefix();
    let proxy = harness::start(&pool, &prefix, Vec::new()).await;
    let name = format!("{prefix}drain");
    let mut conn = proxy.conn().await;
    assert_eq!(conn.call(&["CLIENT", "SETNAME", &name]).await, b"+OK\r\n");
    let mut idle = proxy.conn().await;
    assert_eq!(idle.call(&["PING"]).await, b"+PONG\r\n");
    // A BLPOP that times out after a second is in flight at shutdown.
    conn.send(&cmd(&["BLPOP", &format!("{prefix}:empty"), "1"]))
        .await;
    crate::support::wait_for("the BLPOP to block", Duration::from_secs(10), || async {
        harness::client_list()
            .await
            .lines()
            .any(|l| l.contains(&format!("name={name} ")) && l.contains("cmd=blpop"))
    })
    .await;
    proxy.cancel();
    // Idle connections close at once; the BLPOP still gets its answer.
    assert_eq!(idle.until_closed().await, b"");
    assert_eq!(conn.until_closed().await, b"*-1\r\n");
    crate::support::wait_for("run() to return", Duration::from_secs(10), || async {
        proxy.finished()
    })
    .await;
    assert!(
        tokio::net::TcpStream::connect(proxy.addr).await.is_err(),
        "still accepting after shutdown"
    );
    proxy.stop().await;
}
