//! What a client command means to the splice, and the tag each command leaves
//! for the reply side.
//!
//! The reader classifies every command by its name only (never by its
//! arguments' contents, which are personal data; SELECT's index is the one
//! argument read), because only a handful of commands change how Redis
//! answers or where a push lands: the pub/sub family (one confirmation per
//! channel), MULTI/EXEC/DISCARD/RESET (queued replies), HELLO (the
//! protocol), CLIENT REPLY (no replies at all), MONITOR (a stream), SELECT
//! (the database routes are matched in) and AUTH (whether the proxy may
//! answer a push itself). Every other command is
//! [`Cmd::Plain`]: one reply.

use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinHandle;

use crate::config::DualWriteMirrors;
use crate::model::following::RoutedPush;
use crate::model::formats::Format;
use crate::model::Phase;
use crate::routes::Route;

/// Which subscription set a pub/sub command works on. Redis keeps three
/// separate sets, and `UNSUBSCRIBE` with no argument answers once per member
/// of its own set only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    /// SUBSCRIBE / UNSUBSCRIBE
    Channel,
    /// PSUBSCRIBE / PUNSUBSCRIBE
    Pattern,
    /// SSUBSCRIBE / SUNSUBSCRIBE
    Shard,
}

impl Family {
    /// The first element of a subscribe confirmation of this family.
    pub(super) fn subscribed(self) -> &'static [u8] {
        match self {
            Family::Channel => b"subscribe",
            Family::Pattern => b"psubscribe",
            Family::Shard => b"ssubscribe",
        }
    }

    /// The first element of an unsubscribe confirmation of this family.
    pub(super) fn unsubscribed(self) -> &'static [u8] {
        match self {
            Family::Channel => b"unsubscribe",
            Family::Pattern => b"punsubscribe",
            Family::Shard => b"sunsubscribe",
        }
    }
}

/// `CLIENT REPLY ON|OFF|SKIP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReplyMode {
    On,
    Off,
    Skip,
}

/// A routed push forwarded to Redis (`dual_write`/`shadow`): mirrored once
/// Redis answers it with an integer (success).
#[derive(Debug, Clone)]
pub(super) struct MirrorPush {
    pub route: Arc<Route>,
    pub items: Vec<Bytes>,
    /// For members added to a framework's schedule or retry set (`ZADD`):
    /// when each is due (its score). `None` for a list push.
    pub due: Option<Vec<Option<chrono::DateTime<chrono::Utc>>>>,
    /// Pushed in `dual_write` on a route whose mirror copies are ledger
    /// entries there (`[routes.shadow] dual_write = "ledger"`, the default):
    /// recorded in `job_keys` alone (`ingest::Item::ledger_only`).
    pub ledger_only: bool,
    /// Counts the push as routed until its mirror copy is written.
    pub routed: RoutedPush,
}

impl MirrorPush {
    /// A push of `items` on `route` read in `phase`. An RQ item keeps its
    /// row: its payload carries the job's hash read from Redis (`rq:job:<id>`),
    /// which the ledger's bytes (the id alone) do not.
    pub fn new(
        route: Arc<Route>,
        items: Vec<Bytes>,
        phase: Phase,
        routed: RoutedPush,
    ) -> MirrorPush {
        let ledger_only = phase == Phase::DualWrite
            && route.config.cutover.shadow.dual_write == DualWriteMirrors::Ledger
            && route.format != Format::Rq;
        MirrorPush {
            route,
            items,
            due: None,
            ledger_only,
            routed,
        }
    }
}

/// The `(score, member)` pairs of `ZADD key [NX|XX] [GT|LT] [CH] score
/// member …` (`args` from the key on). `None` for `INCR` (it adds to a
/// score, it does not add a job), a score that is not a number, or pairs
/// that do not pair up: Redis answers those, nothing is mirrored.
pub(super) fn zadd_members(args: &[Bytes]) -> Option<Vec<(f64, &Bytes)>> {
    let mut rest = args.get(1..)?;
    while let Some(flag) = rest.first() {
        match flag.to_ascii_uppercase().as_slice() {
            b"NX" | b"XX" | b"GT" | b"LT" | b"CH" => rest = &rest[1..],
            b"INCR" => return None,
            _ => break,
        }
    }
    if rest.is_empty() || rest.len() % 2 != 0 {
        return None;
    }
    rest.chunks(2)
        .map(|pair| {
            let score: f64 = std::str::from_utf8(&pair[0]).ok()?.parse().ok()?;
            Some((score, &pair[1]))
        })
        .collect()
}

