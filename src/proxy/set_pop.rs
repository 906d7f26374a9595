//! Commands that take members out of a framework's schedule or retry set
//! (Sidekiq's `schedule` and `retry`), and what Redis's reply proves.
//!
//! Why: a job scheduled while Redis owned the route has a mirror copy in
//! Postgres. When the framework's poller moves it to the list after the flip
//! to `postgres_only`, its push is answered by the proxy and never reaches
//! Redis, so it can only run in Postgres. But a push of a key Postgres holds
//! as a mirror copy is a re-push, run live only on positive evidence that
//! Redis let go of the original (`ingest::promote`). Redis's reply to the
//! pop is that evidence: it names the member it removed. The reply side
//! records it (`ingest::release`) before the client sees the reply, so the
//! push the client sends next finds it.
//!
//! What counts as a pop (anything else proves nothing):
//! - `ZREM set member…` answered with the number of members given: each was
//!   there and is gone.
//! - `HDEL hash field…` of kombu's `unacked` hash answered likewise, inside
//!   a transaction that pushes the entry's message: see `super::held_read`.
//! - A Lua script (`EVAL`, or `EVALSHA` of a script `super::pop_scripts`
//!   knows: a framework poller's, or one any proxy saw loaded with
//!   `SCRIPT LOAD` or run with `EVAL`) whose first key is the set, whose
//!   source calls `ZREM`, and whose reply is members of the set: Sidekiq's
//!   poller pops a due job that way (its `zpopbyscore` script, 6.3 to 8.x).
//!   A script no proxy knows proves nothing: its pushes are held as before,
//!   and the diff shows them.

use bytes::Bytes;

use super::frame::Frame;
use super::pop_scripts::{calls_zrem, PopScripts};

/// A command that may take members out of a mirrored set.
#[derive(Debug, Clone)]
pub(super) struct SetPop {
    /// The set's key.
    pub set: Bytes,
    /// `ZREM`'s members, or `HDEL`'s fields; `None` for a script (its reply
    /// names them).
    pub named: Option<Vec<Bytes>>,
    /// `named` are fields of a hash of held jobs (kombu's `unacked`): the
    /// members are the entries this connection read (`super::held_read`).
    pub fields: bool,
    /// For `fields`: the values read for them, given at EXEC.
    pub held: Vec<Bytes>,
}

/// Whether `name args…` may take members out of a set `is_set` accepts;
/// learns the scripts it sees on the way (`SCRIPT LOAD`, `EVAL`).
pub(super) fn classify(
    name: &str,
    args: &[Bytes],
    scripts: &PopScripts,
    is_set: impl Fn(&[u8]) -> bool,
) -> Option<SetPop> {
    match name {
        "SCRIPT" if args.len() == 3 && args[1].eq_ignore_ascii_case(b"LOAD") => {
            scripts.learn(&args[2]);
            None
        }
        "ZREM" | "HDEL" if args.len() >= 3 && is_set(&args[1]) => Some(SetPop {
            set: args[1].clone(),
            named: Some(args[2..].to_vec()),
            fields: name == "HDEL",
            held: Vec::new(),
        }),
        "EVAL" | "EVALSHA" if args.len() >= 4 => {
            let first_key_count = std::str::from_utf8(&args[2]).ok()?.parse::<usize>().ok()?;
            if first_key_count == 0 || !is_set(&args[3]) {
                return None;
            }
            let pops = match name {
                "EVAL" => {
                    scripts.learn(&args[1]);
                    calls_zrem(&args[1])
                }
                _ => scripts.knows(&args[1]),
            };
            pops.then(|| SetPop {
                set: args[3].clone(),
                named: None,
                fields: false,
                held: Vec::new(),
            })
        }
        _ => None,
    }
}

