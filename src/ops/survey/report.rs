//! What `qbridge survey` found, as data: one [`QueueRow`] per queue, one
//! [`Found`] per framework installation, and the survey's own numbers. The
//! text table (`render`), the JSON (`--json`, these types serialized) and the
//! draft config (`draft`) are all made from it.
//!
//! Nothing here holds a payload: a row keeps counts, sizes in bytes and key
//! names only, so printing or serializing any of it cannot leak a job.

use serde::Serialize;

use crate::config::PushEnd;

/// Which framework a queue belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    Sidekiq,
    Celery,
    Rq,
    Resque,
    /// A plain list no framework's layout explains: maybe a hand-rolled
    /// queue (LPUSH/BRPOP), maybe something else; a human decides.
    List,
}

impl Framework {
    /// The route `format` qbridge reads this framework's items with.
    pub fn format(self) -> &'static str {
        match self {
            Framework::Sidekiq => "sidekiq",
            Framework::Celery => "celery",
            Framework::Rq => "rq",
            Framework::Resque => "resque",
            Framework::List => "raw",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Framework::Sidekiq => "sidekiq",
            Framework::Celery => "celery",
            Framework::Rq => "rq",
            Framework::Resque => "resque",
            Framework::List => "list",
        }
    }
}

/// Bytes per job from a small sample (never the bytes themselves).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sizes {
    /// How many jobs were measured.
    pub sampled: usize,
    pub p50_bytes: u64,
    pub max_bytes: u64,
    /// What was measured: `"items"` (the list items' lengths) or
    /// `"rq job data"` (`HSTRLEN rq:job:<id> data` of sampled ids).
    pub of: &'static str,
}

impl Sizes {
    /// The lower median and the largest of `lengths`; `None` when empty.
    pub fn of_lengths(mut lengths: Vec<u64>, of: &'static str) -> Option<Sizes> {
        if lengths.is_empty() {
            return None;
        }
        lengths.sort_unstable();
        Some(Sizes {
            sampled: lengths.len(),
            p50_bytes: lengths[(lengths.len() - 1) / 2],
            max_bytes: lengths[lengths.len() - 1],
            of,
        })
    }
}

/// A queue's push rate over the sampling window (`rate`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rate {
    /// Items pushed per second, as far as the lists show them.
    pub per_second: f64,
    /// Items counted over the window.
    pub pushed: u64,
    /// `true` when the count is exact for the push end; `false` when it is
    /// a lower bound (the newest item at the start was consumed, or the
    /// list was empty: pushes consumed within the window are not seen).
    pub exact: bool,
}

/// One queue: where its jobs wait and how many are in each state.
/// `None` means the framework has no such state (Celery keeps no dead set).
#[derive(Debug, Clone, Serialize)]
pub struct QueueRow {
    pub framework: Framework,
    /// Sidekiq's or Resque's namespace (`acme:`), Celery's
    /// `global_keyprefix`; empty when none.
    pub namespace: String,
    pub queue: String,
    /// The list producers push to, printable (`\xNN` for other bytes).
    pub key: String,
    #[serde(skip)]
    pub raw_key: Vec<u8>,
    /// Every list the queue's ready jobs wait in: the key, then Celery's
    /// priority lists.
    #[serde(skip)]
    pub lists: Vec<Vec<u8>>,
    /// Celery priority steps with a list of their own (`<queue>\x06\x16<n>`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub priority_steps: Vec<u8>,
    #[serde(serialize_with = "push_end")]
    pub push: PushEnd,
    pub waiting: u64,
    pub scheduled: Option<u64>,
    pub retrying: Option<u64>,
    pub dead: Option<u64>,
    /// Taken by a worker and not acknowledged: private or processing lists,
    /// Celery's `unacked`, RQ's started registry, busy workers.
    pub in_flight: Option<u64>,
    /// Columns extrapolated from part of a big shared structure.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub estimated: Vec<&'static str>,
    pub payload: Option<Sizes>,
    pub push_rate: Option<Rate>,
    /// For a plain list: the format its sampled items read as (`json:/id`
    /// when every sampled item is a JSON object with an `id`, else `raw`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format_guess: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

fn push_end<S: serde::Serializer>(push: &PushEnd, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match push {
        PushEnd::Lpush => "lpush",
        PushEnd::Rpush => "rpush",
    })
}

