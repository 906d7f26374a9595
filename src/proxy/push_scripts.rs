//! Pushes a framework makes from a Lua script, recognised by the script's
//! SHA-1: the script runs inside Redis, so the proxy sees only `EVALSHA sha
//! keys… args…` (or `EVAL source …`) and Redis's answer, never the `LPUSH`
//! or `ZADD` the script makes. For the scripts qbridge knows, the arguments
//! say which item goes where, and the reply says whether it went:
//!
//! - RQ's unique enqueue (2.8 to 3.0, `enqueue(..., unique=True)`):
//!   `KEYS = [rq:job:<id>, rq:queue:<name>]`, `ARGV = [id, L|R|N, ttl,
//!   hash fields…]`; it answers 1 when it saved the job and pushed the id
//!   (`L`/`R`; `N` pushes nothing), 0 when a job with that id exists.
//! - RQ's unique schedule (2.8 to 3.0, `enqueue_at/in(..., unique=True)`):
//!   `KEYS = [rq:job:<id>, rq:scheduled:<name>, rq:queues]`, `ARGV = [id,
//!   ttl, timestamp, queue key, hash fields…]`; 1 when it saved the job and
//!   added the id to the scheduled registry at `timestamp`.
//!
//! A script qbridge does not know that pushes onto a routed list is not
//! mirrored: the diff shows its jobs as only on Redis, and repair mirrors
//! them from there.

use bytes::Bytes;

/// RQ's `UNIQUE_ENQUEUE_SCRIPT` (the same text in RQ 2.8.0 to 3.0.0).
const RQ_UNIQUE_ENQUEUE: &str = "5cee5213d2ee93f19f93badbfc1c8abbccde5baf";
/// RQ's `UNIQUE_SCHEDULE_SCRIPT` (the same text in RQ 2.8.0 to 3.0.0).
const RQ_UNIQUE_SCHEDULE: &str = "10808fbebdc9b5ffafa2b7f5f2ce29a5bc6a1e07";

/// What a known script pushes, if Redis answers that it did (an integer
/// reply of at least 1).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ScriptPush {
    /// `item` onto the list `list`.
    List { list: Bytes, item: Bytes },
    /// `member` into the sorted set `set` with `score`.
    SetAdd {
        set: Bytes,
        member: Bytes,
        score: f64,
    },
}

/// The push `EVAL`/`EVALSHA` `args` (with the command's name first) makes,
/// when its script is one qbridge knows and its arguments have the script's
/// shape; `None` otherwise (Redis answers whatever it answers).
pub(super) fn classify(name: &str, args: &[Bytes]) -> Option<ScriptPush> {
    let sha = match name {
        "EVALSHA" => String::from_utf8_lossy(args.get(1)?).to_ascii_lowercase(),
        "EVAL" => {
            use sha1::{Digest, Sha1};
            format!("{:x}", Sha1::digest(args.get(1)?))
        }
        _ => return None,
    };
    let numkeys: usize = std::str::from_utf8(args.get(2)?).ok()?.parse().ok()?;
    let keys = args.get(3..3 + numkeys)?;
    let argv = args.get(3 + numkeys..)?;
    match sha.as_str() {
        RQ_UNIQUE_ENQUEUE if numkeys == 2 && argv.len() >= 3 => {
            let direction = argv[1].as_ref();
            (direction == b"L" || direction == b"R").then(|| ScriptPush::List {
                list: keys[1].clone(),
                item: argv[0].clone(),
            })
        }
        RQ_UNIQUE_SCHEDULE if numkeys == 3 && argv.len() >= 4 => {
            let score = std::str::from_utf8(&argv[2]).ok()?.parse().ok()?;
            Some(ScriptPush::SetAdd {
                set: keys[1].clone(),
                member: argv[0].clone(),
                score,
            })
        }
        _ => None,
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
    fn rq_unique_enqueue_pushes_its_id_unless_told_not_to() {
        let call = args(&[
            "EVALSHA",
            &RQ_UNIQUE_ENQUEUE.to_uppercase(),
            "2",
            "rq:job:a1",
            "rq:queue:q",
            "a1",
            "R",
            "-1",
            "status",
            "queued",
        ]);
        assert_eq!(
            classify("EVALSHA", &call),
            Some(ScriptPush::List {
                list: Bytes::from_static(b"rq:queue:q"),
                item: Bytes::from_static(b"a1"),
            })
        );
        let mut no_push = call.clone();
        no_push[6] = Bytes::from_static(b"N");
        assert_eq!(classify("EVALSHA", &no_push), None);
        let mut wrong_keys = call;
        wrong_keys[2] = Bytes::from_static(b"1");
        assert_eq!(classify("EVALSHA", &wrong_keys), None);
    }

    #[test]
    fn rq_unique_schedule_adds_its_id_at_the_timestamp() {
        let call = args(&[
            "EVALSHA",
            RQ_UNIQUE_SCHEDULE,
            "3",
            "rq:job:a1",
            "rq:scheduled:q",
            "rq:queues",
            "a1",
            "-1",
            "1900000000",
            "rq:queue:q",
        ]);
        assert_eq!(
            classify("EVALSHA", &call),
            Some(ScriptPush::SetAdd {
                set: Bytes::from_static(b"rq:scheduled:q"),
                member: Bytes::from_static(b"a1"),
                score: 1_900_000_000.0,
            })
        );
    }

    #[test]
    fn unknown_scripts_and_other_commands_push_nothing() {
        let call = args(&["EVALSHA", "0123", "1", "rq:queue:q", "a1"]);
        assert_eq!(classify("EVALSHA", &call), None);
        assert_eq!(classify("EVAL", &args(&["EVAL", "return 1", "0"])), None);
        assert_eq!(classify("GET", &args(&["GET", "k"])), None);
        assert_eq!(classify("EVALSHA", &args(&["EVALSHA"])), None);
    }
}