/// A forwarded command, as far as reply pairing cares.
#[derive(Debug)]
pub(super) enum Cmd {
    /// One reply.
    Plain,
    /// A routed push in `dual_write`/`shadow`.
    Push(MirrorPush),
    /// A command that may take members out of a framework's set
    /// (`super::set_pop`).
    SetPop(super::set_pop::SetPop),
    /// A pop from a routed list (`super::list_pop`).
    ListPop(super::list_pop::ListPop),
    /// A read of one entry (hash, field) of a framework's hash of held jobs
    /// (`super::held_read`).
    HeldRead(Bytes, Bytes),
    Multi,
    Exec,
    Discard,
    Reset,
    Hello,
    /// AUTH: Redis's `+OK` authenticates the connection.
    Auth,
    /// `SELECT index`; `None` if the index is not an integer (Redis refuses
    /// it).
    Select(Option<i64>),
    /// MONITOR: after it the connection is a byte stream, not replies.
    Monitor,
    /// `count` confirmations (one per argument), or one error.
    Subscribe {
        family: Family,
        count: usize,
    },
    /// `count` confirmations; 0 means "all": one per member of the set at
    /// the time Redis runs it, or one if the set is empty.
    Unsubscribe {
        family: Family,
        count: usize,
    },
    ClientReply(ReplyMode),
}

impl Cmd {
    /// Whether what routing depends on may differ after this command: the
    /// database (SELECT, RESET, and EXEC/DISCARD, which settle a SELECT
    /// queued in MULTI) or the authentication (AUTH, HELLO, RESET). The
    /// reply side publishes both when it finishes one of these.
    pub(super) fn moves_state(&self) -> bool {
        matches!(
            self,
            Cmd::Select(_) | Cmd::Reset | Cmd::Exec | Cmd::Discard | Cmd::Auth | Cmd::Hello
        )
    }
}

/// The Postgres write of a routed push in `postgres_only`/`decommissioned`.
#[derive(Debug)]
pub(super) enum LocalStore {
    /// Both hold the push's count as routed ([`RoutedPush`]) into the
    /// mirror's request, so it ends with the write, not with the reply.
    ///
    /// Already running (the reader expected no MULTI): resolves to the
    /// number of items stored or the reason it failed.
    Started(JoinHandle<Result<usize, String>>),
    /// Not started: the push was read inside MULTI, so it is written only
    /// if EXEC succeeds.
    Deferred(Vec<Bytes>, RoutedPush),
}

/// A routed push answered by the proxy, not forwarded.
#[derive(Debug)]
pub(super) struct LocalPush {
    pub route: Arc<Route>,
    pub items: usize,
    pub store: LocalStore,
}

