//! The workload: producers through the RESP proxy and through the producer
//! API at a steady rate, each remembering the keys whose enqueue was
//! acknowledged (an integer reply from the proxy, `Ok` from the API). Only
//! those are promised; a push that failed or whose answer never came may or
//! may not exist, and the oracle holds it to "never twice" only.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use super::items::{item, Items};
use super::rig::{LIST, ROUTE};
use crate::redis::producer::Producer;

/// The path label of a push that was not acknowledged ([`Acked::unsure`]).
pub const UNSURE: &str = "unacknowledged";

/// Keys acknowledged so far, with the path they came in by.
#[derive(Clone, Default)]
pub struct Acked(Arc<Mutex<Vec<(String, &'static str)>>>);

impl Acked {
    /// Records one acknowledged push.
    pub fn add(&self, key: String, via: &'static str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((key, via));
    }

    /// Records a push whose answer was an error or never came: it may or
    /// may not exist (on a content-hash route it may be one more run of
    /// its text, never one the promise counts).
    pub fn unsure(&self, key: String) {
        self.add(key, UNSURE);
    }

    /// The `index`-th name acknowledged so far (modulo how many there are),
    /// for a re-push; `None` before the first.
    pub fn pick(&self, index: usize) -> Option<String> {
        let keys = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let sure: Vec<&String> = keys
            .iter()
            .filter(|(_, via)| *via != UNSURE)
            .map(|(k, _)| k)
            .collect();
        (!sure.is_empty()).then(|| sure[index % sure.len()].clone())
    }

    /// Everything acknowledged, for the oracle.
    pub fn take(&self) -> Vec<(String, &'static str)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Holds the producers while a step needs Redis untouched by them (see the
/// oracle's advance out of `redis_only`).
#[derive(Clone, Default)]
pub struct Pause(Arc<PauseState>);

#[derive(Default)]
struct PauseState {
    held: AtomicBool,
    /// Pushes sent and not yet answered.
    pushing: AtomicUsize,
}

/// One push under way (ends when dropped).
struct Pushing(Arc<PauseState>);

impl Drop for Pushing {
    fn drop(&mut self) {
        self.0.pushing.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pause {
    /// Returns once no producer pushes and none will until
    /// [`Pause::release`]. A producer counts its push before it looks at
    /// the flag, so either this sees the push under way and waits for its
    /// answer, or the producer sees the flag.
    pub async fn hold(&self) {
        self.0.held.store(true, Ordering::SeqCst);
        while self.0.pushing.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn release(&self) {
        self.0.held.store(false, Ordering::SeqCst);
    }

    /// A push may start: `None` while held.
    fn push(&self) -> Option<Pushing> {
        self.0.pushing.fetch_add(1, Ordering::SeqCst);
        let pushing = Pushing(self.0.clone());
        (!self.0.held.load(Ordering::SeqCst)).then_some(pushing)
    }
}

/// The running producers.
pub struct Load {
    pub acked: Acked,
    pub pause: Pause,
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl Load {
    /// Starts `rate` jobs/s in all, half through the proxy on `proxy_port`,
    /// half through `producer`.
    pub fn start(rate: u32, proxy_port: u16, producer: Producer) -> Load {
        Load::start_with(rate, proxy_port, producer, Items::Ids)
    }

    /// [`Load::start`] with `items`.
    pub fn start_with(rate: u32, proxy_port: u16, producer: Producer, items: Items) -> Load {
        Load::start_across(rate, &[proxy_port], producer, items)
    }

    /// [`Load::start_with`] with the proxy half spread over several proxies
    /// (one producer each, its keys named apart).
    pub fn start_across(rate: u32, proxy_ports: &[u16], producer: Producer, items: Items) -> Load {
        let acked = Acked::default();
        let pause = Pause::default();
        let stop = CancellationToken::new();
        let period = Duration::from_secs_f64(2.0 / f64::from(rate.max(2)));
        let mut tasks = JoinSet::new();
        for (i, &port) in proxy_ports.iter().enumerate() {
            let prefix = match i {
                0 => "p".to_string(),
                i => format!("p{i}"),
            };
            tasks.spawn(through_proxy(
                items,
                prefix,
                port,
                period * proxy_ports.len() as u32,
                (acked.clone(), pause.clone()),
                stop.clone(),
            ));
        }
        tasks.spawn(through_api(
            items,
            producer,
            period,
            (acked.clone(), pause.clone()),
            stop.clone(),
        ));
        Load {
            acked,
            pause,
            stop,
            tasks,
        }
    }

    /// Stops producing and waits for the producers to finish their call.
    pub async fn stop(mut self) -> Acked {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
        self.acked
    }
}

/// `*3 LPUSH <list> <item>` as RESP.
pub fn lpush(list: &str, item: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "*3\r\n$5\r\nLPUSH\r\n${}\r\n{list}\r\n${}\r\n",
        list.len(),
        item.len()
    )
    .into_bytes();
    out.extend_from_slice(item);
    out.extend_from_slice(b"\r\n");
    out
}

/// Reads one simple reply line (`:n`, `-ERR …`, `+OK`); `None` if the
/// connection broke first.
pub async fn reply_line(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match conn.read(&mut byte).await {
            Ok(1) => {
                line.push(byte[0]);
                if line.ends_with(b"\r\n") {
                    return Some(line);
                }
            }
            _ => return None,
        }
    }
}

async fn through_proxy(
    items: Items,
    prefix: String,
    port: u16,
    period: Duration,
    (acked, pause): (Acked, Pause),
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<TcpStream> = None;
    let mut n = 0u64;
    while !stop.is_cancelled() {
        tick.tick().await;
        let Some(_pushing) = pause.push() else {
            continue;
        };
        let key = items.name(&prefix, n);
        n += 1;
        if conn.is_none() {
            conn = TcpStream::connect(("127.0.0.1", port)).await.ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        let sent = c.write_all(&lpush(LIST, &item(items, &key))).await.is_ok();
        let answer = match sent {
            true => tokio::time::timeout(Duration::from_secs(10), reply_line(c))
                .await
                .ok()
                .flatten(),
            false => None,
        };
        match answer {
            Some(line) if line.starts_with(b":") => acked.add(key, "proxy"),
            // An error reply leaves the connection usable; a broken one is
            // replaced on the next tick.
            Some(_) => acked.unsure(key),
            None => {
                acked.unsure(key);
                conn = None;
            }
        }
    }
}

async fn through_api(
    items: Items,
    producer: Producer,
    period: Duration,
    (acked, pause): (Acked, Pause),
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    while !stop.is_cancelled() {
        tick.tick().await;
        let Some(_pushing) = pause.push() else {
            continue;
        };
        let key = items.name("a", n);
        n += 1;
        let call = producer.enqueue(ROUTE, vec![item(items, &key)]);
        match tokio::time::timeout(Duration::from_secs(10), call).await {
            Ok(Ok(_)) => acked.add(key, "producer_api"),
            _ => acked.unsure(key),
        }
    }
}