impl QueueRow {
    /// A row with every count empty, for `key` (its only list).
    pub fn new(framework: Framework, namespace: &str, queue: &str, key: Vec<u8>) -> QueueRow {
        QueueRow {
            framework,
            namespace: namespace.to_string(),
            queue: queue.to_string(),
            key: printable(&key),
            lists: vec![key.clone()],
            raw_key: key,
            priority_steps: Vec::new(),
            push: match framework {
                Framework::Rq | Framework::Resque => PushEnd::Rpush,
                _ => PushEnd::Lpush,
            },
            waiting: 0,
            scheduled: None,
            retrying: None,
            dead: None,
            in_flight: None,
            estimated: Vec::new(),
            payload: None,
            push_rate: None,
            format_guess: None,
            notes: Vec::new(),
        }
    }

    /// Adds `n` to an optional column (`None` + n = n).
    pub fn add(column: &mut Option<u64>, n: u64) {
        *column = Some(column.unwrap_or(0) + n);
    }
}

/// One installation of a framework: its namespace and what hints at its
/// version and options.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    pub framework: Framework,
    pub namespace: String,
    /// What the keyspace says about the version (`"Sidekiq 7.3.10 (process
    /// info)"`), when it says anything.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub version_hints: Vec<String>,
    /// Options in use that matter to a migration (reliable fetch, a key
    /// prefix, priorities).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Worker processes registered in Redis.
    pub workers: u64,
}

impl Found {
    pub fn new(framework: Framework, namespace: &str) -> Found {
        Found {
            framework,
            namespace: namespace.to_string(),
            version_hints: Vec::new(),
            options: Vec::new(),
            workers: 0,
        }
    }
}

/// Push commands the whole server ran over the sampling window (`INFO
/// commandstats`): what the per-queue rates can be held against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerPushes {
    /// LPUSH, RPUSH, LPUSHX and RPUSHX calls per second (a call may push
    /// many items; a call to any list counts).
    pub push_calls_per_second: f64,
    /// EVAL, EVALSHA and FCALL calls per second: a script may push too,
    /// unseen by the counters above.
    pub script_calls_per_second: f64,
}

/// Everything `qbridge survey` found.
#[derive(Debug, Clone, Serialize)]
pub struct Survey {
    /// The server's `redis_version` (INFO server), when INFO is allowed.
    pub redis_version: Option<String>,
    /// Keys in the surveyed database (DBSIZE) and how long the scan took.
    pub keys: u64,
    pub scan_seconds: f64,
    pub frameworks: Vec<Found>,
    pub queues: Vec<QueueRow>,
    /// The sampling window (0: rates were not sampled).
    pub sample_seconds: f64,
    pub server_pushes: Option<ServerPushes>,
    /// What the survey could not read or had to estimate, one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// A key as text: printable ASCII kept, every other byte as `\xNN`
/// (kombu's priority separator is `\x06\x16`).
pub fn printable(key: &[u8]) -> String {
    let mut out = String::with_capacity(key.len());
    for &b in key {
        if (0x20..0x7f).contains(&b) && b != b'\\' {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_the_lower_median_and_the_largest() {
        let s = Sizes::of_lengths(vec![30, 10, 20, 40], "items").unwrap();
        assert_eq!((s.sampled, s.p50_bytes, s.max_bytes), (4, 20, 40));
        assert!(Sizes::of_lengths(Vec::new(), "items").is_none());
    }

    #[test]
    fn keys_print_their_control_bytes_escaped() {
        assert_eq!(printable(b"orders\x06\x163"), "orders\\x06\\x163");
        assert_eq!(printable(b"a\\b"), "a\\x5cb");
    }
}
