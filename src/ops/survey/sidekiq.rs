//! Sidekiq's layout (read in Sidekiq 6.4's and 7.3's `client.rb`,
//! `api.rb`, `launcher.rb`, `fetch.rb`), under an optional redis-namespace
//! prefix (`acme:` before every key):
//!
//! - `queues`: a set of queue names; `queue:<name>`: a list, LPUSHed;
//! - `schedule`, `retry`, `dead`: sorted sets shared by every queue, each
//!   member a job naming its `queue`;
//! - `processes`: a set of process identities; `<identity>`: a hash whose
//!   `info` is JSON (`queues`; `version` since 7.0.2), expiring after 60 s;
//!   `<identity>:workers` (6.x) or `<identity>:work` (7.x): what its threads
//!   run now, each value JSON naming its `queue`; `<identity>-signals`: a
//!   list of signals for the process;
//! - Sidekiq Pro's super_fetch: a private list per process and queue,
//!   `queue:sq|<identity>|<queue>`, and the set `super_processes` (Pro is
//!   closed source: these names are from its public changelog and tools
//!   written against it);
//! - gitlab-sidekiq-fetcher (Debian's ruby-gitlab-sidekiq-fetcher 0.8,
//!   `base_reliable_fetch.rb`): a working list per queue and process,
//!   `working:queue:<queue>:<hostname>:<pid>:<nonce>` (before 0.7 without
//!   the nonce), and the sorted set `interrupted` for jobs interrupted too
//!   often.
//!
//! Sidekiq 8 writes `created_at` in integer milliseconds, earlier versions
//! in fractional seconds: a sampled job tells them apart.

use std::collections::{BTreeSet, HashMap};

use redis::aio::ConnectionManager;

use super::read::{self, Shape, Tally};
use super::report::{Found, Framework, QueueRow, Sizes};
use super::scan::Keyspace;
use super::Recognised;
use crate::error::Result;

/// Sidekiq's default retries (`JobRetry::DEFAULT_MAX_RETRY_ATTEMPTS`) plus
/// the first run.
pub const MAX_ATTEMPTS: i32 = 26;

/// A private list and the queue it belongs to.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Private {
    pub queue: String,
    /// `"super_fetch"` or `"gitlab"`.
    pub kind: &'static str,
}

/// Which queue a list of this namespace holds privately for a process:
/// super_fetch's `queue:sq|<identity>|<queue>` or gitlab-sidekiq-fetcher's
/// `working:queue:<queue>:<identity>`.
pub(super) fn private_list(ns: &str, key: &[u8]) -> Option<Private> {
    let rest = std::str::from_utf8(key.strip_prefix(ns.as_bytes())?).ok()?;
    if let Some(sq) = rest.strip_prefix("queue:sq|") {
        let (_identity, queue) = sq.split_once('|')?;
        return (!queue.is_empty()).then(|| Private {
            queue: queue.to_string(),
            kind: "super_fetch",
        });
    }
    let working = rest.strip_prefix("working:queue:")?;
    // `<queue>:<hostname>:<pid>:<hex nonce>`, or `<queue>:<hostname>:<pid>`
    // before the nonce; the queue name may hold colons itself.
    let parts: Vec<&str> = working.rsplitn(4, ':').collect();
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    let queue = match parts.as_slice() {
        [nonce, pid, _host, queue] if hex(nonce) && digits(pid) && !queue.is_empty() => *queue,
        _ => {
            let legacy: Vec<&str> = working.rsplitn(3, ':').collect();
            match legacy.as_slice() {
                [pid, _host, queue] if digits(pid) && !queue.is_empty() => *queue,
                _ => return None,
            }
        }
    };
    Some(Private {
        queue: queue.to_string(),
        kind: "gitlab",
    })
}

