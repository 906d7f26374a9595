//! The walk's hand-back step: a client takes a job off the route's list
//! through a proxy (a raw `BRPOP`, as a worker fetching it), the route's
//! phase or share changes while the client holds it, and the client pushes
//! the same bytes back on the same connection (`RPUSH`, as a worker giving
//! a job up at shutdown). The job must then run once, on whichever side the
//! route sends it to now; the oracle finds it lost if it stayed held, and
//! run twice if both sides ran it.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::steps::{change_phase, Step};
use crate::chaos::load::{self, Pause};
use crate::chaos::rig::{Rig, LIST};
use crate::chaos::Harness;
use crate::error::Result;
use crate::model::formats::decode_bytes;
use crate::model::Phase;
use crate::ops::operate;

/// How long the client waits for a job to take: the consumers, blocked on
/// the list before it, are handed the next items first.
const TAKE_WITHIN_SECONDS: u32 = 3;

/// How often a refused hand-back (`TRYAGAIN` while the proxies follow the
/// change) is tried again, a second apart, as a client retrying would.
const TRIES: usize = 12;

/// Takes one job through proxy `pick` (modulo the proxies), changes the
/// phase or share while holding it (`pick` chooses how), and hands it back.
pub async fn hand_back(rig: &Rig, h: &Harness, pick: usize, pause: &Pause) -> Result<String> {
    let ports = rig.proxy_ports();
    let port = ports[pick % ports.len()];
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await?;
    conn.write_all(&command(&[
        b"BRPOP",
        LIST.as_bytes(),
        TAKE_WITHIN_SECONDS.to_string().as_bytes(),
    ]))
    .await?;
    let wait = Duration::from_secs(u64::from(TAKE_WITHIN_SECONDS) + 5);
    let taken = match tokio::time::timeout(wait, read_pop(&mut conn)).await {
        Ok(Ok(taken)) => taken,
        Ok(Err(e)) => return Ok(format!("hand-back: the pop failed: {e}")),
        Err(_) => return Ok("hand-back: the pop was not answered".into()),
    };
    let Some(item) = taken else {
        return Ok("hand-back: nothing to take".into());
    };
    let name = decode_bytes(&h.route.format, item.clone())
        .key
        .with_occurrence(0);
    let state = operate::state_of(&rig.operator, &h.route, super::steps::BY).await?;
    let change = match (state.phase, pick % 3) {
        (Phase::PostgresOnly, 0) => Step::Rollback,
        (Phase::PostgresOnly, n) => Step::Ramp {
            percent: match (state.percent, n) {
                (100, _) => 0,
                (0, _) | (_, 1) => 100,
                (p, _) => p / 2,
            },
        },
        (_, n) => Step::Advance {
            percent: [10, 50, 100][n],
        },
    };
    let changed = match change_phase(change, rig, h, pause).await {
        Ok(said) => said,
        Err(e) => format!("{change:?} failed: {e}"),
    };
    let back = give_back(&mut conn, &item).await;
    Ok(format!(
        "hand-back: took {name} via proxy :{port}; {changed}; pushed it back on the same connection: {back}"
    ))
}

/// `RPUSH` of `item` on `conn` until it is acknowledged or refused for
/// good; the last reply.
async fn give_back(conn: &mut TcpStream, item: &[u8]) -> String {
    let mut last = String::new();
    for _ in 0..TRIES {
        if conn
            .write_all(&command(&[b"RPUSH", LIST.as_bytes(), item]))
            .await
            .is_err()
        {
            return "the connection broke".into();
        }
        let reply = tokio::time::timeout(Duration::from_secs(10), load::reply_line(conn)).await;
        let Ok(Some(line)) = reply else {
            return "no reply".into();
        };
        last = String::from_utf8_lossy(&line).trim().to_string();
        if !line.starts_with(b"-TRYAGAIN") {
            return last;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    last
}

/// A command as a RESP array of bulk strings.
fn command(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", parts.len()).into_bytes();
    for part in parts {
        out.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads a `BRPOP` reply: the item, or `None` when it timed out.
async fn read_pop(conn: &mut TcpStream) -> std::io::Result<Option<Bytes>> {
    let broken = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection broke");
    let head = load::reply_line(conn).await.ok_or_else(broken)?;
    match head.as_slice() {
        b"*2\r\n" => {}
        b"*-1\r\n" | b"$-1\r\n" | b"_\r\n" => return Ok(None),
        other => {
            return Err(std::io::Error::other(
                String::from_utf8_lossy(other).trim().to_string(),
            ))
        }
    }
    let _list = read_bulk(conn).await?;
    read_bulk(conn).await.map(Some)
}

/// Reads one bulk string (`$n`, n bytes, CRLF).
async fn read_bulk(conn: &mut TcpStream) -> std::io::Result<Bytes> {
    let line = load::reply_line(conn)
        .await
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "broke"))?;
    let len: usize = std::str::from_utf8(&line[1..])
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .filter(|_| line.first() == Some(&b'$'))
        .ok_or_else(|| std::io::Error::other("not a bulk string"))?;
    let mut body = vec![0u8; len + 2];
    conn.read_exact(&mut body).await?;
    body.truncate(len);
    Ok(Bytes::from(body))
}
