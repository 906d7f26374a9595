//! The client side of a splice: reads commands, forwards their exact bytes to
//! Redis, and leaves one [`Tag`] per command for the reply side.
//!
//! Only complete commands are forwarded, so a client that dies halfway
//! through a command never gets half of it run by Redis. Each read's worth of
//! commands goes upstream in one write, then its tags follow: the reply side
//! waits for a tag when a reply beats it, which is cheaper than a write per
//! command. The tag channel is bounded: when it is full the reader stops
//! reading the client, so a client that pipelines faster than Redis (or
//! Postgres) answers is slowed down, never buffered without limit.
//!
//! A route is matched by database and key. The database is the reply side's
//! (Redis's answers are the truth: a SELECT to an index out of range fails),
//! so a push on a routed key read after a SELECT, RESET or the EXEC of a
//! MULTI with a SELECT waits until the reply side has that command's answer:
//! one round trip, once per such command, only when a routed key follows.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_util::sync::CancellationToken;

use super::auth::{encode, Screen, NOAUTH};
use super::command::{is_push, Cmd, LocalPush, LocalStore, MirrorPush, ReplyMode, Tag};
use super::frame::{command_name, parse_command};
use super::link::{Link, Selected, Shared};
use crate::metrics as m;
use crate::model::Phase;

mod follow;
mod given_back;
mod scripts;
mod sets;

/// Routed pushes of one connection whose Postgres write runs ahead of their
/// reply: enough to keep a pipeline busy, few enough that their items (each
/// up to `max_bulk_len`) stay a bounded amount of memory.
const LOCAL_STORES_IN_FLIGHT: usize = 32;

/// Bytes asked of the client socket per read.
const READ_SIZE: usize = 64 * 1024;

/// What a command's route makes of it.
enum Routing {
    /// Not a push on a routed key (or `redis_only`): forwarded as it is.
    NotRouted,
    /// Forwarded, and mirrored once Redis takes it.
    Forward(MirrorPush),
    /// Answered by the proxy.
    Local(Tag),
    /// A push inside MULTI that cannot be routed yet: Redis gets a command
    /// it refuses in its place, so EXEC discards the whole transaction.
    AbortMulti,
}

/// One connection's client reader; see the module docs. `W` is the
/// upstream's write half: a TCP half, or a TLS stream's.
pub(super) struct Reader<W> {
    pub id: u64,
    pub client: OwnedReadHalf,
    pub upstream: W,
    pub tags: mpsc::Sender<Tag>,
    /// Shared with the reply side: its `attention` wakes it for tags that
    /// need it before Redis answers anything (see [`Reader::flush`]).
    pub link: Arc<Link>,
    /// The database as the reply side last published it.
    pub selected: watch::Receiver<Selected>,
    pub fence: Fence,
    /// Whether the client passed the proxy's own password (see `auth`);
    /// unused when the proxy has none.
    pub gate_passed: bool,
    /// A push was routed inside the current MULTI: its count is held until
    /// EXEC, so a later push of the same MULTI must not wait for a change.
    pub routed_in_multi: bool,
    pub shared: Arc<Shared>,
    /// The server is shutting down: stop reading new commands.
    pub stop: CancellationToken,
    /// The reply side has ended: nothing more can be answered.
    pub closed: CancellationToken,
}

/// Which tags the database depends on (see the module docs).
#[derive(Default)]
pub(super) struct Fence {
    /// Tags handed to the reply side so far.
    sent: u64,
    /// The number of the last tag after which the database may differ.
    last: u64,
    /// A SELECT was read inside the current MULTI: its EXEC (or DISCARD)
    /// settles the database.
    select_in_multi: bool,
}

/// What one read's worth of commands becomes.
#[derive(Default)]
struct Batch {
    /// Bytes for Redis, in command order (locally answered pushes left out).
    out: BytesMut,
    /// One tag per command, in command order; `Sent` costs are filled in
    /// once the write is done.
    tags: Vec<Tag>,
}

/// The answer to CLIENT REPLY inside MULTI, before the proxy closes the
/// connection.
const REPLY_IN_MULTI: &[u8] =
    b"-ERR qbridge: CLIENT REPLY inside MULTI is not supported through the proxy\r\n";

/// How long telling Redis the client left may take (a TLS close_notify is
/// a write, and a stuck upstream must not hold the task).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);

