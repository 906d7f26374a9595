//! A property of the proxy's connection state, against real redis-servers
//! with `requirepass` and an ACL user: random sequences of AUTH, HELLO,
//! CLIENT REPLY, SELECT, MULTI/EXEC/DISCARD, RESET, SUBSCRIBE/UNSUBSCRIBE,
//! PING and routed pushes
//! (by a user allowed the key, one denied it, and no user), sent pipelined
//! in one write or cut into random pieces. Each sequence goes through the
//! proxy to one server and straight to a twin server, and:
//!
//! - the client reads through the proxy exactly the bytes the twin
//!   answers (withheld replies included);
//! - the mirror copies are exactly the items the proxied server holds in
//!   the routed lists: everything mirrored was taken by Redis for that
//!   connection, and everything Redis took on a routed key is mirrored.
//!
//! The case count is `QBRIDGE_PROXY_STATE_CASES` (24 by default; CI runs
//! the default with `scripts/test`'s fixed `PROPTEST_RNG_SEED`), e.g.
//! `QBRIDGE_PROXY_STATE_CASES=10000 cargo test --test it proxy::state_props`.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};
use qbridge::model::Phase;
use sqlx::PgPool;
use tokio::io::AsyncWriteExt;

use super::auth::{config, locked_redis, routes, ALICE_PW, REDIS_PW};
use super::harness::{self, cmd, item, Raw};
use crate::servers::ThrowawayRedis;

/// One command of a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    AuthAlice,
    AuthAliceWrong,
    AuthDefault,
    Hello3Alice,
    Hello2,
    ReplyOn,
    ReplyOff,
    ReplySkip,
    Select0,
    Select1,
    Multi,
    Exec,
    Discard,
    Reset,
    PushJobs,
    PushSecret,
    Ping,
    Subscribe,
    Unsubscribe,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::AuthAlice),
        1 => Just(Op::AuthAliceWrong),
        1 => Just(Op::AuthDefault),
        1 => Just(Op::Hello3Alice),
        1 => Just(Op::Hello2),
        2 => Just(Op::ReplyOn),
        2 => Just(Op::ReplyOff),
        2 => Just(Op::ReplySkip),
        1 => Just(Op::Select0),
        1 => Just(Op::Select1),
        1 => Just(Op::Multi),
        1 => Just(Op::Exec),
        1 => Just(Op::Discard),
        1 => Just(Op::Reset),
        4 => Just(Op::PushJobs),
        3 => Just(Op::PushSecret),
        1 => Just(Op::Ping),
        1 => Just(Op::Subscribe),
        1 => Just(Op::Unsubscribe),
    ]
}

/// A sequence with pieces to cut its bytes into (empty: one write).
fn sequence() -> impl Strategy<Value = (Vec<Op>, Vec<usize>)> {
    (
        proptest::collection::vec(op(), 1..40),
        proptest::collection::vec(1usize..64, 0..12),
    )
}

/// The bytes of `ops`, pushes numbered `case-i`. CLIENT REPLY is left out
/// while the connection may be in MULTI (the proxy refuses it
/// there, which Redis does not), and the sequence ends by turning replies
/// back on and asking for a last answer, so both sides end in step.
fn encode(ops: &[Op], case: u64, jobs: &str, secret: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut maybe_multi = false;
    for (i, op) in ops.iter().enumerate() {
        let id = format!("c{case}-{i}");
        let args: Vec<String> = match op {
            Op::AuthAlice => vec!["AUTH".into(), "alice".into(), ALICE_PW.into()],
            Op::AuthAliceWrong => vec!["AUTH".into(), "alice".into(), "wrong".into()],
            Op::AuthDefault => vec!["AUTH".into(), REDIS_PW.into()],
            Op::Hello3Alice => ["HELLO", "3", "AUTH", "alice", ALICE_PW]
                .map(String::from)
                .into(),
            Op::Hello2 => vec!["HELLO".into(), "2".into()],
            Op::ReplyOn | Op::ReplyOff | Op::ReplySkip if maybe_multi => continue,
            Op::ReplyOn => ["CLIENT", "REPLY", "ON"].map(String::from).into(),
            Op::ReplyOff => ["CLIENT", "REPLY", "OFF"].map(String::from).into(),
            Op::ReplySkip => ["CLIENT", "REPLY", "SKIP"].map(String::from).into(),
            Op::Select0 => vec!["SELECT".into(), "0".into()],
            Op::Select1 => vec!["SELECT".into(), "1".into()],
            Op::Multi => vec!["MULTI".into()],
            Op::Exec => vec!["EXEC".into()],
            Op::Discard => vec!["DISCARD".into()],
            Op::Reset => vec!["RESET".into()],
            Op::PushJobs => vec!["LPUSH".into(), jobs.into(), item(&id)],
            Op::PushSecret => vec!["LPUSH".into(), secret.into(), item(&id)],
            Op::Ping => vec!["PING".into()],
            Op::Subscribe => vec!["SUBSCRIBE".into(), format!("c{case}-chan")],
            Op::Unsubscribe => vec!["UNSUBSCRIBE".into()],
        };
        match op {
            Op::Multi => maybe_multi = true,
            Op::Exec | Op::Discard | Op::Reset => maybe_multi = false,
            _ => {}
        }
        out.extend(cmd(&args));
    }
    for end in [&["DISCARD"][..], &["CLIENT", "REPLY", "ON"], &["PING"]] {
        out.extend(cmd(end));
    }
    out
}

