//! Authentication through the proxy, against a throwaway redis-server with
//! `--requirepass` and an ACL user: Redis's AUTH/HELLO/ACL decide through the
//! splice (refused pushes are never mirrored), a push the proxy answers
//! itself in `postgres_only` needs an authenticated connection, and the
//! proxy's own password gates everything before it.

use std::time::Duration;

use qbridge::config::ProxyConfig;
use qbridge::mirror::{Mirror, MirrorOptions};
use qbridge::model::Phase;
use qbridge::proxy::{ProxyDeps, ProxyServer};
use qbridge::routes::Routes;
use qbridge::secret::Secret;
use sqlx::PgPool;

use super::harness::{self, cmd, item, Harness, Raw};
use crate::servers::ThrowawayRedis;
use crate::support;

pub(super) const REDIS_PW: &str = "upstream-pw-51c0";
pub(super) const ALICE_PW: &str = "alice-pw-7d2e";
const PROXY_PW: &str = "proxy-own-password-93ab";

/// A redis-server that wants a password, with user `alice` allowed only
/// the keys `<prefix>:jobs*`.
pub(super) async fn locked_redis(prefix: &str) -> ThrowawayRedis {
    let redis = ThrowawayRedis::start_with(&["--requirepass", REDIS_PW]);
    let mut admin = Raw::connect(&format!("127.0.0.1:{}", redis.port)).await;
    assert_eq!(admin.call(&["AUTH", REDIS_PW]).await, b"+OK\r\n");
    let keys = format!("~{prefix}:jobs*");
    let pw = format!(">{ALICE_PW}");
    let set = admin
        .call(&["ACL", "SETUSER", "alice", "on", &pw, &keys, "+@all"])
        .await;
    assert_eq!(set, b"+OK\r\n");
    redis
}

pub(super) fn config(upstream: String, password: Option<&str>) -> ProxyConfig {
    ProxyConfig {
        upstream,
        password: password.map(|p| Secret::new("proxy password", p).unwrap()),
        ..harness::proxy_config()
    }
}

/// Routes `jobs` (alice may push) and `secret` (she may not), both in `phase`.
pub(super) fn routes(prefix: &str, phase: Phase) -> Vec<qbridge::config::RouteConfig> {
    vec![
        harness::route("jobs", &format!("{prefix}:jobs"), phase),
        harness::route("secret", &format!("{prefix}:secret"), phase),
    ]
}

async fn job_count(pool: &PgPool) -> i64 {
    // Every key stored, a ledger-only mirror copy included.
    support::count(pool, "SELECT count(*) FROM qbridge.job_keys").await
}

/// A direct connection's reply to `args` (what Redis itself says).
async fn direct(redis: &ThrowawayRedis, args: &[&str]) -> Vec<u8> {
    let mut conn = Raw::connect(&format!("127.0.0.1:{}", redis.port)).await;
    conn.call(args).await
}

