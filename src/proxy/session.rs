//! The state of one upstream connection as far as reply pairing and routing
//! depend on it: the protocol (RESP2/RESP3), the subscription sets, CLIENT
//! REPLY, the commands queued in a MULTI, the selected database, and
//! whether Redis has the connection authenticated.
//!
//! It is updated only from replies, in order, on the reply side: Redis's own
//! answers are the truth (a MULTI refused by an ACL, a HELLO 3 that failed
//! AUTH), whereas the reader can only guess from the commands. No I/O here,
//! so every rule is unit-tested below.

use std::collections::HashSet;

use bytes::Bytes;

use super::command::{Cmd, Family, LocalPush, MirrorPush, ReplyMode};
use super::frame::Frame;
use super::held_read::HeldReads;
use super::list_pop::popped;
use super::set_pop::{handed_out, SetPop};

/// How the command at the head of the line is answered by Redis. Redis
/// answers every forwarded command: the proxy keeps its replies on
/// (`CLIENT REPLY OFF|SKIP` reach it as `CLIENT REPLY ON`) and withholds
/// from the client what a client's own `CLIENT REPLY` silences
/// ([`Session::start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// One reply.
    One,
    /// `left` pub/sub confirmations of this family and direction, or one
    /// error instead.
    Confirmations {
        family: Family,
        subscribe: bool,
        left: usize,
    },
}

/// One command Redis or the proxy queued inside MULTI.
#[derive(Debug)]
pub(super) enum Entry {
    /// Queued by Redis (`+QUEUED`): its result is the next element of
    /// EXEC's array. A routed push is mirrored if that element is an integer.
    Redis(Option<MirrorPush>),
    /// A routed push the proxy answered `+QUEUED` itself; its result is
    /// spliced into EXEC's array.
    Local(LocalPush),
    /// A SELECT queued by Redis: the database changes at EXEC, if its
    /// element of EXEC's array is `+OK`.
    Select(Option<i64>),
    /// A pop from a framework's set queued by Redis (RQ's scheduler moves a
    /// due job with a push and a `ZREM` in one MULTI): its element of EXEC's
    /// array says which members Redis handed out.
    Pop(SetPop),
}

/// What the reply side does with the head command's reply.
#[derive(Debug)]
pub(super) enum Action {
    /// Forward the bytes unchanged.
    Forward,
    /// Forward, and mirror the push (Redis took it).
    Mirror(MirrorPush),
    /// EXEC's array arrived: settle the queued entries (mirror, splice).
    Exec(Vec<Entry>),
    /// Forward, then pass every further byte through unparsed.
    Monitor,
    /// Redis took the client's `CLIENT REPLY OFF|SKIP` (sent to it as
    /// `CLIENT REPLY ON`): that answers nothing.
    Drop,
    /// Redis took `CLIENT REPLY ON`, which turns replies on before it
    /// answers: its `+OK` reaches the client even while replies were off.
    ForwardAlways,
    /// Evidence of what Redis handed out: record or remember it, then
    /// forward.
    Evidence(Evidence),
}

/// What a reply proves about jobs leaving Redis's hands.
#[derive(Debug)]
pub(super) enum Evidence {
    /// Redis took these members out of the set (in this database, when
    /// known): recorded (`super::set_pop`).
    Released(SetPop, Vec<Bytes>, Option<i64>),
    /// Redis handed these (list, item) pairs to the client (in this
    /// database, when known): remembered (`super::list_pop`).
    Taken(Vec<(Bytes, Bytes)>, Option<i64>),
}

/// See the module docs.
#[derive(Debug)]
pub(super) struct Session {
    resp3: bool,
    /// Channels, patterns and shard channels, by [`Family`] index.
    subs: [HashSet<Bytes>; 3],
    replies_off: bool,
    /// The next command's reply is skipped (CLIENT REPLY SKIP).
    skip_next: bool,
    /// Some while Redis has the connection in MULTI.
    multi: Option<Vec<Entry>>,
    /// The selected database; `None` after a SELECT Redis took whose index
    /// the proxy could not read (no route matches then).
    db: Option<i64>,
    /// Whether Redis would run commands on the connection: `+OK` to AUTH or
    /// a successful HELLO (which Redis refuses unauthenticated) set it; RESET
    /// returns to [`Session::authed_at_start`].
    authed: bool,
    /// Whether a fresh connection needs no AUTH (the default user has no
    /// password), as the connection's probe found.
    authed_at_start: bool,
    /// The entries of held-job hashes read since the last transaction
    /// ended (`super::held_read`).
    held_reads: HeldReads,
}

