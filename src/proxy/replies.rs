//! The Redis side of a splice: reads replies, pairs each with its command's
//! [`Tag`] (the n-th in-band reply belongs to the n-th command), writes the
//! exact bytes to the client, and settles routed pushes once Redis has
//! answered them.
//!
//! Out-of-band frames (RESP3 pushes, RESP2 pub/sub messages while
//! subscribed) go straight to the client without taking a tag. Replies are
//! parsed only when something depends on them (see [`Session::inspects`]);
//! everything else is forwarded from the scan alone. Output is gathered and
//! written once per read, and always before waiting on anything (a tag,
//! Redis, Postgres), so a pipeline costs one write, and nothing sits unsent
//! while the proxy waits.

use std::future::{poll_fn, Future};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc::{self, error::TryRecvError};
use tokio_util::sync::CancellationToken;

use super::command::{local_reply, Cmd, LocalPush, MirrorPush, Tag};
use super::frame::{self, Decoder, Frame};
use super::link::{Link, Selected, Shared};
use super::session::{may_confirm, Action, Expect, Session};

mod exec;
mod released;

use exec::store;

/// The command whose replies are being read.
struct Head {
    cmd: Cmd,
    /// The reader's share of the added latency.
    cost: Duration,
    expect: Expect,
    /// The client's CLIENT REPLY withholds the answer: Redis's reply is
    /// read and acted on, and not forwarded.
    silent: bool,
}

/// Whether the connection goes on.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

/// One connection's reply side; see the module docs. `R` is the upstream's
/// read half: a TCP half, or a TLS stream's.
pub(super) struct Replies<R> {
    pub id: u64,
    pub upstream: R,
    pub client: OwnedWriteHalf,
    pub tags: mpsc::Receiver<Tag>,
    link: Arc<Link>,
    pub shared: Arc<Shared>,
    /// Server shutdown; only MONITOR streams, which have no tags, watch it.
    pub stop: CancellationToken,
    session: Session,
    buf: BytesMut,
    decoder: Decoder,
    out: Vec<u8>,
    head: Option<Head>,
    tags_closed: bool,
    /// Tags taken from the channel, and of them (un)subscribe commands.
    taken: u64,
    pubsub_taken: u64,
    client_gone: bool,
    /// The reply being handled is withheld from the client (its head's
    /// `silent`): [`Replies::forward`] and EXEC's splice drop it.
    mute: bool,
    /// When the last upstream read returned: a reply is ready from then on.
    last_read: Instant,
    /// (reader's cost, reply ready) of commands answered since the last flush.
    answered: Vec<(Duration, Instant)>,
}

impl<R: AsyncRead + Unpin> Replies<R> {
    /// A reply side for these halves.
    pub(super) fn new(
        id: u64,
        upstream: R,
        client: OwnedWriteHalf,
        tags: mpsc::Receiver<Tag>,
        link: Arc<Link>,
        shared: Arc<Shared>,
        stop: CancellationToken,
    ) -> Replies<R> {
        let decoder = Decoder::new(shared.reply_limits);
        // The connection's probe put the fresh state into the link.
        let session = Session::new(link.db.borrow().authed);
        Replies {
            id,
            upstream,
            client,
            tags,
            link,
            shared,
            stop,
            session,
            buf: BytesMut::with_capacity(16 * 1024),
            decoder,
            out: Vec::new(),
            head: None,
            tags_closed: false,
            taken: 0,
            pubsub_taken: 0,
            client_gone: false,
            mute: false,
            last_read: Instant::now(),
            answered: Vec::new(),
        }
    }

    /// Runs until every command read has been answered and the reader has
    /// stopped, or Redis or the client protocol ends the connection.
    pub(super) async fn run(mut self) {
        let unanswered = self.pump().await;
        self.flush().await;
        if unanswered > 0 {
            tracing::debug!(
                conn = self.id,
                commands = unanswered,
                "connection closed with commands unanswered by Redis"
            );
        }
        let _ = self.client.shutdown().await;
    }