/// The Sidekiq installation under `ns` (`""` or `acme:`): its queues and
/// what they hold.
pub async fn recognise(
    conn: &mut ConnectionManager,
    space: &Keyspace,
    ns: &str,
    names: &[String],
) -> Result<Recognised> {
    let mut found = Found::new(Framework::Sidekiq, ns.trim_end_matches(':'));
    if !ns.is_empty() {
        found.options.push(format!(
            "redis-namespace {:?}: every key starts with {ns:?}",
            ns.trim_end_matches(':')
        ));
    }
    let mut claimed = Vec::new();
    let mut queues: BTreeSet<String> = names.iter().cloned().collect();
    let mut private: HashMap<String, u64> = HashMap::new();
    let mut kinds = BTreeSet::new();
    let mut private_keys = Vec::new();
    for key in space.lists_under(ns.as_bytes()) {
        if let Some(p) = private_list(ns, key) {
            kinds.insert(p.kind);
            private_keys.push((key.to_vec(), p.queue));
        } else if let Some(name) = key
            .strip_prefix(format!("{ns}queue:").as_bytes())
            .and_then(|n| std::str::from_utf8(n).ok())
        {
            queues.insert(name.to_string());
        }
    }
    let keys: Vec<&[u8]> = private_keys.iter().map(|(k, _)| k.as_slice()).collect();
    for ((key, queue), len) in private_keys.iter().zip(read::lengths(conn, &keys).await?) {
        *private.entry(queue.clone()).or_default() += len;
        queues.insert(queue.clone());
        claimed.push(key.clone());
    }
    if kinds.contains("super_fetch") {
        found
            .options
            .push("super_fetch (Sidekiq Pro): private lists queue:sq|<identity>|<queue>".into());
    }
    if kinds.contains("gitlab") {
        found.options.push(
            "reliable fetch (gitlab-sidekiq-fetcher): working lists working:queue:<queue>:<identity>"
                .into(),
        );
    }
    let busy = processes(conn, space, ns, &mut found, &mut claimed).await?;
    let sets = sets(conn, ns).await?;
    let mut rows = Vec::new();
    for queue in &queues {
        let key = format!("{ns}queue:{queue}").into_bytes();
        let mut row = QueueRow::new(Framework::Sidekiq, found.namespace.as_str(), queue, key);
        fill(conn, &mut row, &sets, &mut found).await?;
        let held_privately = private.get(queue).copied().unwrap_or(0);
        let running = busy.get(queue).copied().unwrap_or(0);
        // A job a reliable fetch took is both in its private list and in
        // its process's busy threads: the larger of the two, never the sum.
        // Without a registered process or a private list a job a worker
        // popped is nowhere to be seen (BRPOP): unknown, not 0.
        if found.workers > 0 || !kinds.is_empty() {
            row.in_flight = Some(held_privately.max(running));
        }
        rows.push(row);
    }
    Ok(Recognised {
        found,
        rows,
        claimed,
    })
}

/// The shared sorted sets of the namespace, tallied by queue: schedule,
/// retry, and dead with gitlab-sidekiq-fetcher's `interrupted`.
struct Sets {
    schedule: Option<Tally>,
    retry: Option<Tally>,
    dead: Option<Tally>,
}

async fn sets(conn: &mut ConnectionManager, ns: &str) -> Result<Sets> {
    let tally_of = async |conn: &mut ConnectionManager, name: &str| -> Result<Option<Tally>> {
        let key = format!("{ns}{name}").into_bytes();
        if read::key_type(conn, &key).await? != "zset" {
            return Ok(None);
        }
        Ok(Some(
            read::tally(conn, &key, Shape::SortedSet, &mut read::queue_field).await?,
        ))
    };
    let schedule = tally_of(conn, "schedule").await?;
    let retry = tally_of(conn, "retry").await?;
    let mut dead = tally_of(conn, "dead").await?;
    if let Some(interrupted) = tally_of(conn, "interrupted").await? {
        dead.get_or_insert_with(Tally::default).merge(interrupted);
    }
    Ok(Sets {
        schedule,
        retry,
        dead,
    })
}

/// A queue's list length, its jobs in the shared sets, and a sample of
/// its jobs' sizes (the first sample also hints at the version).
async fn fill(
    conn: &mut ConnectionManager,
    row: &mut QueueRow,
    sets: &Sets,
    found: &mut Found,
) -> Result<()> {
    row.waiting = read::lengths(conn, &[&row.raw_key]).await?[0];
    let columns = [
        (&sets.schedule, &mut row.scheduled, "scheduled"),
        (&sets.retry, &mut row.retrying, "retrying"),
        (&sets.dead, &mut row.dead, "dead"),
    ];
    for (tally, column, name) in columns {
        *column = Some(tally.as_ref().map_or(0, |t| t.of(&row.queue)));
        if tally.as_ref().is_some_and(Tally::estimated) {
            row.estimated.push(name);
        }
    }
    if row.waiting == 0 {
        return Ok(());
    }
    let items = read::sample(conn, &row.raw_key, row.waiting).await?;
    row.payload = Sizes::of_lengths(items.iter().map(|i| i.len() as u64).collect(), "items");
    if let Some(hint) = items.first().and_then(|i| created_at_hint(i)) {
        if !found.version_hints.contains(&hint) {
            found.version_hints.push(hint);
        }
    }
    Ok(())
}