/// A connection that needs no AUTH; the unit tests start from it.
#[cfg(test)]
impl Default for Session {
    fn default() -> Session {
        Session::new(true)
    }
}

fn index(family: Family) -> usize {
    match family {
        Family::Channel => 0,
        Family::Pattern => 1,
        Family::Shard => 2,
    }
}

const MESSAGES: [&[u8]; 3] = [b"message", b"pmessage", b"smessage"];

const CONFIRMATIONS: [&[u8]; 6] = [
    b"subscribe",
    b"psubscribe",
    b"ssubscribe",
    b"unsubscribe",
    b"punsubscribe",
    b"sunsubscribe",
];

/// Whether `frame` is a pub/sub confirmation (RESP2 array or RESP3 push):
/// Redis delivers those whatever the client's CLIENT REPLY, also from
/// inside EXEC.
pub(super) fn is_confirmation(frame: &Frame) -> bool {
    match frame {
        Frame::Array(items) | Frame::Push(items) => matches!(
            &items[..],
            [Frame::Bulk(kind), _, Frame::Integer(_)] if CONFIRMATIONS.contains(&kind.as_ref())
        ),
        _ => false,
    }
}

/// Whether `frame` is a RESP3 push that may be a pub/sub confirmation, i.e.
/// may belong to a command whose tag has not reached the reply side yet.
pub(super) fn may_confirm(frame: &Frame) -> bool {
    match frame {
        Frame::Push(items) => matches!(
            items.first(),
            Some(Frame::Bulk(kind)) if CONFIRMATIONS.contains(&kind.as_ref())
        ),
        Frame::Attribute { frame, .. } => may_confirm(frame),
        _ => false,
    }
}

impl Session {
    /// A fresh connection's state; `authed`: see [`Session::authed_at_start`].
    pub(super) fn new(authed: bool) -> Session {
        Session {
            resp3: false,
            subs: Default::default(),
            replies_off: false,
            skip_next: false,
            multi: None,
            // A new connection (and RESET) starts in database 0.
            db: Some(0),
            authed,
            authed_at_start: authed,
            held_reads: HeldReads::default(),
        }
    }

    /// Back to a fresh connection's state (RESET).
    fn reset(&mut self) {
        *self = Session::new(self.authed_at_start);
    }

    /// Whether Redis would run a command on this connection now.
    pub(super) fn authed(&self) -> bool {
        self.authed
    }

    /// Whether Redis speaks RESP3 on this connection.
    #[cfg(test)]
    pub(super) fn resp3(&self) -> bool {
        self.resp3
    }

    /// Whether Redis has the connection in MULTI.
    pub(super) fn in_multi(&self) -> bool {
        self.multi.is_some()
    }

    /// The database the commands after the last one answered run in. Inside
    /// MULTI that is the last queued SELECT's (if EXEC runs and it succeeds
    /// there; see the module docs of `proxy`), otherwise the selected one.
    pub(super) fn next_db(&self) -> Option<i64> {
        let queued = self.multi.iter().flatten().rev().find_map(|e| match e {
            Entry::Select(db) => Some(*db),
            _ => None,
        });
        queued.unwrap_or(self.db)
    }

    /// A queued SELECT succeeded at EXEC.
    pub(super) fn selected(&mut self, db: Option<i64>) {
        self.db = db;
    }

    fn subscribed(&self) -> bool {
        self.subs.iter().any(|s| !s.is_empty())
    }

    /// Whether the client's CLIENT REPLY state withholds the answer to the
    /// command now at the head (Redis's rule: SKIP silences the next
    /// command, OFF every command). The state itself changes only on
    /// Redis's answer ([`Session::on_reply`]).
    fn silenced(&mut self) -> bool {
        let skipped = std::mem::take(&mut self.skip_next);
        self.replies_off || skipped
    }

    /// How the forwarded command now at the head will be answered, and
    /// whether that answer is withheld from the client.
    pub(super) fn start(&mut self, cmd: &Cmd) -> (Expect, bool) {
        let silent = match cmd {
            // RESET turns CLIENT REPLY OFF back on before it answers: only
            // a SKIP on it silences it (SKIP is ignored while OFF).
            Cmd::Reset => std::mem::take(&mut self.skip_next),
            _ => self.silenced(),
        };
        (self.expect(cmd), silent)
    }