/// The members Redis's `reply` says it took out of the set; empty when it
/// proves nothing (an error, nil, a count short of the members named).
pub(super) fn handed_out(pop: &SetPop, reply: &Frame) -> Vec<Bytes> {
    match (&pop.named, reply) {
        (Some(named), reply) if reply.as_integer() == Some(named.len() as i64) => named.clone(),
        (Some(_), _) => Vec::new(),
        (None, Frame::Bulk(member)) => vec![member.clone()],
        (None, Frame::Array(items)) => items
            .iter()
            .map(|item| match item {
                Frame::Bulk(member) => Some(member.clone()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default(),
        (None, _) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Bytes> {
        words
            .iter()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect()
    }

    const POP: &str =
        "local j = redis.call('zrangebyscore', KEYS[1], '-inf', ARGV[1], 'limit', 0, 1)\n\
                       if j[1] then redis.call('ZREM', KEYS[1], j[1]) return j[1] end";

    fn is_schedule(key: &[u8]) -> bool {
        key == b"schedule"
    }

    use sha1::{Digest, Sha1};

    #[test]
    fn a_script_is_a_pop_once_seen_loaded_and_only_on_the_set() {
        let scripts = PopScripts::default();
        let sha = format!("{:x}", Sha1::digest(POP.as_bytes()));
        let evalsha = args(&["EVALSHA", &sha, "1", "schedule", "123.0"]);
        assert!(classify("EVALSHA", &evalsha, &scripts, is_schedule).is_none());
        classify(
            "SCRIPT",
            &args(&["SCRIPT", "LOAD", POP]),
            &scripts,
            is_schedule,
        );
        let pop = classify("EVALSHA", &evalsha, &scripts, is_schedule).expect("a pop");
        assert_eq!(&pop.set[..], b"schedule");
        let upper = args(&["EVALSHA", &sha.to_uppercase(), "1", "schedule", "1"]);
        assert!(classify("EVALSHA", &upper, &scripts, is_schedule).is_some());
        let other_set = args(&["EVALSHA", &sha, "1", "mine", "1"]);
        assert!(classify("EVALSHA", &other_set, &scripts, is_schedule).is_none());
        let no_keys = args(&["EVALSHA", &sha, "0", "schedule"]);
        assert!(classify("EVALSHA", &no_keys, &scripts, is_schedule).is_none());
    }

    #[test]
    fn a_script_that_removes_nothing_is_no_pop() {
        let scripts = PopScripts::default();
        let peek = "return redis.call('zrange', KEYS[1], 0, 0)[1]";
        let eval = args(&["EVAL", peek, "1", "schedule"]);
        assert!(classify("EVAL", &eval, &scripts, is_schedule).is_none());
        let eval = args(&["EVAL", POP, "1", "schedule", "1"]);
        assert!(classify("EVAL", &eval, &scripts, is_schedule).is_some());
    }

    #[test]
    fn only_a_full_count_or_named_members_prove_a_removal() {
        let zrem = SetPop {
            set: Bytes::from_static(b"schedule"),
            named: Some(args(&["a", "b"])),
            fields: false,
            held: Vec::new(),
        };
        assert_eq!(handed_out(&zrem, &Frame::Integer(2)).len(), 2);
        assert!(handed_out(&zrem, &Frame::Integer(1)).is_empty());
        assert!(handed_out(&zrem, &Frame::Error(Bytes::from_static(b"ERR x"))).is_empty());
        let script = SetPop {
            set: Bytes::from_static(b"schedule"),
            named: None,
            fields: false,
            held: Vec::new(),
        };
        let member = Bytes::from_static(b"{\"jid\":\"1\"}");
        assert_eq!(
            handed_out(&script, &Frame::Bulk(member.clone())),
            vec![member.clone()]
        );
        assert!(handed_out(&script, &Frame::NullBulk).is_empty());
        assert!(handed_out(&script, &Frame::Integer(1)).is_empty());
        let mixed = Frame::Array(vec![Frame::Bulk(member), Frame::Integer(1)]);
        assert!(handed_out(&script, &mixed).is_empty());
    }
}