/// Sends `bytes` (cut at `pieces`), closes the write half and returns
/// everything read until the server closes.
async fn exchange(mut conn: Raw, bytes: &[u8], pieces: &[usize]) -> Vec<u8> {
    let mut rest = bytes;
    for &n in pieces {
        let n = n.min(rest.len());
        conn.send(&rest[..n]).await;
        rest = &rest[n..];
        tokio::task::yield_now().await;
    }
    conn.send(rest).await;
    conn.stream.shutdown().await.expect("closes its write half");
    conn.until_closed().await
}

/// `bytes` as text with the client ids HELLO reports (`id` then an
/// integer, which differ between the two servers) blanked out.
fn comparable(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    let mut rest = &text[..];
    while let Some(at) = rest.find("$2\r\nid\r\n:") {
        let (head, tail) = rest.split_at(at + "$2\r\nid\r\n:".len());
        out.push_str(head);
        out.push('#');
        rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// The ids (`c…`) of the items on `key` in database 0 of `redis`.
async fn held(redis: &ThrowawayRedis, key: &str) -> BTreeSet<String> {
    let mut admin = Raw::connect(&format!("127.0.0.1:{}", redis.port)).await;
    assert_eq!(admin.call(&["AUTH", REDIS_PW]).await, b"+OK\r\n");
    let reply = String::from_utf8_lossy(&admin.call(&["LRANGE", key, "0", "-1"]).await).to_string();
    reply
        .split("\"id\":\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next().map(String::from))
        .collect()
}

async fn mirrored(pool: &PgPool, queue: &str) -> BTreeSet<String> {
    harness::jobs(pool, queue)
        .await
        .into_iter()
        .map(|(key, _, _)| key)
        .collect()
}

fn cases() -> u32 {
    std::env::var("QBRIDGE_PROXY_STATE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

fn rng() -> TestRng {
    let seed: u64 = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20261122);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_proxy_mirrors_exactly_what_redis_took_for_each_connection(pool: PgPool) {
    let prefix = harness::prefix();
    let proxied = locked_redis(&prefix).await;
    let twin = locked_redis(&prefix).await;
    let proxy = harness::start_with(
        &pool,
        &prefix,
        routes(&prefix, Phase::DualWrite),
        config(proxied.url(), None),
    )
    .await;
    let (jobs, secret) = (format!("{prefix}:jobs"), format!("{prefix}:secret"));
    let mut runner = TestRunner::new_with_rng(RunnerConfig::default(), rng());
    let twin_addr = format!("127.0.0.1:{}", twin.port);
    for case in 0..u64::from(cases()) {
        let (ops, pieces) = sequence().new_tree(&mut runner).expect("a case").current();
        let bytes = encode(&ops, case, &jobs, &secret);
        let direct = exchange(Raw::connect(&twin_addr).await, &bytes, &[]).await;
        let through = exchange(proxy.conn().await, &bytes, &pieces).await;
        assert_eq!(
            comparable(&through),
            comparable(&direct),
            "case {case}: the proxy's answers differ from Redis's for {ops:?} cut at {pieces:?}"
        );
        // One mirror writer: a barrier push, mirrored, means every earlier
        // push of the case was written or never queued.
        let barrier = format!("c{case}-barrier");
        let mut admin = proxy.conn().await;
        assert_eq!(admin.call(&["AUTH", REDIS_PW]).await, b"+OK\r\n");
        admin.call(&["LPUSH", &jobs, &item(&barrier)]).await;
        let mut twin_admin = Raw::connect(&twin_addr).await;
        assert_eq!(twin_admin.call(&["AUTH", REDIS_PW]).await, b"+OK\r\n");
        twin_admin.call(&["LPUSH", &jobs, &item(&barrier)]).await;
        let want = held(&proxied, &jobs).await.len() + held(&proxied, &secret).await.len();
        harness::wait_for_jobs(&pool, "jobs", held(&proxied, &jobs).await.len() as i64).await;
        for (queue, key) in [("jobs", &jobs), ("secret", &secret)] {
            assert_eq!(
                mirrored(&pool, queue).await,
                held(&proxied, key).await,
                "case {case}: mirrored ≠ taken by Redis on {queue} for {ops:?}"
            );
        }
        let total: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.job_keys")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(total as usize, want, "case {case}: nothing else mirrored");
    }
    proxy.stop().await;
}