    fn expect(&self, cmd: &Cmd) -> Expect {
        if self.in_multi() {
            // Everything is answered once while queuing (+QUEUED or an error).
            return Expect::One;
        }
        match *cmd {
            Cmd::Subscribe { family, count } => Expect::Confirmations {
                family,
                subscribe: true,
                left: count,
            },
            Cmd::Unsubscribe { family, count } => Expect::Confirmations {
                family,
                subscribe: false,
                left: if count == 0 {
                    self.subs[index(family)].len().max(1)
                } else {
                    count
                },
            },
            _ => Expect::One,
        }
    }

    /// Like [`Session::start`] for a push the proxy answers: whether its
    /// reply is withheld.
    pub(super) fn start_local(&mut self) -> bool {
        self.silenced()
    }

    /// Queues a locally answered push in the current MULTI.
    pub(super) fn queue_local(&mut self, push: LocalPush) {
        if let Some(entries) = &mut self.multi {
            entries.push(Entry::Local(push));
        }
    }

    /// Whether the reply of `cmd` must be parsed (not just forwarded).
    pub(super) fn inspects(&self, cmd: &Cmd) -> bool {
        self.in_multi()
            || matches!(
                cmd,
                Cmd::Push(_)
                    | Cmd::SetPop(_)
                    | Cmd::ListPop(_)
                    | Cmd::HeldRead(..)
                    | Cmd::ClientReply(_)
                    | Cmd::Select(_)
                    | Cmd::Multi
                    | Cmd::Reset
                    | Cmd::Hello
                    | Cmd::Auth
                    | Cmd::Subscribe { .. }
                    | Cmd::Unsubscribe { .. }
            )
    }

    /// Whether a frame starting with `first` may be out of band, so it must
    /// be parsed before it is paired with a command.
    pub(super) fn maybe_out_of_band(&self, first: u8) -> bool {
        first == b'>' || first == b'|' || (first == b'*' && !self.resp3 && self.subscribed())
    }

    /// Whether `frame` is out of band: a RESP3 push, or a RESP2 pub/sub
    /// message while subscribed. A confirmation the head command is waiting
    /// for (`head`) is in band. Pushed confirmations update the sets either way.
    pub(super) fn out_of_band(&mut self, frame: &Frame, head: Option<(Family, bool)>) -> bool {
        match frame {
            Frame::Push(items) => {
                if let Some((family, subscribe)) = head {
                    if self.confirmation(items, family, subscribe) {
                        return false;
                    }
                }
                for family in [Family::Channel, Family::Pattern, Family::Shard] {
                    for subscribe in [true, false] {
                        if self.confirmation(items, family, subscribe) {
                            return true;
                        }
                    }
                }
                true
            }
            Frame::Array(items) if !self.resp3 && self.subscribed() => matches!(
                items.first(),
                Some(Frame::Bulk(kind)) if MESSAGES.contains(&kind.as_ref())
            ),
            Frame::Attribute { frame, .. } => self.out_of_band(frame, head),
            _ => false,
        }
    }

    /// If `frame` is a confirmation of this family and direction, records it
    /// in the subscription sets and returns true.
    pub(super) fn confirm(&mut self, frame: &Frame, family: Family, subscribe: bool) -> bool {
        match frame {
            Frame::Array(items) | Frame::Push(items) => self.confirmation(items, family, subscribe),
            _ => false,
        }
    }

    fn confirmation(&mut self, items: &[Frame], family: Family, subscribe: bool) -> bool {
        let kind = if subscribe {
            family.subscribed()
        } else {
            family.unsubscribed()
        };
        let [Frame::Bulk(first), channel, Frame::Integer(_)] = items else {
            return false;
        };
        if first.as_ref() != kind {
            return false;
        }
        let set = &mut self.subs[index(family)];
        match (channel, subscribe) {
            (Frame::Bulk(name), true) => {
                set.insert(name.clone());
            }
            (Frame::Bulk(name), false) => {
                set.remove(name);
            }
            // "unsubscribe from nothing" names no channel.
            _ => {}
        }
        true
    }

