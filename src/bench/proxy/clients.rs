//! The bench's RESP clients: raw TCP connections writing `LPUSH key payload`
//! with `depth` commands in flight, timing each command from its write to its
//! integer reply. The same code measures both sides, so they differ only in
//! the address they connect to.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{join_err, ProxyArgs};
use crate::error::{Error, Result};

/// One side's measurement. Only the summary is kept, so the samples of the
/// direct phase are freed before the proxy phase's RSS is sampled.
#[derive(Debug, Default)]
pub(super) struct Side {
    /// LPUSH commands answered.
    pub ops: u64,
    /// Items they pushed (`ops` times `--items`).
    pub items: u64,
    pub secs: f64,
    /// Latency percentiles p50, p99, p99.9 and the maximum, in ms.
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Side {
    pub fn ops_s(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
}

/// The p-th percentile of sorted µs samples, in ms (the rank rule of
/// [`crate::bench::harness::percentile`]).
fn pct_ms(sorted: &[u32], p: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0.0;
    };
    let rank = ((p / 100.0) * last as f64).round() as usize;
    f64::from(sorted[rank.min(last)]) / 1e3
}

/// Runs `args.clients` clients against `addr` for `dur`; ids are `<tag><client>-<n>`.
pub(super) async fn phase(
    addr: SocketAddr,
    args: &ProxyArgs,
    key: &Arc<[u8]>,
    tag: &str,
    dur: Duration,
    done: &Arc<AtomicU64>,
) -> Result<Side> {
    let start = Instant::now();
    let until = start + dur;
    let tasks: Vec<_> = (0..args.clients)
        .map(|c| {
            let (key, done, prefix) = (key.clone(), done.clone(), format!("{tag}{c}"));
            let shape = Shape {
                depth: args.depth,
                payload_bytes: args.payload_bytes,
                items: args.items.max(1),
                // Each client sends `depth` pushes every `every`.
                every: (args.rate > 0).then(|| {
                    Duration::from_secs_f64((args.clients * args.depth) as f64 / args.rate as f64)
                }),
                // Paced clients start spread over one interval, not at once.
                offset: c as f64 / args.clients as f64,
            };
            tokio::spawn(client(addr, key, prefix, shape, until, done))
        })
        .collect();
    let mut lat_us = Vec::new();
    for task in tasks {
        lat_us.extend(task.await.map_err(join_err)??);
    }
    let secs = start.elapsed().as_secs_f64();
    lat_us.sort_unstable();
    Ok(Side {
        ops: lat_us.len() as u64,
        items: lat_us.len() as u64 * args.items.max(1) as u64,
        secs,
        p50: pct_ms(&lat_us, 50.0),
        p99: pct_ms(&lat_us, 99.0),
        p999: pct_ms(&lat_us, 99.9),
        max: pct_ms(&lat_us, 100.0),
    })
}

/// What one client sends.
struct Shape {
    depth: usize,
    payload_bytes: usize,
    /// Items per LPUSH.
    items: usize,
    /// Paced: one round of `depth` pushes per this interval (a round that
    /// ends late starts the next at once; the schedule does not drift).
    every: Option<Duration>,
    /// Where in the first interval this client starts, as a fraction.
    offset: f64,
}

/// One connection: writes `depth` LPUSHes, reads `depth` integer replies,
/// until `until`. Returns each command's send→reply latency in µs (u32: a
/// million samples stay small next to the RSS being measured).
async fn client(
    addr: SocketAddr,
    key: Arc<[u8]>,
    prefix: String,
    shape: Shape,
    until: Instant,
    done: Arc<AtomicU64>,
) -> Result<Vec<u32>> {
    let Shape {
        depth,
        payload_bytes,
        items,
        every,
        offset,
    } = shape;
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut out, mut input, mut lat) = (Vec::new(), BytesMut::with_capacity(4096), Vec::new());
    let mut n = 0u64;
    let mut next = Instant::now() + every.map_or(Duration::ZERO, |e| e.mul_f64(offset));
    while Instant::now() < until {
        if let Some(every) = every {
            tokio::time::sleep_until(next.into()).await;
            next += every;
        }
        out.clear();
        for _ in 0..depth {
            let ids: Vec<String> = (n..n + items as u64)
                .map(|i| format!("{prefix}-{i:012}"))
                .collect();
            encode_lpush(&mut out, &key, &ids, payload_bytes);
            n += items as u64;
        }
        let sent = Instant::now();
        stream.write_all(&out).await?;
        let mut got = 0;
        while got < depth {
            if stream.read_buf(&mut input).await? == 0 {
                return Err(Error::InvalidInput(format!("{addr} closed the connection")));
            }
            let micros = u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX);
            while got < depth && take_reply(&mut input)? {
                lat.push(micros);
                got += 1;
            }
        }
        done.fetch_add(depth as u64, Ordering::Relaxed);
    }
    Ok(lat)
}