/// What a job's `created_at` says: integer milliseconds since Sidekiq 8,
/// fractional seconds before.
pub(super) fn created_at_hint(job: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(job).ok()?;
    let created = value.get("created_at")?;
    if created.is_u64() && created.as_u64()? > 100_000_000_000 {
        Some("jobs carry created_at in milliseconds: Sidekiq 8 or later".into())
    } else if created.is_f64() {
        Some("jobs carry created_at in seconds: Sidekiq before 8".into())
    } else {
        None
    }
}

/// The namespace's registered processes: counted, their versions noted,
/// their `-signals` lists claimed, and the jobs their threads run now
/// counted by queue.
async fn processes(
    conn: &mut ConnectionManager,
    space: &Keyspace,
    ns: &str,
    found: &mut Found,
    claimed: &mut Vec<Vec<u8>>,
) -> Result<HashMap<String, u64>> {
    let mut busy = HashMap::new();
    let set = format!("{ns}processes").into_bytes();
    if !space.sets.contains(&set) {
        return Ok(busy);
    }
    let identities: Vec<String> = redis::cmd("SMEMBERS").arg(&set).query_async(conn).await?;
    let mut without_version = 0;
    for identity in &identities {
        claimed.push(format!("{ns}{identity}-signals").into_bytes());
        let info: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(format!("{ns}{identity}"))
            .arg("info")
            .query_async(conn)
            .await?;
        let Some(info) = info else { continue };
        found.workers += 1;
        match process_version(&info) {
            Some(v) => {
                let hint = format!("Sidekiq {v} (process info)");
                if !found.version_hints.contains(&hint) {
                    found.version_hints.push(hint);
                }
            }
            None => without_version += 1,
        }
        for suffix in [":workers", ":work"] {
            let key = format!("{ns}{identity}{suffix}");
            if read::key_type(conn, key.as_bytes()).await? != "hash" {
                continue;
            }
            let values: Vec<Vec<u8>> = redis::cmd("HVALS").arg(&key).query_async(conn).await?;
            for queue in values.iter().filter_map(|v| read::queue_field(v)) {
                *busy.entry(queue).or_default() += 1;
            }
        }
    }
    if without_version > 0 {
        found.version_hints.push(format!(
            "Sidekiq before 7.0.2: {without_version} process(es) with no version in their info"
        ));
    }
    Ok(busy)
}

/// The `version` of a process's `info` JSON (Sidekiq 7.0.2 and later).
pub(super) fn process_version(info: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(info).ok()?;
    value.get("version")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_lists_of_both_reliable_fetches_name_their_queue() {
        let p = private_list("", b"queue:sq|web.1:12:ab12cd|critical").unwrap();
        assert_eq!((p.queue.as_str(), p.kind), ("critical", "super_fetch"));
        let p = private_list("acme:", b"acme:working:queue:mailers:vm:28055:358039d24e71").unwrap();
        assert_eq!((p.queue.as_str(), p.kind), ("mailers", "gitlab"));
        // Before the nonce, and a queue name with a colon of its own.
        let p = private_list("", b"working:queue:team:mail:vm:12").unwrap();
        assert_eq!(p.queue, "team:mail");
        let p = private_list("", b"working:queue:team:mail:vm:12:0f").unwrap();
        assert_eq!(p.queue, "team:mail");
        assert!(private_list("", b"queue:default").is_none());
        assert!(private_list("acme:", b"working:queue:a:vm:1").is_none());
    }

    #[test]
    fn the_version_comes_from_process_info_or_created_at() {
        // Sidekiq 7.3's launcher writes `version` into the process info.
        let info = br#"{"hostname":"vm","pid":1,"queues":["default"],"weights":[{"default":0}],"identity":"vm:1:ab","version":"7.3.10"}"#;
        assert_eq!(process_version(info).as_deref(), Some("7.3.10"));
        assert_eq!(process_version(br#"{"hostname":"vm","queues":[]}"#), None);
        let v8 = created_at_hint(br#"{"jid":"a","created_at":1764345600123}"#).unwrap();
        assert!(v8.contains("Sidekiq 8"), "{v8}");
        let v6 = created_at_hint(br#"{"jid":"a","created_at":1764345600.12}"#).unwrap();
        assert!(v6.contains("before 8"), "{v6}");
    }
}