impl<W: AsyncWrite + Unpin> Reader<W> {
    /// Runs until the client goes, the server stops, or the reply side ends.
    ///
    /// When the client has gone, the upstream write half is shut down here,
    /// which tells Redis the client left (as a direct client's close would:
    /// Redis answers what it already read, then drops the connection, so a
    /// blocked BLPOP does not hold the splice open). Shut down, not only
    /// dropped: dropping a TCP half sends the FIN, but dropping one half of
    /// a TLS stream sends nothing. Otherwise it is returned, and the caller
    /// keeps it until the replies in flight are in.
    pub(super) async fn run(mut self) -> Option<W> {
        let client_gone = match self.splice().await {
            Ok(client_gone) => client_gone,
            Err(e) => {
                tracing::debug!(conn = self.id, error = %e, "client or upstream I/O failed");
                true
            }
        };
        let Reader {
            mut upstream,
            tags,
            link,
            ..
        } = self;
        // The reply side notices the closed channel when it next looks.
        drop(tags);
        link.attention.notify_one();
        if client_gone {
            let _ = tokio::time::timeout(SHUTDOWN_TIMEOUT, upstream.shutdown()).await;
            return None;
        }
        Some(upstream)
    }

    /// The read loop; true when it ended because the client went away.
    async fn splice(&mut self) -> std::io::Result<bool> {
        let local_stores = Arc::new(Semaphore::new(LOCAL_STORES_IN_FLIGHT));
        let mut buf = BytesMut::with_capacity(READ_SIZE);
        // The reader's guess of MULTI, used only to decide whether a local
        // push may be written ahead of EXEC (the reply side checks it).
        let mut in_multi = false;
        loop {
            let read_at = Instant::now();
            let mut batch = Batch::default();
            let mut monitor = false;
            loop {
                let (args, len) = match parse_command(&buf, &self.shared.limits) {
                    Ok(Some(parsed)) => parsed,
                    Ok(None) => break,
                    Err(e) => {
                        self.shared.protocol_errors.increment(1);
                        tracing::info!(conn = self.id, error = %e, "closing a client connection: malformed or over-limit RESP");
                        self.flush(batch, read_at).await?;
                        let _ = self.tags.send(Tag::Fatal(e.reply())).await;
                        self.link.attention.notify_one();
                        return Ok(false);
                    }
                };
                let mut bytes = buf.split_to(len);
                if args.is_empty() {
                    // Bytes Redis skips without a reply; pass them on as-is.
                    batch.out.extend_from_slice(&bytes);
                    continue;
                }
                self.shared.commands.increment(1);
                let Some(name) = command_name(&args) else {
                    if self.shared.gate.is_some() && !self.gate_passed {
                        batch.tags.push(Tag::Answer(NOAUTH));
                        continue;
                    }
                    batch.out.extend_from_slice(&bytes);
                    batch.tags.push(sent(Cmd::Plain));
                    continue;
                };
                let mut args = args;
                if let Some(gate) = &self.shared.gate {
                    match gate.screen(&mut self.gate_passed, &name, &args) {
                        Screen::Pass => {}
                        Screen::Answer(reply) => {
                            batch.tags.push(Tag::Answer(reply));
                            continue;
                        }
                        Screen::Rewrite(rewritten) => {
                            bytes = BytesMut::from(&encode(&rewritten)[..]);
                            args = rewritten;
                        }
                    }
                }
                let cmd = match self
                    .route(&name, &args, in_multi, &local_stores, &mut batch, read_at)
                    .await?
                {
                    Routing::Local(tag) => {
                        batch.tags.push(tag);
                        continue;
                    }
                    Routing::Forward(push) => Cmd::Push(push),
                    Routing::NotRouted => self.classify_forwarded(&name, &args),
                    Routing::AbortMulti => {
                        bytes = BytesMut::from(follow::ABORT_MULTI);
                        Cmd::Plain
                    }
                };
                if let Cmd::ClientReply(mode) = cmd {
                    if in_multi {
                        // Redis would change what it answers at EXEC, in
                        // the middle of EXEC's own reply: not modelled.
                        self.flush(batch, read_at).await?;
                        let _ = self.tags.send(Tag::Fatal(REPLY_IN_MULTI.into())).await;
                        self.link.attention.notify_one();
                        return Ok(false);
                    }
                    if mode != ReplyMode::On {
                        // Redis keeps answering; the reply side withholds
                        // the answers from the client and learns from each
                        // one whether Redis took a push.
                        bytes = BytesMut::from(
                            &b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$2\r\nON\r\n"[..],
                        );
                    }
                }
                let moves_db = self.track_state(&cmd, &mut in_multi, &mut monitor);
                batch.out.extend_from_slice(&bytes);
                batch.tags.push(sent(cmd));
                if moves_db {
                    self.fence.last = self.fence.sent + batch.tags.len() as u64;
                }
                if monitor {
                    break;
                }
            }
            self.flush(batch, read_at).await?;
            if monitor {
                return self.pass_through(buf).await;
            }
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return Ok(false),
                _ = self.closed.cancelled() => return Ok(false),
                read = self.client.read_buf(&mut buf) => {
                    if read? == 0 {
                        return Ok(true);
                    }
                }
            }
            if buf.capacity() - buf.len() < READ_SIZE / 4 {
                buf.reserve(READ_SIZE);
            }
        }
    }

    /// Follows what a forwarded command does to the connection's state
    /// (MULTI, CLIENT REPLY, MONITOR) and says whether it may move the
    /// connection's database, which fences the pushes behind it.
    fn track_state(&mut self, cmd: &Cmd, in_multi: &mut bool, monitor: &mut bool) -> bool {
        let moves_db = match cmd {
            Cmd::Select(_) => {
                self.fence.select_in_multi |= *in_multi;
                true
            }
            Cmd::Reset => {
                self.fence.select_in_multi = false;
                true
            }
            Cmd::Exec | Cmd::Discard => std::mem::take(&mut self.fence.select_in_multi),
            // Whether a routed push may be answered here depends on
            // Redis's answer to these.
            Cmd::Auth | Cmd::Hello => true,
            _ => false,
        };
        match cmd {
            Cmd::Multi => (*in_multi, self.routed_in_multi) = (true, false),
            Cmd::Exec | Cmd::Discard | Cmd::Reset => {
                (*in_multi, self.routed_in_multi) = (false, false)
            }
            Cmd::Monitor => *monitor = true,
            _ => {}
        }
        moves_db
    }

    /// How a command is routed: a push on a route's key is counted here,
    /// with the phase it is read in, and then forwarded (mirrored in
    /// `dual_write`/`shadow`) or answered locally (`postgres_only`,
    /// `decommissioned`: its Postgres write starts now unless it is inside
    /// MULTI, where it waits for EXEC).
    async fn route(
        &mut self,
        name: &str,
        args: &[Bytes],
        in_multi: bool,
        local_stores: &Arc<Semaphore>,
        batch: &mut Batch,
        read_at: Instant,
    ) -> std::io::Result<Routing> {
        if name == "ZADD" {
            return self.route_set_add(args, in_multi, batch, read_at).await;
        }
        if name == "EVALSHA" || name == "EVAL" {
            return self
                .route_script(name, args, in_multi, batch, read_at)
                .await;
        }
        // `LPUSH key` alone is an arity error: Redis answers it.
        if !is_push(name) || args.len() < 3 {
            return Ok(Routing::NotRouted);
        }
        if !self.shared.routes.is_routed_key(&args[1]) {
            return Ok(Routing::NotRouted);
        }
        let selected = self.selected_db(batch, read_at).await?;
        let Some(route) = selected
            .db
            .and_then(|db| self.shared.routes.by_db_key(db, &args[1]))
            .cloned()
        else {
            return Ok(Routing::NotRouted);
        };
        let (routed, phase) = match self
            .followed_phase(&route, args.get(2), in_multi, batch, read_at)
            .await?
        {
            Ok(followed) => followed,
            Err(refused) => return Ok(refused),
        };
        let local = matches!(phase, Phase::PostgresOnly | Phase::Decommissioned);
        if local && !selected.authed {
            // Redis would refuse it; the proxy answering in its place must
            // too, or an unauthenticated client could enqueue into Postgres.
            return Ok(Routing::Local(Tag::Answer(NOAUTH)));
        }
        let items: Vec<Bytes> = args[2..].to_vec();
        metrics::counter!(m::ROUTE_PUSHES, "route" => route.name.clone(), "phase" => phase.as_str(), "via" => "proxy")
            .increment(items.len() as u64);
        match phase {
            Phase::RedisOnly => return Ok(Routing::NotRouted),
            Phase::DualWrite | Phase::Shadow => {
                return Ok(Routing::Forward(MirrorPush::new(
                    route, items, phase, routed,
                )));
            }
            Phase::PostgresOnly | Phase::Decommissioned => {}
        }
        let count = items.len();
        let store = if in_multi {
            LocalStore::Deferred(items, routed)
        } else {
            let permit = match Arc::clone(local_stores).try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    // Waiting on Postgres: send Redis what is ready first.
                    let ready = std::mem::take(batch);
                    self.flush(ready, read_at).await?;
                    Arc::clone(local_stores)
                        .acquire_owned()
                        .await
                        .map_err(|_| std::io::Error::other("local store limiter closed"))?
                }
            };
            let given_back = self.given_back(&route, &items);
            let (mirror, route) = (self.shared.mirror.clone(), Arc::clone(&route));
            LocalStore::Started(tokio::spawn(async move {
                let _permit = permit;
                if !given_back.is_empty() {
                    // Before the store, which judges the push by it.
                    mirror.record_releases(given_back).await;
                }
                mirror
                    .store_live_routed(route, items, Some(routed))
                    .await
                    .map(|stored| stored.len())
                    .map_err(|e| e.to_string())
            }))
        };
        Ok(Routing::Local(Tag::Local(LocalPush {
            route,
            items: count,
            store,
        })))
    }

    /// The database the next command runs in and whether Redis has the
    /// connection authenticated. If a command that may change either is not
    /// answered yet, the commands read so far go to Redis first,
    /// and the reader waits for the reply side to have the answer.
    async fn selected_db(
        &mut self,
        batch: &mut Batch,
        read_at: Instant,
    ) -> std::io::Result<Selected> {
        let last = self.fence.last;
        if self.selected.borrow().done < last {
            let ready = std::mem::take(batch);
            self.flush(ready, read_at).await?;
            let settled = tokio::select! {
                _ = self.closed.cancelled() => false,
                seen = self.selected.wait_for(|s| s.done >= last) => seen.is_ok(),
            };
            if !settled {
                return Err(std::io::Error::other("reply side closed"));
            }
        }
        Ok(*self.selected.borrow())
    }

    /// Writes the batch's bytes to Redis, then hands its tags over.
    ///
    /// A forwarded command's reply wakes the reply side anyway, which then
    /// takes the tag from the channel: only tags that will get no reply from
    /// Redis (local pushes, silenced commands) wake it here. That saves a
    /// wake-up per command on the hot path.
    async fn flush(&mut self, batch: Batch, read_at: Instant) -> std::io::Result<()> {
        let pubsub = batch
            .tags
            .iter()
            .filter(|t| {
                matches!(
                    t,
                    Tag::Sent {
                        cmd: Cmd::Subscribe { .. } | Cmd::Unsubscribe { .. },
                        ..
                    }
                )
            })
            .count();
        if pubsub > 0 {
            // Before the write: see `Link::pubsub_sent`.
            self.link
                .pubsub_sent
                .fetch_add(pubsub as u64, Ordering::Release);
        }
        if !batch.out.is_empty() {
            self.upstream.write_all(&batch.out).await?;
        }
        let cost = read_at.elapsed();
        let wake = batch.tags.iter().any(|t| !matches!(t, Tag::Sent { .. }));
        for tag in batch.tags {
            let tag = match tag {
                Tag::Sent { cmd, .. } => Tag::Sent { cmd, cost },
                tag => tag,
            };
            if self.tags.send(tag).await.is_err() {
                // The reply side is gone; the connection is closing.
                return Err(std::io::Error::other("reply side closed"));
            }
            self.fence.sent += 1;
        }
        if wake {
            self.link.attention.notify_one();
        }
        Ok(())
    }

    /// After MONITOR: every further byte goes to Redis unparsed (and so
    /// unmirrored) until either side closes.
    async fn pass_through(&mut self, buf: BytesMut) -> std::io::Result<bool> {
        self.upstream.write_all(&buf).await?;
        let mut chunk = vec![0u8; READ_SIZE];
        loop {
            let n = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return Ok(false),
                _ = self.closed.cancelled() => return Ok(false),
                read = self.client.read(&mut chunk) => read?,
            };
            if n == 0 {
                return Ok(true);
            }
            self.upstream.write_all(&chunk[..n]).await?;
        }
    }
}

/// A forwarded command's tag; its cost is set when the batch is written.
fn sent(cmd: Cmd) -> Tag {
    Tag::Sent {
        cmd,
        cost: Duration::ZERO,
    }
}
