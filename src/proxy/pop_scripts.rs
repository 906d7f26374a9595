//! Which Lua scripts take members out of a framework's schedule or retry set
//! (`super::set_pop`), by SHA-1: what makes an `EVALSHA` a pop.
//!
//! A framework's poller loads its script once per process (`SCRIPT LOAD`)
//! and from then on sends only `EVALSHA`. A proxy that did not see the load
//! — it started later, restarted, or the poller loaded through another
//! proxy — could not tell the pop from any other script, and the poller's
//! moves after the flip were held as re-pushes without evidence. So:
//!
//! - the pollers of the framework versions qbridge knows are recognised
//!   from their first `EVALSHA` ([`KNOWN`]: Sidekiq's `zpopbyscore` script,
//!   whose text changed in 6.3 and 7.1; before 6.3 the poller sent ZREM,
//!   which needs no script);
//! - a script this proxy learns (seen loaded or run with `EVAL`, calling
//!   ZREM) is stored in `qbridge.proxy_pop_scripts` (its SHA-1 only), which
//!   every proxy reads at start and every second, so all proxies, and a
//!   restarted one, know it.
//!
//! Knowing a script only lets the reply side read its reply as the members
//! Redis handed out; a script that pops nothing answers nil and proves
//! nothing.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use sha1::{Digest, Sha1};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// The SHA-1s of framework pollers' pop scripts, computed from the scripts
/// as each version's poller loads them (checked against Debian's Sidekiq
/// 6.4.1 and Sidekiq 7.3.10, and the text of every tag from 6.3.0 to 8.1.7).
pub(super) const KNOWN: &[(&str, &str)] = &[
    (
        "f4a8a5467f9f4697a26fdfb839476b9ee52e897c",
        "Sidekiq 6.3–7.0 scheduled poller (zrangebyscore, zrem)",
    ),
    (
        "000a4c2f82df69db1780053377a2c9b0741570e0",
        "Sidekiq 7.1–8.x scheduled poller (zrange byscore, zrem)",
    ),
];

/// Scripts learned at most (only those that call ZREM are kept): enough for
/// any framework, bounded against a client loading scripts without end.
const MAX_SCRIPTS: usize = 1024;

/// How often a proxy reads the scripts other proxies learned.
pub(super) const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// The pop scripts one proxy knows: [`KNOWN`], what it learned, and what
/// other proxies stored (see the module docs).
#[derive(Debug, Default)]
pub(super) struct PopScripts {
    state: Mutex<Learned>,
    /// Where learned scripts are shared; `None` keeps them in memory only.
    store: Option<PgPool>,
}

#[derive(Debug, Default)]
struct Learned {
    known: HashSet<String>,
    /// Learned here and not yet stored (written on the next refresh).
    unsaved: HashSet<String>,
}

impl PopScripts {
    /// Pop scripts shared through `pool`.
    pub(super) fn shared(pool: PgPool) -> PopScripts {
        PopScripts {
            state: Mutex::default(),
            store: Some(pool),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Learned> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Learns `source` if it calls ZREM (stored on the next refresh).
    pub(super) fn learn(&self, source: &[u8]) {
        if !calls_zrem(source) {
            return;
        }
        let sha = format!("{:x}", Sha1::digest(source));
        if KNOWN.iter().any(|(known, _)| *known == sha) {
            return;
        }
        let mut state = self.state();
        if state.known.len() < MAX_SCRIPTS && state.known.insert(sha.clone()) {
            state.unsaved.insert(sha);
        }
    }

    /// Whether the script with this SHA-1 (any case) is a pop.
    pub(super) fn knows(&self, sha: &[u8]) -> bool {
        let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
        KNOWN.iter().any(|(known, _)| *known == sha) || self.state().known.contains(&sha)
    }

    /// Stores what this proxy learned and reads what every proxy stored.
    /// A failure (Postgres down) keeps what is unsaved for the next try.
    pub(super) async fn refresh(&self) -> Result<(), sqlx::Error> {
        let Some(pool) = &self.store else {
            return Ok(());
        };
        let unsaved: Vec<String> = self.state().unsaved.iter().cloned().collect();
        if !unsaved.is_empty() {
            sqlx::query(
                "INSERT INTO qbridge.proxy_pop_scripts (sha) SELECT unnest($1::text[]) \
                 ON CONFLICT (sha) DO NOTHING",
            )
            .bind(&unsaved)
            .execute(pool)
            .await?;
            let mut state = self.state();
            for sha in &unsaved {
                state.unsaved.remove(sha);
            }
        }
        let stored: Vec<String> = sqlx::query_scalar(
            "SELECT sha FROM qbridge.proxy_pop_scripts ORDER BY learned_at LIMIT $1",
        )
        .bind(MAX_SCRIPTS as i64)
        .fetch_all(pool)
        .await?;
        let mut state = self.state();
        for sha in stored {
            if state.known.len() >= MAX_SCRIPTS {
                break;
            }
            state.known.insert(sha);
        }
        Ok(())
    }

    /// [`refresh`](Self::refresh) every [`REFRESH_EVERY`] until `stop`.
    pub(super) async fn keep_refreshed(&self, stop: CancellationToken) {
        let mut failing = false;
        loop {
            match self.refresh().await {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "cannot share the proxy's pop scripts through Postgres; trying again every second");
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(REFRESH_EVERY) => {}
            }
        }
    }
}

/// Whether a script's source calls ZREM (any case).
pub(super) fn calls_zrem(source: &[u8]) -> bool {
    source.to_ascii_lowercase().windows(4).any(|w| w == b"zrem")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_pollers_are_pops_without_being_seen_loaded() {
        let scripts = PopScripts::default();
        for (sha, _) in KNOWN {
            assert!(scripts.knows(sha.as_bytes()));
            assert!(scripts.knows(sha.to_uppercase().as_bytes()));
        }
        assert!(!scripts.knows(b"0000000000000000000000000000000000000000"));
    }

    #[test]
    fn only_scripts_that_call_zrem_are_learned_and_queued_for_the_store() {
        let scripts = PopScripts::default();
        scripts.learn(b"return redis.call('ZRANGE', KEYS[1], 0, 0)");
        assert!(scripts.state().unsaved.is_empty());
        let pop = b"local m = redis.call('zrange', KEYS[1], 0, 0)[1] redis.call('zrem', KEYS[1], m) return m";
        scripts.learn(pop);
        let sha = format!("{:x}", Sha1::digest(pop));
        assert!(scripts.knows(sha.as_bytes()));
        assert_eq!(scripts.state().unsaved.len(), 1);
    }
}
