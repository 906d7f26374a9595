//! Pub/sub through the proxy: confirmations and messages pass through in
//! RESP2 and RESP3, and reply pairing stays right across SUBSCRIBE and
//! UNSUBSCRIBE (a routed push after them is mirrored only if it is paired
//! with its own reply).

use qbridge::model::Phase;
use sqlx::PgPool;

use super::harness::{self, cmd, item, Raw, REDIS};

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn subscribe_passes_through_and_pairing_survives_unsubscribe(pool: PgPool) {
    let prefix = harness::prefix();
    let jobs_key = format!("{prefix}:jobs");
    let proxy = harness::start(
        &pool,
        &prefix,
        vec![harness::route("jobs", &jobs_key, Phase::DualWrite)],
    )
    .await;
    let (a, b) = (format!("{prefix}:a"), format!("{prefix}:b"));
    let mut sub = proxy.conn().await;
    let mut direct = Raw::connect(REDIS).await;

    sub.send(&cmd(&["SUBSCRIBE", &a, &b])).await;
    let confirmations = sub.frames(2).await;
    assert_eq!(confirmations[0], bulk_array(&["subscribe", &a], 1));
    assert_eq!(confirmations[1], bulk_array(&["subscribe", &b], 2));
    assert_eq!(direct.call(&["PUBLISH", &a, "hi"]).await, b":1\r\n");
    assert_eq!(sub.frames(1).await[0], bulk_array3(&["message", &a, "hi"]));
    // PING in subscribe mode is answered in band, as ["pong", ""].
    assert_eq!(sub.call(&["PING"]).await, b"*2\r\n$4\r\npong\r\n$0\r\n\r\n");
    // UNSUBSCRIBE with no argument: one confirmation per channel.
    sub.send(&cmd(&["UNSUBSCRIBE"])).await;
    // Redis picks the order; the counts go 1 then 0.
    let left = sub.frames(2).await;
    assert!(
        left[1].ends_with(b":0\r\n"),
        "{:?}",
        String::from_utf8_lossy(&left[1])
    );
    let mut left: Vec<Vec<u8>> = left.iter().map(|f| strip_count(f)).collect();
    left.sort();
    let mut expected = vec![
        strip_count(&bulk_array(&["unsubscribe", &a], 0)),
        strip_count(&bulk_array(&["unsubscribe", &b], 0)),
    ];
    expected.sort();
    assert_eq!(left, expected);
    // Out of subscribe mode an array that looks like a message is a reply,
    // and a routed push right after is paired with its own reply (mirrored).
    let list = format!("{prefix}:l");
    assert_eq!(
        sub.call(&["RPUSH", &list, "message", &a, "x"]).await,
        b":3\r\n"
    );
    assert_eq!(
        sub.call(&["LRANGE", &list, "0", "-1"]).await,
        bulk_array3(&["message", &a, "x"])
    );
    assert_eq!(
        sub.call(&["LPUSH", &jobs_key, &item("after-unsub")]).await,
        b":1\r\n"
    );
    harness::wait_for_jobs(&pool, "jobs", 1).await;
    assert_eq!(harness::jobs(&pool, "jobs").await[0].0, "after-unsub");

    // RESP3: confirmations and messages are pushes; commands keep working.
    assert_eq!(sub.call(&["HELLO", "3"]).await[0], b'%');
    sub.send(&cmd(&["SUBSCRIBE", &a])).await;
    assert_eq!(sub.frames(1).await[0], push3(&["subscribe", &a], 1));
    assert_eq!(direct.call(&["PUBLISH", &a, "resp3"]).await, b":1\r\n");
    assert_eq!(sub.frames(1).await[0], push_msg(&a, "resp3"));
    assert_eq!(
        sub.call(&["GET", &format!("{prefix}:missing")]).await,
        b"_\r\n"
    );
    assert_eq!(
        sub.call(&["LPUSH", &jobs_key, &item("resp3-sub")]).await,
        b":2\r\n"
    );
    harness::wait_for_jobs(&pool, "jobs", 2).await;
    sub.send(&cmd(&["UNSUBSCRIBE"])).await;
    assert_eq!(sub.frames(1).await[0], push3(&["unsubscribe", &a], 0));
    assert_eq!(sub.call(&["PING"]).await, b"+PONG\r\n");
    proxy.stop().await;
}

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

fn bulk_array(parts: &[&str], count: i64) -> Vec<u8> {
    let mut out = format!("*{}\r\n", parts.len() + 1);
    parts.iter().for_each(|p| out.push_str(&bulk(p)));
    out.push_str(&format!(":{count}\r\n"));
    out.into_bytes()
}

fn bulk_array3(parts: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", parts.len());
    parts.iter().for_each(|p| out.push_str(&bulk(p)));
    out.into_bytes()
}

fn push3(parts: &[&str], count: i64) -> Vec<u8> {
    let mut out = bulk_array(parts, count);
    out[0] = b'>';
    out
}

fn push_msg(channel: &str, message: &str) -> Vec<u8> {
    let mut out = bulk_array3(&["message", channel, message]);
    out[0] = b'>';
    out
}

fn strip_count(frame: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(frame);
    let cut = text.rfind(':').unwrap_or(text.len());
    text[..cut].as_bytes().to_vec()
}
