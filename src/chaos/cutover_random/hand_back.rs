//! The client of the walk's hand-back step: it takes a job off the route's
//! list through a proxy (a raw `BRPOP`, as a worker fetching it) and, once
//! the walk changed the route's phase or share, pushes the same bytes back
//! on the same connection (`RPUSH`, as a worker giving a job up at
//! shutdown). The job must then run once, on whichever side the
//! route sends it to now; the oracle finds it lost if it stayed held, and
//! run twice if both sides ran it.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::chaos::load;
use crate::chaos::rig::{Rig, LIST};
use crate::error::Result;
use crate::model::formats::{decode_bytes, Format};

/// How long the client waits for a job to take: the consumers, blocked on
/// the list before it, are handed the next items first.
const TAKE_WITHIN_SECONDS: u32 = 3;

/// How often a refused hand-back (`TRYAGAIN` while the proxies follow the
/// change) is tried again, a second apart, as a client retrying would.
const TRIES: usize = 12;

/// A job a client took off the route's list, and the connection it took
/// it on (the one it must push it back on).
pub struct Taken {
    conn: TcpStream,
    item: Bytes,
    /// The proxy's port, for the walk's report.
    pub port: u16,
}

/// Takes one job through proxy `pick` (modulo the proxies) with `BRPOP`;
/// `Err` says why nothing was taken (none came within the wait, the pop
/// failed).
pub async fn take(rig: &Rig, pick: usize) -> Result<std::result::Result<Taken, String>> {
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
    Ok(
        match tokio::time::timeout(wait, read_pop(&mut conn)).await {
            Ok(Ok(Some(item))) => Ok(Taken { conn, item, port }),
            Ok(Ok(None)) => Err("nothing to take".into()),
            Ok(Err(e)) => Err(format!("the pop failed: {e}")),
            Err(_) => Err("the pop was not answered".into()),
        },
    )
}

impl Taken {
    /// The job's key on a route of `format`.
    pub fn key(&self, format: &Format) -> String {
        decode_bytes(format, self.item.clone())
            .key
            .with_occurrence(0)
    }

    /// Pushes the job back on the connection it was taken on; the reply.
    pub async fn give_back(mut self) -> String {
        give_back(&mut self.conn, &self.item).await
    }
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
