//! Phases of a route and a shared, cheaply cloned view of them.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

/// Where a route is in its migration (DESIGN.md), in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before the migration: producers write Redis only.
    RedisOnly,
    /// Producers write both sides; the Redis copy runs live, the Postgres
    /// copy is a mirror.
    DualWrite,
    /// Like `dual_write`, and the Postgres consumer runs handlers in shadow mode.
    Shadow,
    /// Producers write Postgres only (live copies); the Redis consumer drains
    /// what is left in Redis.
    PostgresOnly,
    /// The route's Redis keys are gone; Postgres only.
    Decommissioned,
}

impl Phase {
    /// Every phase, in migration order.
    pub const ALL: [Phase; 5] = [
        Phase::RedisOnly,
        Phase::DualWrite,
        Phase::Shadow,
        Phase::PostgresOnly,
        Phase::Decommissioned,
    ];

    /// The name used in config, SQL and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::RedisOnly => "redis_only",
            Phase::DualWrite => "dual_write",
            Phase::Shadow => "shadow",
            Phase::PostgresOnly => "postgres_only",
            Phase::Decommissioned => "decommissioned",
        }
    }

    /// Whether producers write the Redis list in this phase.
    pub fn writes_redis(self) -> bool {
        matches!(self, Phase::RedisOnly | Phase::DualWrite | Phase::Shadow)
    }

    /// Whether producers write Postgres in this phase.
    pub fn writes_postgres(self) -> bool {
        !matches!(self, Phase::RedisOnly)
    }

    /// Whether the job written to Postgres is the live copy (it is not in
    /// Redis) rather than a mirror of the Redis copy.
    pub fn postgres_is_live(self) -> bool {
        matches!(self, Phase::PostgresOnly | Phase::Decommissioned)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Phase {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Phase::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!("unknown phase {s:?}; expected one of redis_only, dual_write, shadow, postgres_only, decommissioned")
            })
    }
}

/// The phase of every route, shared by all tasks of a process. Reads are a
/// read lock and a hash lookup, cheap enough for every proxied push.
///
/// A route the view does not know reads as [`Phase::RedisOnly`]: qbridge then
/// only forwards, which is what it did before the route existed.
#[derive(Debug, Clone, Default)]
pub struct PhaseView {
    phases: Arc<RwLock<HashMap<String, Phase>>>,
}

impl PhaseView {
    /// A view holding these route → phase pairs.
    pub fn new(initial: impl IntoIterator<Item = (String, Phase)>) -> Self {
        PhaseView {
            phases: Arc::new(RwLock::new(initial.into_iter().collect())),
        }
    }

    /// The route's current phase.
    pub fn get(&self, route: &str) -> Phase {
        // A poisoned lock only means a writer panicked mid-insert of a Copy
        // value: the map itself is intact, so keep serving it.
        let phases = self.phases.read().unwrap_or_else(|e| e.into_inner());
        phases.get(route).copied().unwrap_or(Phase::RedisOnly)
    }

    /// Sets the route's phase; every clone of this view sees it at once.
    pub fn set(&self, route: &str, phase: Phase) {
        let mut phases = self.phases.write().unwrap_or_else(|e| e.into_inner());
        phases.insert(route.to_string(), phase);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for p in Phase::ALL {
            assert_eq!(p.as_str().parse::<Phase>(), Ok(p));
        }
        let err = "dual-write".parse::<Phase>().unwrap_err();
        assert!(err.contains("dual_write"), "{err}");
    }

    #[test]
    fn copies_follow_the_phase() {
        assert!(!Phase::RedisOnly.writes_postgres());
        assert!(Phase::DualWrite.writes_redis() && Phase::DualWrite.writes_postgres());
        assert!(!Phase::Shadow.postgres_is_live());
        assert!(Phase::PostgresOnly.postgres_is_live() && !Phase::PostgresOnly.writes_redis());
    }

    #[test]
    fn clones_share_changes_and_unknown_routes_are_redis_only() {
        let view = PhaseView::new([("a".to_string(), Phase::DualWrite)]);
        let other = view.clone();
        other.set("a", Phase::PostgresOnly);
        assert_eq!(view.get("a"), Phase::PostgresOnly);
        assert_eq!(view.get("nope"), Phase::RedisOnly);
    }
}