    /// Updates the state from the single reply of `cmd` (`frame` is the
    /// parsed reply when [`Session::inspects`] asked for it) and says what
    /// to do with it.
    pub(super) fn on_reply(&mut self, cmd: Cmd, frame: Option<&Frame>) -> Action {
        let simple = |word: &[u8]| matches!(frame, Some(Frame::Simple(s)) if s.as_ref() == word);
        if let Cmd::Monitor = cmd {
            // The reader passes bytes through unparsed from MONITOR on, even
            // if Redis refused it, so this side must too.
            return Action::Monitor;
        }
        if let Some(entries) = &mut self.multi {
            match cmd {
                Cmd::Exec => {
                    let mut entries = std::mem::take(entries);
                    self.multi = None;
                    let reads = std::mem::take(&mut self.held_reads);
                    return match frame {
                        Some(Frame::Array(_)) => {
                            give_reads(reads, &mut entries, self.db);
                            Action::Exec(entries)
                        }
                        // Aborted by WATCH (nil) or EXECABORT: nothing ran.
                        _ => Action::Forward,
                    };
                }
                Cmd::Discard => {
                    self.multi = None;
                    self.held_reads = HeldReads::default();
                }
                Cmd::Reset if simple(b"RESET") => self.reset(),
                Cmd::Push(push) if simple(b"QUEUED") => entries.push(Entry::Redis(Some(push))),
                Cmd::Select(db) if simple(b"QUEUED") => entries.push(Entry::Select(db)),
                Cmd::SetPop(pop) if simple(b"QUEUED") => entries.push(Entry::Pop(pop)),
                _ if simple(b"QUEUED") => entries.push(Entry::Redis(None)),
                // An error: Redis did not queue it (EXEC will abort).
                _ => {}
            }
            return Action::Forward;
        }
        match cmd {
            // CLIENT REPLY ON clears OFF and SKIP before it answers `+OK`;
            // OFF and SKIP (sent as ON) take effect once Redis took them,
            // and answer nothing. A refusal (NOAUTH, NOPERM) changes
            // nothing and is forwarded.
            Cmd::ClientReply(mode) if simple(b"OK") => {
                return match mode {
                    ReplyMode::On => {
                        (self.replies_off, self.skip_next) = (false, false);
                        Action::ForwardAlways
                    }
                    ReplyMode::Off => {
                        self.replies_off = true;
                        Action::Drop
                    }
                    ReplyMode::Skip => {
                        self.skip_next = !self.replies_off;
                        Action::Drop
                    }
                };
            }
            Cmd::Multi if simple(b"OK") => self.multi = Some(Vec::new()),
            Cmd::Select(db) if simple(b"OK") => self.db = db,
            Cmd::Reset if simple(b"RESET") => self.reset(),
            // A HELLO that answers ran authenticated (with its AUTH option
            // or on a connection that already was).
            Cmd::Hello => match frame {
                Some(Frame::Map(_)) => (self.resp3, self.authed) = (true, true),
                Some(Frame::Array(_)) => (self.resp3, self.authed) = (false, true),
                _ => {}
            },
            // A failed AUTH leaves the connection as it was, as in Redis.
            Cmd::Auth if simple(b"OK") => self.authed = true,
            Cmd::Push(push) if took(frame) => return Action::Mirror(push),
            // A removal of held entries counts only inside a transaction.
            Cmd::SetPop(pop) if !pop.fields => {
                let members = frame.map(|f| handed_out(&pop, f)).unwrap_or_default();
                if !members.is_empty() {
                    return Action::Evidence(Evidence::Released(pop, members, self.db));
                }
            }
            Cmd::ListPop(pop) => {
                let items = frame.map(|f| popped(&pop, f)).unwrap_or_default();
                if !items.is_empty() {
                    return Action::Evidence(Evidence::Taken(items, self.db));
                }
            }
            Cmd::HeldRead(hash, field) => {
                let value = match frame {
                    Some(Frame::Bulk(value)) => Some(value.clone()),
                    _ => None,
                };
                self.held_reads.read(self.db, hash, field, value);
            }
            _ => {}
        }
        Action::Forward
    }
}

/// Whether a push's reply says Redis took the items: the new length, which
/// is at least 1. LPUSHX/RPUSHX answer 0 when the list does not exist and
/// they pushed nothing, so nothing is mirrored for them.
pub(super) fn took(reply: Option<&Frame>) -> bool {
    reply.and_then(Frame::as_integer).is_some_and(|n| n > 0)
}

#[cfg(test)]
#[path = "session/tests.rs"]
mod tests;

/// At a transaction's EXEC (in database `db`): each removal of held entries
/// in it gets the values this connection read for its fields
/// (`SetPop::held`, see `super::held_read`); the reads are used up.
fn give_reads(mut reads: HeldReads, entries: &mut [Entry], db: Option<i64>) {
    for entry in entries {
        let Entry::Pop(pop) = entry else { continue };
        if pop.fields {
            let fields = pop.named.iter().flatten();
            pop.held = fields
                .filter_map(|field| reads.take(db, &pop.set, field))
                .collect();
        }
    }
}