/// Appends `LPUSH key {"id":"<id>","pad":"xx…"} …`, one item per id, each
/// payload padded to `payload_bytes` (or longer, if the id alone does not
/// fit).
fn encode_lpush(out: &mut Vec<u8>, key: &[u8], ids: &[String], payload_bytes: usize) {
    let head = format!("*{}\r\n$5\r\nLPUSH\r\n${}\r\n", ids.len() + 2, key.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(b"\r\n");
    for id in ids {
        let head = format!("{{\"id\":\"{id}\",\"pad\":\"");
        let pad = payload_bytes.saturating_sub(head.len() + 2);
        out.extend_from_slice(format!("${}\r\n", head.len() + pad + 2).as_bytes());
        out.extend_from_slice(head.as_bytes());
        out.resize(out.len() + pad, b'x');
        out.extend_from_slice(b"\"}\r\n");
    }
}

/// Consumes one `:<n>\r\n` reply if complete; an error reply is an error.
fn take_reply(input: &mut BytesMut) -> Result<bool> {
    let Some(end) = input.windows(2).position(|w| w == b"\r\n") else {
        return Ok(false);
    };
    let line = String::from_utf8_lossy(&input[..end]).into_owned();
    input.advance(end + 2);
    match line.as_bytes().first() {
        Some(b':') => Ok(true),
        _ => Err(Error::InvalidInput(format!("LPUSH answered {line:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lpush_is_one_resp_command_with_a_padded_json_payload() {
        let mut out = Vec::new();
        encode_lpush(&mut out, b"k", &["p0-000000000001".into()], 200);
        let text = String::from_utf8(out).expect("ascii");
        let payload = text.lines().nth(6).expect("payload line");
        assert_eq!(payload.len(), 200);
        assert!(text.starts_with("*3\r\n$5\r\nLPUSH\r\n$1\r\nk\r\n$200\r\n"));
        let json: serde_json::Value = serde_json::from_str(payload).expect("json");
        assert_eq!(json["id"], "p0-000000000001");
    }

    #[test]
    fn a_bulk_push_carries_every_item() {
        let mut out = Vec::new();
        let ids: Vec<String> = (0..3).map(|i| format!("p0-{i}")).collect();
        encode_lpush(&mut out, b"k", &ids, 50);
        let text = String::from_utf8(out).expect("ascii");
        assert!(text.starts_with("*5\r\n$5\r\nLPUSH\r\n$1\r\nk\r\n$50\r\n"));
        let payloads: Vec<&str> = text.lines().filter(|l| l.starts_with('{')).collect();
        assert_eq!(payloads.len(), 3);
        assert!(payloads.iter().all(|p| p.len() == 50));
        assert!(payloads[2].contains("p0-2"));
    }

    #[test]
    fn percentiles_use_the_harness_rank_rule() {
        let us: Vec<u32> = (1..=1000).collect();
        assert_eq!(pct_ms(&us, 50.0), 0.501);
        assert_eq!(pct_ms(&us, 100.0), 1.0);
        assert_eq!(pct_ms(&[], 99.0), 0.0);
    }

    #[test]
    fn replies_are_taken_whole_and_errors_surface() {
        let mut input = BytesMut::from(&b":1\r\n:2\r\n:3"[..]);
        assert!(take_reply(&mut input).expect("int"));
        assert!(take_reply(&mut input).expect("int"));
        assert!(!take_reply(&mut input).expect("partial"));
        input.extend_from_slice(b"\r\n-ERR no\r\n");
        assert!(take_reply(&mut input).expect("int"));
        assert!(take_reply(&mut input).is_err());
    }
}
