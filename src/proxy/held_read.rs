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
//! The evidence is Redis's reply to that HDEL: the entry was there and is
//! gone. It counts only inside a MULTI whose EXEC Redis ran, for an entry
//! this connection read (in the same database) since its last transaction
//! ended, and for the message the same transaction pushes: the message is
//! the entry's value, read here from the HGET's reply (kombu WATCHes the
//! hash, so its EXEC does not run if the entry changed since; a delivery
//! tag names one message, so what was read is what is removed even
//! without the WATCH, which the proxy does not check). Anything else proves
//! nothing and the push stays held: an HDEL outside MULTI, a transaction
//! that pushes no copy of the entry's message (kombu's ack is a MULTI of
//! ZREM and HDEL alone), an entry read on another connection or before an
//! earlier EXEC, DISCARD or RESET, or a nil read.
//!
//! A visibility-timeout restore may give back a message whose worker still
//! runs it; kombu then runs it twice on Redis alone, and the job runs once
//! more in Postgres than a worker's run would tell: the at-least-once of the
//! framework, not a copy qbridge adds.

use bytes::Bytes;

/// The entries a connection remembers between two transactions; a restore
/// reads one entry just before the MULTI that removes it, and every
/// transaction's end forgets them all, so only a few whole messages are
/// ever kept.
const REMEMBERED: usize = 16;

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

/// One entry read: (database, hash, field) and the value Redis answered.
type Read = ((Option<i64>, Bytes, Bytes), Bytes);

/// The entries a connection read since its last transaction ended, latest
/// last: the session's, forgotten at EXEC, DISCARD and RESET.
#[derive(Debug, Default)]
pub(super) struct HeldReads(Vec<Read>);

impl HeldReads {
    /// Redis answered `value` for `field` of `hash` in database `db`; `None`
    /// (nil: no such entry) forgets an earlier read of it.
    pub(super) fn read(
        &mut self,
        db: Option<i64>,
        hash: Bytes,
        field: Bytes,
        value: Option<Bytes>,
    ) {
        let at = (db, hash, field);
        self.0.retain(|(read, _)| *read != at);
        let Some(value) = value else { return };
        if self.0.len() == REMEMBERED {
            self.0.remove(0);
        }
        self.0.push((at, value));
    }

    /// The value this connection read for `field` of `hash` in database
    /// `db`, used up (one read explains one removal).
    pub(super) fn take(&mut self, db: Option<i64>, hash: &[u8], field: &[u8]) -> Option<Bytes> {
        let i = self
            .0
            .iter()
            .position(|((d, h, f), _)| *d == db && h.as_ref() == hash && f.as_ref() == field)?;
        Some(self.0.remove(i).1)
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
    fn a_read_counts_once_in_its_database_and_a_nil_forgets_it() {
        let mut reads = HeldReads::default();
        reads.read(Some(0), b("unacked"), b("t1"), Some(b("[{}]")));
        reads.read(Some(0), b("unacked"), b("t1"), Some(b("[{\"new\":1}]")));
        assert_eq!(reads.take(Some(1), b"unacked", b"t1"), None);
        assert_eq!(
            reads.take(Some(0), b"unacked", b"t1"),
            Some(b("[{\"new\":1}]"))
        );
        assert_eq!(reads.take(Some(0), b"unacked", b"t1"), None);
        reads.read(Some(0), b("unacked"), b("t2"), Some(b("[{}]")));
        reads.read(Some(0), b("unacked"), b("t2"), None);
        assert_eq!(reads.take(Some(0), b"unacked", b"t2"), None);
    }
}
