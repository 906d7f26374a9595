//! Phases of a route and a shared, cheaply cloned view of them.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::following::{Routed, RoutedPush};

/// Where a route is in its migration (ARCHITECTURE.md, "Vocabulary"), in order.
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

/// The bucket (0..100) of a job key for the gradual flip: a stable hash
/// (FNV-1a), so a key falls in the same bucket in every process and on every
/// re-push, and a ramp from 1% to 10% only adds keys.
pub fn bucket(key: &str) -> u8 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % 100) as u8
}

/// The phase of every route (and, in `postgres_only`, the share of keys
/// already flipped), shared by all tasks of a process. Reads are a read lock
/// and a hash lookup, cheap enough for every proxied push.
///
/// A route the view does not know reads as [`Phase::RedisOnly`]: qbridge then
/// only forwards, which is what it did before the route existed.
///
/// It also holds, per route, the revision of the stored flag the view
/// shows and the one every process routing the route's pushes follows, and
/// the count of the pushes this process routed ([`super::following`]).
#[derive(Debug, Clone, Default)]
pub struct PhaseView {
    phases: Arc<RwLock<HashMap<String, RouteView>>>,
    routed: Arc<Routed>,
}

/// One route as the view holds it.
#[derive(Debug, Clone, Copy)]
struct RouteView {
    phase: Phase,
    percent: u8,
    /// The stored flag's revision the phase and share are from.
    revision: i64,
    /// The revision every live follower follows (see [`super::following`]).
    followed: i64,
}

impl RouteView {
    const UNKNOWN: RouteView = RouteView {
        phase: Phase::RedisOnly,
        percent: 100,
        revision: 0,
        followed: 0,
    };
}

/// The phase a key base is produced in when its route is in `phase` with
/// `percent` of its keys flipped (see [`PhaseView::for_key`]).
pub fn key_phase(phase: Phase, percent: u8, key: &str) -> Phase {
    match (phase, percent) {
        (Phase::PostgresOnly, pct) if pct < 100 && bucket(key) >= pct => Phase::Shadow,
        (phase, _) => phase,
    }
}

impl PhaseView {
    /// A view holding these route → phase pairs (all keys flipped).
    pub fn new(initial: impl IntoIterator<Item = (String, Phase)>) -> Self {
        let view = PhaseView::default();
        for (route, phase) in initial {
            view.set(&route, phase);
        }
        view
    }

    fn read(&self, route: &str) -> RouteView {
        // A poisoned lock only means a writer panicked mid-insert of a Copy
        // value: the map itself is intact, so keep serving it.
        let phases = self.phases.read().unwrap_or_else(|e| e.into_inner());
        phases.get(route).copied().unwrap_or(RouteView::UNKNOWN)
    }

    fn update(&self, route: &str, change: impl FnOnce(&mut RouteView)) {
        let mut phases = self.phases.write().unwrap_or_else(|e| e.into_inner());
        change(
            phases
                .entry(route.to_string())
                .or_insert(RouteView::UNKNOWN),
        );
    }

    /// The route's current phase.
    pub fn get(&self, route: &str) -> Phase {
        self.read(route).phase
    }

    /// The share of keys (percent) that go Postgres-only in `postgres_only`.
    pub fn percent(&self, route: &str) -> u8 {
        self.read(route).percent
    }

    /// The phase a job with this key base (an id, or a content hash) is
    /// produced in: in a partial `postgres_only`, keys outside the flipped
    /// share are produced as in `shadow` (written to both sides, run live on
    /// Redis). Every other phase applies to every key.
    pub fn for_key(&self, route: &str, key: &str) -> Phase {
        let r = self.read(route);
        key_phase(r.phase, r.percent, key)
    }

    /// Sets the route's phase with every key flipped; every clone sees it at once.
    pub fn set(&self, route: &str, phase: Phase) {
        self.set_with_percent(route, phase, 100);
    }

    /// Sets the route's phase and flipped share.
    pub fn set_with_percent(&self, route: &str, phase: Phase, percent: u8) {
        self.update(route, |r| {
            r.phase = phase;
            r.percent = percent.min(100);
        });
    }

    /// Sets the route's phase and flipped share as of the stored flag's
    /// `revision`, in one step: a push reading the new phase also reads
    /// that the new revision is not followed yet.
    pub fn set_revised(&self, route: &str, phase: Phase, percent: u8, revision: i64) {
        self.update(route, |r| {
            r.phase = phase;
            r.percent = percent.min(100);
            r.revision = revision;
        });
    }

    /// The stored flag's revision the view holds for the route.
    pub fn revision(&self, route: &str) -> i64 {
        self.read(route).revision
    }

    /// Records that every live follower follows `revision` of the route.
    pub fn set_followed(&self, route: &str, revision: i64) {
        self.update(route, |r| r.followed = r.followed.max(revision));
        self.routed.followed.notify_waiters();
    }

    /// Whether every live follower follows the revision the view holds.
    pub fn followed_by_all(&self, route: &str) -> bool {
        let r = self.read(route);
        r.followed >= r.revision
    }

    /// The route's phase and flipped share, only when every live follower
    /// follows the revision they are from (read together), or the route is
    /// in `redis_only`: a push is then only forwarded, unmirrored, and
    /// nothing in Postgres judges it, so it never waits.
    pub fn followed(&self, route: &str) -> Option<(Phase, u8)> {
        let r = self.read(route);
        (r.followed >= r.revision || r.phase == Phase::RedisOnly).then_some((r.phase, r.percent))
    }

    /// Waits until every live follower follows the revision the view holds
    /// for the route, or `until`; whether they do.
    pub async fn wait_followed(&self, route: &str, until: tokio::time::Instant) -> bool {
        loop {
            let changed = self.routed.followed.notified();
            if self.followed_by_all(route) {
                return true;
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                return self.followed_by_all(route);
            }
        }
    }

    /// The pushes this process routed and has not written yet.
    pub fn routed(&self) -> &Arc<Routed> {
        &self.routed
    }

    /// Counts one push routed now (see [`super::following`]).
    pub fn route_push(&self) -> RoutedPush {
        self.routed.push()
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

    #[test]
    fn a_partial_flip_is_sticky_by_key_and_grows_monotonically() {
        let view = PhaseView::default();
        view.set_with_percent("r", Phase::PostgresOnly, 10);
        let keys: Vec<String> = (0..2000).map(|i| format!("jid-{i}")).collect();
        let flipped = |v: &PhaseView| -> Vec<bool> {
            keys.iter()
                .map(|k| v.for_key("r", k) == Phase::PostgresOnly)
                .collect()
        };
        let at10 = flipped(&view);
        let share = at10.iter().filter(|f| **f).count();
        assert!((120..=280).contains(&share), "about 10% of 2000: {share}");
        assert_eq!(flipped(&view), at10, "sticky");
        view.set_with_percent("r", Phase::PostgresOnly, 50);
        let at50 = flipped(&view);
        assert!(at10.iter().zip(&at50).all(|(a, b)| !a || *b), "10% ⊂ 50%");
        view.set("r", Phase::PostgresOnly);
        assert!(flipped(&view).iter().all(|f| *f));
        view.set_with_percent("r", Phase::Shadow, 10);
        assert_eq!(view.for_key("r", "jid-1"), Phase::Shadow);
    }
}
