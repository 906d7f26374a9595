//! The entries of a framework's hash of held jobs (kombu's `unacked`) a
//! connection read, so that Redis's reply to its removal names the job.
//!
//! Why: kombu's Redis transport (Celery) keeps a message a worker took
//! without acking in the hash `unacked` (delivery tag → `[message,
//! exchange, routing_key]`). A warm shutdown, a rejected message with
//! requeue, or another worker's visibility-timeout restore gives it back
//! from whatever connection the pool hands out: `WATCH unacked`, `HGET
//! unacked <tag>`, then one MULTI of `ZREM unacked_index <tag>`, `HDEL
//! unacked <tag>` and the push of the message. After the flip the push is
//! answered by the proxy, and a re-push of a mirrored key runs live only on
//! positive evidence that Redis let go of the original (`ingest::promote`).
//! The evidence is Redis's reply to that HDEL (the entry was there and is
//! gone, in the same transaction as the push, which the WATCH keeps from
//! running if the entry changed since it was read), for an entry this
//! connection read: the message is the entry's value, read here from the
//! HGET's reply. An HDEL of a tag this connection did not read proves
//! nothing (its job is not known), and the push stays held.
//!
//! A visibility-timeout restore may give back a message whose worker still
//! runs it; kombu then runs it twice on Redis alone, and the job runs once
//! more in Postgres than a worker's run would tell: the at-least-once of the
//! framework, not a copy qbridge adds.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;

/// The entries a connection remembers (its latest reads); a restore reads
/// its entry just before it removes it.
const REMEMBERED: usize = 256;

/// Whether `name args…` reads one entry of a hash `is_held` accepts: the
/// hash and the field.
pub(super) fn classify(
    name: &str,
    args: &[Bytes],
    is_held: impl Fn(&[u8]) -> bool,
) -> Option<(Bytes, Bytes)> {
    match name {
        "HGET" if args.len() == 3 && is_held(&args[1]) => Some((args[1].clone(), args[2].clone())),
        _ => None,
    }
}

/// (hash, field) → the value Redis answered, latest last.
#[derive(Debug, Default)]
pub(super) struct HeldReads(Mutex<VecDeque<((Bytes, Bytes), Bytes)>>);

impl HeldReads {
    pub(super) fn add(&self, hash: Bytes, field: Bytes, value: Bytes) {
        let mut reads = self.0.lock().unwrap_or_else(|p| p.into_inner());
        reads.retain(|(at, _)| *at != (hash.clone(), field.clone()));
        if reads.len() == REMEMBERED {
            reads.pop_front();
        }
        reads.push_back(((hash, field), value));
    }

    /// The value this connection read for `field` of `hash` (forgotten now:
    /// one read explains one removal).
    pub(super) fn take(&self, hash: &[u8], field: &[u8]) -> Option<Bytes> {
        let mut reads = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let i = reads
            .iter()
            .position(|((h, f), _)| h.as_ref() == hash && f.as_ref() == field)?;
        reads.remove(i).map(|(_, value)| value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn only_a_read_of_one_entry_of_a_held_hash_counts() {
        let held = |k: &[u8]| k == b"unacked";
        assert!(classify("HGET", &[b("HGET"), b("unacked"), b("t1")], held).is_some());
        assert!(classify("HGET", &[b("HGET"), b("other"), b("t1")], held).is_none());
        assert!(classify("HGETALL", &[b("HGETALL"), b("unacked")], held).is_none());
    }

    #[test]
    fn one_read_explains_one_removal() {
        let reads = HeldReads::default();
        reads.add(b("unacked"), b("t1"), b("[{}]"));
        reads.add(b("unacked"), b("t1"), b("[{\"new\":1}]"));
        assert_eq!(reads.take(b"unacked", b"t1"), Some(b("[{\"new\":1}]")));
        assert_eq!(reads.take(b"unacked", b"t1"), None);
        assert_eq!(reads.take(b"unacked", b"t2"), None);
    }
}
