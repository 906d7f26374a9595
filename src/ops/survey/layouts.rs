//! Which framework a `queues` set belongs to. Three frameworks register
//! their queues in a set with that name:
//!
//! - RQ: `rq:queues` holds the lists' keys (`rq:queue:<name>`; another
//!   prefix with `RQ_KEY_PREFIX`);
//! - Sidekiq: `queues` (or `<namespace>:queues`) holds bare names, the
//!   lists are `queue:<name>`;
//! - Resque: the same shape under its namespace, `resque:` by default.
//!
//! Sidekiq and Resque share the shape, so a sampled job decides (Sidekiq's
//! carry a `jid`, Resque's only `class` and `args`), then the keys beside
//! the set (Sidekiq's `schedule`/`retry`/`dead`/`processes`, Resque's
//! `failed`/`workers`/`delayed_queue_schedule`), then the namespace's name.

use redis::aio::ConnectionManager;

use super::read;
use super::scan::Keyspace;
use crate::error::Result;

/// A framework's `queues` set and the queue names it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    Sidekiq { ns: String, names: Vec<String> },
    Resque { ns: String, names: Vec<String> },
    Rq { prefix: String, names: Vec<String> },
}

/// Every `queues` set of the keyspace, each read and told apart.
pub async fn find(conn: &mut ConnectionManager, space: &Keyspace) -> Result<Vec<Layout>> {
    let mut out = Vec::new();
    for set in &space.sets {
        let Some(ns) = set
            .strip_suffix(b"queues")
            .filter(|ns| ns.is_empty() || ns.ends_with(b":"))
            .and_then(|ns| std::str::from_utf8(ns).ok())
        else {
            continue;
        };
        let members: Vec<String> = redis::cmd("SMEMBERS").arg(set).query_async(conn).await?;
        let list_prefix = format!("{ns}queue:");
        let rq_names: Option<Vec<String>> = members
            .iter()
            .map(|m| m.strip_prefix(&list_prefix).map(str::to_owned))
            .collect();
        match rq_names {
            Some(names) if !ns.is_empty() && !names.is_empty() => out.push(Layout::Rq {
                prefix: ns.to_string(),
                names,
            }),
            _ => {
                let mut names = members;
                names.sort();
                out.push(if is_resque(conn, space, ns).await? {
                    Layout::Resque {
                        ns: ns.to_string(),
                        names,
                    }
                } else {
                    Layout::Sidekiq {
                        ns: ns.to_string(),
                        names,
                    }
                });
            }
        }
    }
    Ok(out)
}

/// What one job says: `Some(true)` for Resque's `{class, args}`,
/// `Some(false)` for a Sidekiq job (it has a `jid`), `None` for neither.
pub(super) fn job_says_resque(item: &[u8]) -> Option<bool> {
    let job: serde_json::Value = serde_json::from_slice(item).ok()?;
    let job = job.as_object()?;
    if job.contains_key("jid") {
        Some(false)
    } else if job.contains_key("class") && job.contains_key("args") {
        Some(true)
    } else {
        None
    }
}

async fn is_resque(conn: &mut ConnectionManager, space: &Keyspace, ns: &str) -> Result<bool> {
    let prefix = format!("{ns}queue:");
    let first_list = space
        .lists_under(prefix.as_bytes())
        .find(|k| !k.starts_with(format!("{ns}queue:sq|").as_bytes()));
    if let Some(list) = first_list {
        let first: Option<Vec<u8>> = redis::cmd("LINDEX")
            .arg(list)
            .arg(0)
            .query_async(conn)
            .await?;
        if let Some(says) = first.as_deref().and_then(job_says_resque) {
            return Ok(says);
        }
    }
    let has = |keys: &std::collections::BTreeSet<Vec<u8>>, name: &str| {
        keys.contains(format!("{ns}{name}").as_bytes())
    };
    let zsets: Vec<Vec<u8>> = ["schedule", "retry", "dead", "delayed_queue_schedule"]
        .iter()
        .map(|name| format!("{ns}{name}").into_bytes())
        .collect();
    let keys: Vec<&[u8]> = zsets.iter().map(Vec::as_slice).collect();
    let is_zset: Vec<bool> = read::types(conn, &keys)
        .await?
        .iter()
        .map(|t| t == "zset")
        .collect();
    if is_zset[..3].contains(&true) || has(&space.sets, "processes") {
        return Ok(false);
    }
    if has(&space.lists, "failed") || has(&space.sets, "workers") || is_zset[3] {
        return Ok(true);
    }
    Ok(ns == "resque:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_tells_sidekiq_from_resque() {
        assert_eq!(
            job_says_resque(br#"{"class":"Mail","args":[1],"jid":"ab","queue":"default"}"#),
            Some(false)
        );
        assert_eq!(
            job_says_resque(br#"{"class":"Mail","args":[1]}"#),
            Some(true)
        );
        assert_eq!(job_says_resque(b"plain"), None);
    }
}