/// What the reader tells the reply side about each command, in command
/// order. The n-th tag belongs to the n-th command, which is what keeps
/// pipelined replies paired.
#[derive(Debug)]
pub(super) enum Tag {
    /// A command written to Redis.
    Sent {
        cmd: Cmd,
        /// The proxy's own time on the command before Redis got it (parse,
        /// classify, write), counted into the added-latency histogram.
        cost: std::time::Duration,
    },
    /// A routed push the proxy answers itself.
    Local(LocalPush),
    /// A command the proxy answers with these bytes and never forwards
    /// (`-NOAUTH`, the proxy's own AUTH).
    Answer(&'static [u8]),
    /// The client sent malformed or over-limit RESP: after the replies of
    /// the commands before it, send this line and close.
    Fatal(Vec<u8>),
}

/// Redis's push commands; only these are routed.
pub(super) fn is_push(name: &str) -> bool {
    matches!(name, "LPUSH" | "RPUSH" | "LPUSHX" | "RPUSHX")
}

/// Classifies a command that is not a routed push by its name (upper case,
/// from [`super::frame::command_name`]) and argument count. Commands with the
/// wrong number of arguments are left [`Cmd::Plain`]: Redis answers them with
/// one arity error.
pub(super) fn classify(name: &str, args: &[Bytes]) -> Cmd {
    let argc = args.len();
    let family = |f| (argc >= 2).then_some(f);
    match name {
        "MULTI" => Cmd::Multi,
        "EXEC" => Cmd::Exec,
        "DISCARD" => Cmd::Discard,
        "RESET" => Cmd::Reset,
        "HELLO" => Cmd::Hello,
        "AUTH" => Cmd::Auth,
        "SELECT" if argc == 2 => Cmd::Select(
            std::str::from_utf8(&args[1])
                .ok()
                .and_then(|index| index.parse().ok()),
        ),
        "MONITOR" => Cmd::Monitor,
        "SUBSCRIBE" | "PSUBSCRIBE" | "SSUBSCRIBE" => {
            let f = match name {
                "SUBSCRIBE" => family(Family::Channel),
                "PSUBSCRIBE" => family(Family::Pattern),
                _ => family(Family::Shard),
            };
            f.map_or(Cmd::Plain, |family| Cmd::Subscribe {
                family,
                count: argc - 1,
            })
        }
        "UNSUBSCRIBE" => Cmd::Unsubscribe {
            family: Family::Channel,
            count: argc - 1,
        },
        "PUNSUBSCRIBE" => Cmd::Unsubscribe {
            family: Family::Pattern,
            count: argc - 1,
        },
        "SUNSUBSCRIBE" => Cmd::Unsubscribe {
            family: Family::Shard,
            count: argc - 1,
        },
        "CLIENT" if argc == 3 && args[1].eq_ignore_ascii_case(b"REPLY") => {
            let mode = &args[2];
            if mode.eq_ignore_ascii_case(b"ON") {
                Cmd::ClientReply(ReplyMode::On)
            } else if mode.eq_ignore_ascii_case(b"OFF") {
                Cmd::ClientReply(ReplyMode::Off)
            } else if mode.eq_ignore_ascii_case(b"SKIP") {
                Cmd::ClientReply(ReplyMode::Skip)
            } else {
                // A syntax error: one reply.
                Cmd::Plain
            }
        }
        _ => Cmd::Plain,
    }
}

/// The reply to a routed push answered locally: the item count, or an
/// error that makes the producer's own retry run. The reason is one line.
pub(super) fn local_reply(result: &Result<usize, String>) -> Vec<u8> {
    match result {
        Ok(n) => format!(":{n}\r\n").into_bytes(),
        Err(reason) => format!("-ERR qbridge: {}\r\n", one_line(reason)).into_bytes(),
    }
}

/// `reason` with CR and LF replaced, so it fits a RESP error line.
pub(super) fn one_line(reason: &str) -> String {
    reason.replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(parts: &[&str]) -> Vec<Bytes> {
        parts.iter().map(|p| Bytes::from(p.to_string())).collect()
    }

    #[test]
    fn pubsub_counts_follow_arguments() {
        let cmd = classify("SUBSCRIBE", &args(&["subscribe", "a", "b"]));
        assert!(matches!(
            cmd,
            Cmd::Subscribe {
                family: Family::Channel,
                count: 2
            }
        ));
        // No channel: an arity error, one reply.
        assert!(matches!(
            classify("SUBSCRIBE", &args(&["subscribe"])),
            Cmd::Plain
        ));
        let cmd = classify("PUNSUBSCRIBE", &args(&["punsubscribe"]));
        assert!(matches!(
            cmd,
            Cmd::Unsubscribe {
                family: Family::Pattern,
                count: 0
            }
        ));
    }

    #[test]
    fn client_reply_is_recognised_only_in_its_exact_form() {
        let cmd = classify("CLIENT", &args(&["client", "reply", "skip"]));
        assert!(matches!(cmd, Cmd::ClientReply(ReplyMode::Skip)));
        assert!(matches!(
            classify("CLIENT", &args(&["client", "reply", "maybe"])),
            Cmd::Plain
        ));
        assert!(matches!(
            classify("CLIENT", &args(&["client", "reply"])),
            Cmd::Plain
        ));
        assert!(matches!(
            classify("CLIENT", &args(&["client", "id"])),
            Cmd::Plain
        ));
    }

    #[test]
    fn local_replies_are_one_line() {
        assert_eq!(local_reply(&Ok(3)), b":3\r\n");
        assert_eq!(
            local_reply(&Err("down\r\nreally".into())),
            b"-ERR qbridge: down  really\r\n"
        );
    }

    #[test]
    fn zadd_members_pair_scores_with_members_after_the_flags() {
        let cmd = args(&[
            "schedule",
            "NX",
            "ch",
            "1700000000.5",
            "a",
            "1700000001",
            "b",
        ]);
        let members = zadd_members(&cmd).unwrap();
        assert_eq!(members.len(), 2);
        assert_eq!(
            (members[0].0, members[0].1.as_ref()),
            (1_700_000_000.5, &b"a"[..])
        );
        assert!(zadd_members(&args(&["schedule", "INCR", "1", "a"])).is_none());
        assert!(zadd_members(&args(&["schedule", "1", "a", "2"])).is_none());
        assert!(zadd_members(&args(&["schedule", "soon", "a"])).is_none());
    }
}
