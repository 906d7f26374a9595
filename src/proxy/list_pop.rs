//! Pops from a routed list, and what they prove when the same connection
//! pushes the job back.
//!
//! Why: a worker that took a job in `shadow` and hands it back after the
//! flip (a raw `BRPOP` then `RPUSH` of the same bytes, a worker giving up a
//! job at shutdown) pushes a key Postgres holds as a mirror copy. Its push
//! is answered by the proxy and never reaches Redis, so the job can only
//! run in Postgres — but a re-push of a mirrored key runs live only on
//! positive evidence that the Redis side let go of the original
//! (`ingest::promote`), and without it the job was held for ever. The
//! evidence is this connection's own history: Redis's reply to its pop
//! named the job, so the job left Redis's list into this client's hands,
//! and the same client pushing it back is giving it up. A push of the same
//! key from any other connection proves nothing (a client's retry while the
//! worker runs the job looks the same) and is held as before.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;

use super::frame::Frame;

/// The pops a connection remembers (its latest), enough for a worker's
/// prefetch; older ones are forgotten (their hand-back is then held).
const REMEMBERED: usize = 1024;

/// A command that may pop items off a routed list.
#[derive(Debug, Clone)]
pub(super) struct ListPop {
    /// The list it pops from when it names one source (`RPOP`, `LMOVE`, …);
    /// `None` for `BLPOP`/`BRPOP`, whose reply names the list.
    pub list: Option<Bytes>,
}

/// Whether `name args…` pops from a list `is_routed` accepts.
pub(super) fn classify(
    name: &str,
    args: &[Bytes],
    is_routed: impl Fn(&[u8]) -> bool,
) -> Option<ListPop> {
    match name {
        "LPOP" | "RPOP" if args.len() >= 2 && is_routed(&args[1]) => Some(ListPop {
            list: Some(args[1].clone()),
        }),
        // A move into a routed list (a rotation) leaves the job in Redis:
        // its push back would run it twice.
        "LMOVE" | "BLMOVE" | "RPOPLPUSH" | "BRPOPLPUSH"
            if args.len() >= 3 && is_routed(&args[1]) && !is_routed(&args[2]) =>
        {
            Some(ListPop {
                list: Some(args[1].clone()),
            })
        }
        // BLPOP key [key …] timeout
        "BLPOP" | "BRPOP"
            if args.len() >= 3 && args[1..args.len() - 1].iter().any(|k| is_routed(k)) =>
        {
            Some(ListPop { list: None })
        }
        _ => None,
    }
}

/// What Redis's reply says was popped: (list, item) pairs.
pub(super) fn popped(pop: &ListPop, reply: &Frame) -> Vec<(Bytes, Bytes)> {
    match (&pop.list, reply) {
        (Some(list), Frame::Bulk(item)) => vec![(list.clone(), item.clone())],
        // LPOP/RPOP with a count.
        (Some(list), Frame::Array(items)) => items
            .iter()
            .filter_map(|item| match item {
                Frame::Bulk(item) => Some((list.clone(), item.clone())),
                _ => None,
            })
            .collect(),
        (None, Frame::Array(pair)) => match pair.as_slice() {
            [Frame::Bulk(list), Frame::Bulk(item)] => vec![(list.clone(), item.clone())],
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// The job keys a connection took off routed lists: (route, key), latest
/// last. Written by the reply side before the client sees the reply, read
/// by the reader when the client pushes.
#[derive(Debug, Default)]
pub(super) struct Taken(Mutex<VecDeque<(String, String)>>);

impl Taken {
    pub(super) fn add(&self, route: String, key: String) {
        let mut taken = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if taken.len() == REMEMBERED {
            taken.pop_front();
        }
        taken.push_back((route, key));
    }

    /// Whether this connection took `key` off `route`'s list (forgotten
    /// now: one pop explains one push back).
    pub(super) fn give_back(&self, route: &str, key: &str) -> bool {
        let mut taken = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match taken.iter().position(|(r, k)| r == route && k == key) {
            Some(i) => {
                taken.remove(i);
                true
            }
            None => false,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.lock().map(|t| t.is_empty()).unwrap_or(true)
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
    fn pops_of_a_routed_list_are_told_apart_from_the_rest() {
        let routed = |k: &[u8]| k == b"jobs";
        assert!(classify("BRPOP", &args(&["BRPOP", "other", "jobs", "5"]), routed).is_some());
        assert!(classify("BRPOP", &args(&["BRPOP", "other", "5"]), routed).is_none());
        assert!(classify("RPOP", &args(&["RPOP", "jobs"]), routed).is_some());
        assert!(classify(
            "LMOVE",
            &args(&["LMOVE", "jobs", "w", "RIGHT", "LEFT"]),
            routed
        )
        .is_some());
        assert!(classify("LRANGE", &args(&["LRANGE", "jobs", "0", "-1"]), routed).is_none());
        assert!(classify("RPOPLPUSH", &args(&["RPOPLPUSH", "jobs", "jobs"]), routed).is_none());
    }

    #[test]
    fn the_reply_names_what_was_popped() {
        let blocking = ListPop { list: None };
        let reply = Frame::Array(vec![
            Frame::Bulk(Bytes::from_static(b"jobs")),
            Frame::Bulk(Bytes::from_static(b"item")),
        ]);
        assert_eq!(popped(&blocking, &reply).len(), 1);
        assert!(popped(&blocking, &Frame::NullArray).is_empty());
        let single = ListPop {
            list: Some(Bytes::from_static(b"jobs")),
        };
        assert_eq!(
            popped(&single, &Frame::Bulk(Bytes::from_static(b"i"))).len(),
            1
        );
        assert!(popped(&single, &Frame::NullBulk).is_empty());
    }

    #[test]
    fn one_pop_explains_one_push_back() {
        let taken = Taken::default();
        taken.add("r".into(), "k".into());
        assert!(taken.give_back("r", "k"));
        assert!(!taken.give_back("r", "k"));
        assert!(!taken.give_back("other", "k"));
    }
}