    /// The main loop; returns how many commands were left without a reply.
    async fn pump(&mut self) -> usize {
        loop {
            while self.head.is_none() && !self.tags_closed {
                match self.tags.try_recv() {
                    Ok(tag) => {
                        if self.begin(tag).await == Flow::Close {
                            return 0;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => self.tags_closed = true,
                }
            }
            match self.decoder.frame_len(&self.buf) {
                Ok(Some(len)) => match self.frame(len).await {
                    Ok(Flow::Continue) => continue,
                    Ok(Flow::Close) => return 0,
                    Err(e) => {
                        tracing::warn!(conn = self.id, error = %e, "upstream Redis sent malformed RESP; closing the connection");
                        self.out.extend_from_slice(
                            b"-ERR qbridge: upstream Redis sent malformed RESP\r\n",
                        );
                        return 1;
                    }
                },
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(conn = self.id, error = %e, "upstream Redis sent malformed RESP; closing the connection");
                    self.out
                        .extend_from_slice(b"-ERR qbridge: upstream Redis sent malformed RESP\r\n");
                    return 1;
                }
            }
            if self.tags_closed && self.head.is_none() {
                return 0;
            }
            self.flush().await;
            let want_tag = self.head.is_none() && !self.tags_closed;
            tokio::select! {
                biased;
                // The loop's top takes whatever tags are there.
                _ = self.link.attention.notified(), if want_tag => {}
                read = self.upstream.read_buf(&mut self.buf) => {
                    self.last_read = Instant::now();
                    match read {
                        Ok(0) | Err(_) => return usize::from(self.head.is_some()) + self.tags.len(),
                        Ok(_) => {}
                    }
                }
            }
        }
    }

    /// Takes the next command's tag. Commands that expect no reply from
    /// Redis (locally answered pushes, the proxy's own answers) are done
    /// here.
    async fn begin(&mut self, tag: Tag) -> Flow {
        self.taken += 1;
        match tag {
            Tag::Fatal(line) => {
                self.out.extend_from_slice(&line);
                Flow::Close
            }
            Tag::Local(push) => {
                self.local(push).await;
                Flow::Continue
            }
            Tag::Answer(bytes) => {
                if !self.session.start_local() {
                    self.out.extend_from_slice(bytes);
                }
                Flow::Continue
            }
            Tag::Sent { cmd, cost } => {
                if matches!(cmd, Cmd::Subscribe { .. } | Cmd::Unsubscribe { .. }) {
                    self.pubsub_taken += 1;
                }
                // Redis answers every forwarded command (the proxy keeps its
                // replies on), so a push is mirrored only on its answer.
                let (expect, silent) = self.session.start(&cmd);
                self.head = Some(Head {
                    cmd,
                    cost,
                    expect,
                    silent,
                });
                Flow::Continue
            }
        }
    }

    /// Handles the complete frame of `len` bytes at the start of the buffer.
    async fn frame(&mut self, len: usize) -> Result<Flow, frame::ProtocolError> {
        let mut parsed = None;
        if self.session.maybe_out_of_band(self.buf[0]) {
            let frame = self.parse(len)?;
            if self.head.is_none()
                && may_confirm(&frame)
                && self.take_pubsub_tags().await == Flow::Close
            {
                return Ok(Flow::Close);
            }
            let waiting = match self.head.as_ref().map(|h| h.expect) {
                Some(Expect::Confirmations {
                    family, subscribe, ..
                }) => Some((family, subscribe)),
                _ => None,
            };
            if self.session.out_of_band(&frame, waiting) {
                self.forward(len);
                return Ok(Flow::Continue);
            }
            parsed = Some(frame);
        }
        let Some(head) = self.head.take() else {
            if self.tags_closed {
                return Err(frame::ProtocolError::Desync);
            }
            // The reply beat its tag (tags follow the write): wait for it.
            self.flush().await;
            match self.tags.recv().await {
                Some(tag) => return Ok(self.begin(tag).await),
                None => self.tags_closed = true,
            }
            return Ok(Flow::Continue);
        };
        let ready = self.last_read;
        self.mute = head.silent;
        let flow = self.settle_head(head, len, parsed, ready).await;
        self.mute = false;
        flow
    }

    /// Handles the reply (of `len` bytes, `parsed` if it was) to `head`.
    async fn settle_head(
        &mut self,
        head: Head,
        len: usize,
        mut parsed: Option<Frame>,
        ready: Instant,
    ) -> Result<Flow, frame::ProtocolError> {
        match head.expect {
            Expect::Confirmations {
                family,
                subscribe,
                left,
            } => {
                let frame = match parsed {
                    Some(frame) => frame,
                    None => self.parse(len)?,
                };
                let error = frame.is_error();
                // Confirmations come whatever CLIENT REPLY says; errors not.
                let muted = std::mem::replace(&mut self.mute, head.silent && error);
                self.forward(len);
                self.mute = muted;
                if !error {
                    self.session.confirm(&frame, family, subscribe);
                }
                if error || left <= 1 {
                    self.answered.push((head.cost, ready));
                } else {
                    self.head = Some(Head {
                        expect: Expect::Confirmations {
                            family,
                            subscribe,
                            left: left - 1,
                        },
                        ..head
                    });
                }
            }
            Expect::One => {
                if parsed.is_none() && self.session.inspects(&head.cmd) {
                    parsed = Some(self.parse(len)?);
                }
                self.answered.push((head.cost, ready));
                let moves_state = head.cmd.moves_state();
                match self.session.on_reply(head.cmd, parsed.as_ref()) {
                    Action::Forward => self.forward(len),
                    Action::Drop => drop(self.buf.split_to(len)),
                    Action::ForwardAlways => {
                        self.mute = false;
                        self.forward(len);
                    }
                    Action::Mirror(push) => {
                        self.forward(len);
                        self.mirror(push).await;
                    }
                    Action::Exec(entries) => {
                        let bytes = self.buf.split_to(len);
                        self.exec(entries, parsed, &bytes).await;
                    }
                    Action::Monitor => {
                        self.forward(len);
                        return Ok(self.pass_through().await);
                    }
                    Action::Evidence(evidence) => {
                        self.record_evidence(evidence).await;
                        self.forward(len);
                    }
                }
                if moves_state {
                    self.publish_db();
                }
            }
        }
        Ok(Flow::Continue)
    }

    /// A push that may be a pub/sub confirmation arrived with no command at
    /// the head. If (un)subscribe commands were written whose tags are not
    /// taken yet, it beat its tag (tags follow the write): take tags up to
    /// it. Classified first, it would pass as out of band, and the SUBSCRIBE
    /// would then take the next reply as its confirmation, leaving every
    /// later reply one off. With none outstanding it is unsolicited and goes
    /// on at once. This cannot hang: the tags counted are sent right after
    /// their write, or the channel closes.
    async fn take_pubsub_tags(&mut self) -> Flow {
        while self.head.is_none()
            && !self.tags_closed
            && self.pubsub_taken < self.link.pubsub_sent.load(Ordering::Acquire)
        {
            self.flush().await;
            match self.tags.recv().await {
                Some(tag) => {
                    if self.begin(tag).await == Flow::Close {
                        return Flow::Close;
                    }
                }
                None => self.tags_closed = true,
            }
        }
        Flow::Continue
    }

    /// Tells the reader which database the commands after the tags taken so
    /// far run in, and whether Redis has the connection authenticated (see
    /// [`Cmd::moves_state`]).
    fn publish_db(&self) {
        self.link.db.send_replace(Selected {
            done: self.taken,
            db: self.session.next_db(),
            authed: self.session.authed(),
        });
    }

    fn parse(&self, len: usize) -> Result<Frame, frame::ProtocolError> {
        match frame::parse(&self.buf[..len], &self.shared.reply_limits)? {
            Some((frame, n)) if n == len => Ok(frame),
            _ => Err(frame::ProtocolError::Desync),
        }
    }

    /// Moves the first `len` bytes of the buffer to the client's output.
    fn forward(&mut self, len: usize) {
        let bytes = self.buf.split_to(len);
        self.answer(&bytes);
    }

    /// Queues `bytes` for the client, unless it is gone or the reply is
    /// withheld from it.
    fn answer(&mut self, bytes: &[u8]) {
        if !self.client_gone && !self.mute {
            self.out.extend_from_slice(bytes);
        }
    }

    /// Writes the gathered output. A client that is gone is not an error
    /// here: the replies still in flight are read and their pushes settled.
    async fn flush(&mut self) {
        if !self.out.is_empty() && !self.client_gone {
            if let Err(e) = self.client.write_all(&self.out).await {
                tracing::debug!(conn = self.id, error = %e, "client stopped reading replies");
                self.client_gone = true;
            }
        }
        self.out.clear();
        let now = Instant::now();
        for (cost, ready) in self.answered.drain(..) {
            let own = cost + now.saturating_duration_since(ready);
            self.shared.latency.record(own.as_secs_f64());
        }
    }

    /// Awaits `fut`, writing the output first if it is not ready at once:
    /// a reply must never wait unsent behind Postgres or the mirror buffer.
    async fn settle<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        if let Poll::Ready(out) = poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
            return out;
        }
        self.flush().await;
        fut.await
    }

    /// Queues a push Redis took for its mirror copy. Waits for room in the
    /// mirror's buffer: that wait is the backpressure on this client.
    async fn mirror(&mut self, push: MirrorPush) {
        let route = push.route.name.clone();
        let mirror = self.shared.mirror.clone();
        let queued = match push.due {
            // Members of a schedule or retry set: copies due at their times.
            Some(due) => {
                let items = push.items.into_iter().zip(due).collect();
                self.settle(mirror.mirror_due(push.route, items, Some(push.routed)))
                    .await
            }
            None => {
                let acked = (Instant::now(), self.link.server.clone());
                let (ledger_only, routed) = (push.ledger_only, Some(push.routed));
                let queued = mirror.mirror_as(push.route, push.items, acked, ledger_only, routed);
                self.settle(queued).await
            }
        };
        if let Err(e) = queued {
            tracing::warn!(conn = self.id, route = %route, error = %e, "push taken by Redis but not mirrored");
        }
    }

    /// A routed push answered by the proxy: `+QUEUED` inside MULTI (written
    /// at EXEC), otherwise its item count once Postgres has committed it.
    async fn local(&mut self, push: LocalPush) {
        let silenced = self.session.start_local();
        if self.session.in_multi() {
            if !silenced {
                self.out.extend_from_slice(b"+QUEUED\r\n");
            }
            self.session.queue_local(push);
            return;
        }
        let result = self.settle(store(Arc::clone(&self.shared), push)).await;
        if !silenced {
            self.out.extend_from_slice(&local_reply(&result));
        }
    }

    /// After MONITOR: every byte from Redis goes to the client unparsed
    /// until either side closes or the server stops.
    async fn pass_through(&mut self) -> Flow {
        let rest = self.buf.split();
        self.out.extend_from_slice(&rest);
        self.flush().await;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return Flow::Close,
                read = self.upstream.read(&mut chunk) => match read {
                    Ok(n) if n > 0 => n,
                    _ => return Flow::Close,
                },
            };
            if self.client.write_all(&chunk[..n]).await.is_err() {
                return Flow::Close;
            }
        }
    }
}

#[cfg(test)]
mod tests;