/// `item(id)` pushed on `key` as one LPUSH command.
fn push(key: &str, id: &str) -> Vec<u8> {
    cmd(&["LPUSH", key, &item(id)])
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn redis_auth_and_acls_decide_through_the_splice(pool: PgPool) {
    let prefix = harness::prefix();
    let redis = locked_redis(&prefix).await;
    let proxy = harness::start_with(
        &pool,
        &prefix,
        routes(&prefix, Phase::DualWrite),
        config(redis.url(), None),
    )
    .await;
    let (jobs, secret) = (format!("{prefix}:jobs"), format!("{prefix}:secret"));

    // Unauthenticated: Redis's own NOAUTH, and nothing mirrored.
    let mut conn = proxy.conn().await;
    let refused = conn.call(&["LPUSH", &jobs, &item("anon")]).await;
    assert_eq!(refused, b"-NOAUTH Authentication required.\r\n");
    let wrong = conn.call(&["AUTH", "not-the-password"]).await;
    assert_eq!(wrong, direct(&redis, &["AUTH", "not-the-password"]).await);
    assert!(wrong.starts_with(b"-WRONGPASS"), "{wrong:?}");
    assert_eq!(conn.call(&["AUTH", REDIS_PW]).await, b"+OK\r\n");
    assert_eq!(conn.call(&["LPUSH", &jobs, &item("pw")]).await, b":1\r\n");

    // An ACL user: allowed on `jobs`, NOPERM on `secret` (not mirrored).
    let mut alice = proxy.conn().await;
    assert_eq!(alice.call(&["AUTH", "alice", ALICE_PW]).await, b"+OK\r\n");
    assert_eq!(
        alice.call(&["LPUSH", &jobs, &item("alice")]).await,
        b":2\r\n"
    );
    let denied = alice.call(&["LPUSH", &secret, &item("denied")]).await;
    assert!(
        denied.starts_with(b"-NOPERM"),
        "{:?}",
        String::from_utf8_lossy(&denied)
    );

    // HELLO 3 AUTH user pass: RESP3 from then on.
    let mut hello = proxy.conn().await;
    let map = hello.call(&["HELLO", "3", "AUTH", "alice", ALICE_PW]).await;
    assert_eq!(map[0], b'%', "{:?}", String::from_utf8_lossy(&map));
    assert_eq!(
        hello.call(&["LPUSH", &jobs, &item("hello")]).await,
        b":3\r\n"
    );

    // Exactly the three pushes Redis took became mirror copies.
    harness::wait_for_jobs(&pool, "jobs", 3).await;
    let keys: Vec<String> = harness::jobs(&pool, "jobs")
        .await
        .into_iter()
        .map(|(key, copy, _)| {
            assert_eq!(copy, "mirror");
            key
        })
        .collect();
    assert_eq!(keys, ["alice", "hello", "pw"]);
    assert_eq!(job_count(&pool).await, 3, "nothing else was mirrored");
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn postgres_only_pushes_need_an_authenticated_connection(pool: PgPool) {
    let prefix = harness::prefix();
    let redis = locked_redis(&prefix).await;
    let proxy = harness::start_with(
        &pool,
        &prefix,
        routes(&prefix, Phase::PostgresOnly),
        config(redis.url(), None),
    )
    .await;
    let (jobs, secret) = (format!("{prefix}:jobs"), format!("{prefix}:secret"));
    let noauth = direct(&redis, &["LPUSH", &jobs, "x"]).await;
    assert_eq!(noauth, b"-NOAUTH Authentication required.\r\n");

    // Never forwarded, so the proxy refuses in Redis's words.
    let mut conn = proxy.conn().await;
    assert_eq!(conn.call(&["LPUSH", &jobs, &item("anon")]).await, noauth);
    // Pipelined behind a wrong AUTH: the push waits for Redis's verdict.
    let mut pipeline = cmd(&["AUTH", "not-the-password"]);
    pipeline.extend(push(&jobs, "after-wrong"));
    conn.send(&pipeline).await;
    let replies = conn.frames(2).await;
    assert!(replies[0].starts_with(b"-WRONGPASS"), "{replies:?}");
    assert_eq!(replies[1], noauth);
    assert_eq!(
        job_count(&pool).await,
        0,
        "no unauthenticated push was stored"
    );

    // Behind a right AUTH in the same pipeline: stored, as a live copy.
    let mut pipeline = cmd(&["AUTH", REDIS_PW]);
    pipeline.extend(push(&jobs, "authed"));
    pipeline.extend(cmd(&["RESET"]));
    pipeline.extend(push(&jobs, "after-reset"));
    conn.send(&pipeline).await;
    let replies = conn.frames(4).await;
    assert_eq!(replies[0], b"+OK\r\n");
    assert_eq!(replies[1], b":1\r\n");
    assert_eq!(replies[2], b"+RESET\r\n");
    assert_eq!(replies[3], noauth, "RESET logged the connection out");

    // HELLO 3 AUTH as alice. Her ACL denies `secret`, but the proxy cannot
    // check key permissions for a push Redis never sees: it is stored (the
    // documented limit; Redis refuses it in dual_write and shadow).
    let mut alice = proxy.conn().await;
    let map = alice.call(&["HELLO", "3", "AUTH", "alice", ALICE_PW]).await;
    assert_eq!(map[0], b'%');
    assert_eq!(
        alice.call(&["LPUSH", &jobs, &item("alice")]).await,
        b":1\r\n"
    );
    assert_eq!(
        alice.call(&["LPUSH", &secret, &item("acl-limit")]).await,
        b":1\r\n"
    );

    harness::wait_for_jobs(&pool, "jobs", 2).await;
    let keys: Vec<(String, String)> = harness::jobs(&pool, "jobs")
        .await
        .into_iter()
        .map(|(key, copy, _)| (key, copy))
        .collect();
    assert_eq!(
        keys,
        [
            ("alice".into(), "live".into()),
            ("authed".into(), "live".into())
        ]
    );
    assert_eq!(job_count(&pool).await, 3);
    proxy.stop().await;
}

/// Checks that a connection through the proxy is refused everything but
/// AUTH until it sends the proxy's password, then authenticates it with it.
async fn refused_until_the_proxy_password(proxy: &Harness, jobs: &str) -> Raw {
    let mut conn = proxy.conn().await;
    let noauth = b"-NOAUTH Authentication required.\r\n".to_vec();
    assert_eq!(conn.call(&["GET", "k"]).await, noauth);
    assert_eq!(conn.call(&["LPUSH", jobs, &item("anon")]).await, noauth);
    conn.send(b"PING\r\n").await;
    assert_eq!(conn.frames(1).await[0], noauth, "inline commands too");
    for wrong in [vec!["AUTH", REDIS_PW], vec!["AUTH", "alice", PROXY_PW]] {
        let reply = conn.call(&wrong).await;
        assert_eq!(
            reply,
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
        );
    }
    assert_eq!(conn.call(&["AUTH", "default", PROXY_PW]).await, b"+OK\r\n");
    conn
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_proxy_password_gates_everything_and_the_url_authenticates_upstream(pool: PgPool) {
    let prefix = harness::prefix();
    let redis = locked_redis(&prefix).await;
    let upstream = format!("redis://:{REDIS_PW}@127.0.0.1:{}", redis.port);
    let proxy = harness::start_with(
        &pool,
        &prefix,
        routes(&prefix, Phase::DualWrite),
        config(upstream, Some(PROXY_PW)),
    )
    .await;
    let jobs = format!("{prefix}:jobs");
    let mut conn = refused_until_the_proxy_password(&proxy, &jobs).await;
    assert_eq!(conn.call(&["LPUSH", &jobs, &item("a")]).await, b":1\r\n");
    // RESET logs out of the proxy (and Redis); AUTH again works.
    assert_eq!(conn.call(&["RESET"]).await, b"+RESET\r\n");
    assert_eq!(
        conn.call(&["GET", "k"]).await,
        b"-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(conn.call(&["AUTH", PROXY_PW]).await, b"+OK\r\n");
    assert_eq!(conn.call(&["LPUSH", &jobs, &item("b")]).await, b":2\r\n");
    // HELLO 3 AUTH default <proxy password> [SETNAME]: RESP3, named.
    let mut hello = proxy.conn().await;
    let map = hello
        .call(&["HELLO", "3", "AUTH", "default", PROXY_PW, "SETNAME", "p1"])
        .await;
    assert_eq!(map[0], b'%', "{:?}", String::from_utf8_lossy(&map));
    assert_eq!(hello.call(&["CLIENT", "GETNAME"]).await, b"$2\r\np1\r\n");
    assert_eq!(hello.call(&["LPUSH", &jobs, &item("c")]).await, b":3\r\n");
    harness::wait_for_jobs(&pool, "jobs", 3).await;
    assert_eq!(job_count(&pool).await, 3);
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_proxy_password_in_front_of_a_redis_without_one(pool: PgPool) {
    // The shared Redis needs no AUTH; the routed push is answered locally.
    let prefix = harness::prefix();
    let proxy = harness::start_with(
        &pool,
        &prefix,
        routes(&prefix, Phase::PostgresOnly),
        config(format!("redis://{}", harness::REDIS), Some(PROXY_PW)),
    )
    .await;
    let jobs = format!("{prefix}:jobs");
    let mut conn = refused_until_the_proxy_password(&proxy, &jobs).await;
    assert_eq!(job_count(&pool).await, 0);
    assert_eq!(conn.call(&["LPUSH", &jobs, &item("a")]).await, b":1\r\n");
    assert_eq!(job_count(&pool).await, 1);
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_proxy_password_needs_upstream_credentials_when_redis_wants_them(pool: PgPool) {
    let prefix = harness::prefix();
    let redis = locked_redis(&prefix).await;
    let (mirror, _writers) = Mirror::start(
        pool.clone(),
        None,
        MirrorOptions {
            buffer_bytes: 1 << 20,
            batch_items: 10,
            writers: 1,
            linger: qbridge::config::DEFAULT_MIRROR_LINGER,
            payload_limit: support::LIMIT,
        },
    );
    let deps = ProxyDeps {
        config: config(redis.url(), Some(PROXY_PW)),
        routes: Routes::from_config(&routes(&prefix, Phase::DualWrite)),
        mirror,
    };
    let bind = tokio::time::timeout(
        Duration::from_secs(10),
        ProxyServer::bind("127.0.0.1:0", deps),
    )
    .await
    .expect("bind answers");
    let e = bind.err().expect("refused at start-up").to_string();
    assert!(e.contains("requires a password"), "{e}");
    assert!(e.contains("[proxy] upstream"), "{e}");
    assert!(!e.contains(PROXY_PW) && !e.contains('\n'), "{e}");
}

/// `CLIENT REPLY OFF` then a push, from a client that never authenticated:
/// Redis refuses both, and the proxy used to mirror the push anyway (it took
/// replies as off without Redis's answer), so a restart's repair could push
/// a planted job with qbridge's credentials. The same held for an ACL user
/// denied the key. The proxy now keeps Redis's replies on, learns from each
/// one, and only withholds them from the client.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_silenced_push_is_mirrored_only_when_redis_took_it(pool: PgPool) {
    let prefix = harness::prefix();
    let redis = locked_redis(&prefix).await;
    let proxy = harness::start_with(
        &pool,
        &prefix,
        routes(&prefix, Phase::DualWrite),
        config(redis.url(), None),
    )
    .await;
    let (jobs, secret) = (format!("{prefix}:jobs"), format!("{prefix}:secret"));

    // Unauthenticated: every reply is Redis's own refusal, in step.
    let planted = [
        cmd(&["CLIENT", "REPLY", "OFF"]),
        push(&jobs, "injected-1"),
        cmd(&["PING"]),
    ]
    .concat();
    let mut anon_direct = Raw::connect(&format!("127.0.0.1:{}", redis.port)).await;
    anon_direct.send(&planted).await;
    let expected = anon_direct.frames(3).await;
    let mut anon = proxy.conn().await;
    anon.send(&planted).await;
    assert_eq!(anon.frames(3).await, expected);
    assert!(expected[0].starts_with(b"-NOAUTH"), "{expected:?}");

    // Alice with replies off: the push Redis takes is mirrored, the one it
    // refuses is not, and neither answer reaches her; CLIENT REPLY ON's +OK
    // and the PING after it arrive in step.
    let mut alice = proxy.conn().await;
    assert_eq!(alice.call(&["AUTH", "alice", ALICE_PW]).await, b"+OK\r\n");
    let silent = [
        cmd(&["CLIENT", "REPLY", "OFF"]),
        push(&secret, "denied-1"),
        push(&jobs, "silent-1"),
        cmd(&["CLIENT", "REPLY", "ON"]),
        cmd(&["PING"]),
    ]
    .concat();
    alice.send(&silent).await;
    assert_eq!(
        alice.frames(2).await,
        [b"+OK\r\n".to_vec(), b"+PONG\r\n".to_vec()]
    );
    // SKIP silences exactly the next command's answer.
    let skip = [
        cmd(&["CLIENT", "REPLY", "SKIP"]),
        push(&secret, "denied-2"),
        cmd(&["PING"]),
    ]
    .concat();
    alice.send(&skip).await;
    assert_eq!(alice.frames(1).await, [b"+PONG\r\n".to_vec()]);

    // A last push, queued for the mirror after everything above.
    assert_eq!(
        alice.call(&["LPUSH", &jobs, &item("last-1")]).await,
        b":2\r\n"
    );
    harness::wait_for_jobs(&pool, "jobs", 2).await;
    let keys: Vec<String> = harness::jobs(&pool, "jobs")
        .await
        .into_iter()
        .map(|(key, _, _)| key)
        .collect();
    assert_eq!(keys, ["last-1", "silent-1"]);
    assert_eq!(
        job_count(&pool).await,
        2,
        "nothing Redis refused was mirrored"
    );
    proxy.stop().await;
}
