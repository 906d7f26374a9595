//! kombu's `unacked` hash, and what a channel's restore proves.
//!
//! Why: a Celery worker's channel keeps each task it took in the hash
//! `unacked` (delivery tag → `[message, exchange, routing_key]`) until it
//! acks it. When the channel gives tasks back (at shutdown, or kombu's
//! `basic_recover`), it restores each one on its own client, not on the
//! connection whose BRPOP took it: WATCH `unacked`, `HGET unacked <tag>`,
//! then MULTI, `ZREM unacked_index <tag>`, `HDEL unacked <tag>`, a push of
//! the message, EXEC. After the flip that push is answered by the proxy and
//! never reaches Redis; the key is a mirror copy, so without evidence that
//! the Redis side let go of the task it was held for ever.
//!
//! The evidence is Redis's own replies on one connection: the `HGET` named
//! the entry (so the job it wraps), and the `HDEL` of that tag answered 1
//! (the entry was there and is gone: no worker holds the task any more).
//! Both are needed: a push of the same key with no such `HDEL` may be a
//! client's retry while the worker runs the task, and stays held. The
//! entries a connection read are remembered (the latest [`REMEMBERED`]);
//! an `HDEL` of a tag this connection did not read proves nothing.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;

use super::set_pop::SetPop;

/// The entries a connection remembers having read.
const REMEMBERED: usize = 1024;

/// `HGET hash tag` of an `unacked` hash: its reply is remembered.
#[derive(Debug, Clone)]
pub(super) struct UnackedRead {
    pub hash: Bytes,
    pub tag: Bytes,
}

/// What a command on a kombu `unacked` hash is to the proxy.
#[derive(Debug, Clone)]
pub(super) enum Unacked {
    /// An entry read: remember it.
    Read(UnackedRead),
    /// Entries taken out (`HDEL hash tag…`): a pop whose members are tags.
    Delete(SetPop),
}

/// Whether `name args…` reads or deletes entries of a hash `is_unacked`
/// accepts.
pub(super) fn classify(
    name: &str,
    args: &[Bytes],
    is_unacked: impl Fn(&[u8]) -> bool,
) -> Option<Unacked> {
    match name {
        "HGET" if args.len() == 3 && is_unacked(&args[1]) => Some(Unacked::Read(UnackedRead {
            hash: args[1].clone(),
            tag: args[2].clone(),
        })),
        "HDEL" if args.len() >= 3 && is_unacked(&args[1]) => Some(Unacked::Delete(SetPop {
            set: args[1].clone(),
            named: Some(args[2..].to_vec()),
        })),
        _ => None,
    }
}

/// The `unacked` entries a connection read: (hash, tag, entry).
#[derive(Debug, Default)]
pub(super) struct Seen(Mutex<VecDeque<(Bytes, Bytes, Bytes)>>);

impl Seen {
    pub(super) fn add(&self, hash: Bytes, tag: Bytes, entry: Bytes) {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() == REMEMBERED {
            seen.pop_front();
        }
        seen.push_back((hash, tag, entry));
    }

    /// The entry this connection read for `tag` of `hash`, forgotten now
    /// (one read explains one deletion).
    pub(super) fn take(&self, hash: &[u8], tag: &[u8]) -> Option<Bytes> {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let i = seen
            .iter()
            .rposition(|(h, t, _)| h.as_ref() == hash && t.as_ref() == tag)?;
        seen.remove(i).map(|(_, _, entry)| entry)
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

    #[test]
    fn reads_and_deletions_of_an_unacked_hash_are_told_apart() {
        let unacked = |k: &[u8]| k == b"unacked";
        assert!(matches!(
            classify("HGET", &args(&["HGET", "unacked", "t1"]), unacked),
            Some(Unacked::Read(_))
        ));
        assert!(matches!(
            classify("HDEL", &args(&["HDEL", "unacked", "t1", "t2"]), unacked),
            Some(Unacked::Delete(SetPop { named: Some(ref tags), .. })) if tags.len() == 2
        ));
        assert!(classify("HGET", &args(&["HGET", "other", "t1"]), unacked).is_none());
        assert!(classify("HSET", &args(&["HSET", "unacked", "t1", "v"]), unacked).is_none());
    }

    #[test]
    fn one_read_explains_one_deletion() {
        let seen = Seen::default();
        seen.add("unacked".into(), "t1".into(), "entry".into());
        assert_eq!(seen.take(b"unacked", b"t1").as_deref(), Some(&b"entry"[..]));
        assert!(seen.take(b"unacked", b"t1").is_none());
        assert!(seen.take(b"unacked", b"t2").is_none());
    }
}
