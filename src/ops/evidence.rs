//! Which mirror copies Redis provably lost. A mirror copy with no final
//! Redis-side outcome that Redis does not hold (in no list qbridge reads,
//! not in the consumer's ran set) is one of two things:
//!
//! - **repairable**: there is evidence Redis lost data after its push (see
//!   [`crate::redis::epoch`]: a restart, a flush, a failover), and the
//!   route's Redis side is qbridge's consumer, which keeps every item it has
//!   in a list or its ran set, so nothing else can hold it;
//! - **unaccounted**: no such evidence, or an outside fleet runs the route
//!   (it holds jobs where qbridge cannot look — popped by BRPOP and running,
//!   an unacked hash, a retry set — and may report late or never). Silence
//!   is not a loss: these are reported with the reason and pushed back only
//!   on an operator's audited decision (`--assume-lost`).
//!
//! The diff and repair both classify through [`classify`], so what the diff
//! calls repairable is exactly what repair pushes back.

use sqlx::PgPool;

use crate::config::RedisSideKind;
use crate::error::Result;
use crate::redis::epoch::{self, Epoch};
use crate::routes::Route;

/// Mirror copies Redis does not account for, sorted by what qbridge knows.
#[derive(Debug, Clone, Default)]
pub struct Accounting {
    /// With evidence of a loss: (job key, the evidence in one line).
    pub repairable: Vec<(String, String)>,
    /// Without: job keys, and why qbridge cannot tell.
    pub unaccounted: Vec<String>,
    pub reason: Option<String>,
}

/// Why a fleet route's silent mirror copies stay unaccounted.
pub const FLEET_REASON: &str = "outcome unknown: the route's Redis side is an outside fleet \
     (redis_side = \"fleet\"), which may still hold or run them, or have run them without a \
     report, where qbridge cannot look; wait for the fleet's reports (see when each came \
     due); pushing back a job the fleet still has runs it twice, so --assume-lost only a \
     job you have checked the fleet no longer has";

/// Why silent mirror copies of qbridge's consumer stay unaccounted.
pub const NO_EVIDENCE_REASON: &str = "no outcome and not in Redis, but no restart, flush or \
     failover of Redis was observed after their push, so qbridge cannot tell them lost \
     (something outside qbridge may have taken them); --assume-lost only a job you have \
     checked no process still holds or runs: pushing it back otherwise runs it twice";

/// Classifies `keys` (mirror copies of `route` that Redis does not account
/// for) given Redis's current `epoch` (none: not observed).
pub async fn classify(
    db: &PgPool,
    route: &Route,
    epoch: Option<&Epoch>,
    keys: Vec<String>,
) -> Result<Accounting> {
    if keys.is_empty() {
        return Ok(Accounting::default());
    }
    if route.config.redis_side == RedisSideKind::Fleet {
        return Ok(Accounting {
            repairable: Vec::new(),
            unaccounted: keys,
            reason: Some(FLEET_REASON.into()),
        });
    }
    let Some(epoch) = epoch else {
        return Ok(Accounting {
            repairable: Vec::new(),
            unaccounted: keys,
            reason: Some(NO_EVIDENCE_REASON.into()),
        });
    };
    // Content hashes no pop took yet are judged per text, the rest per key.
    let by_text = epoch::text_loss_evidence(db, route, epoch, &keys).await?;
    let judged: std::collections::HashSet<&str> = by_text.iter().map(|(k, _)| k.as_str()).collect();
    let per_key: Vec<String> = keys
        .iter()
        .filter(|k| !judged.contains(k.as_str()))
        .cloned()
        .collect();
    let mut found = epoch::loss_evidence(db, route, epoch, &per_key).await?;
    found.extend(by_text.into_iter().filter_map(|(k, line)| Some((k, line?))));
    let proven: std::collections::HashSet<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
    let unaccounted: Vec<String> = keys
        .iter()
        .filter(|k| !proven.contains(k.as_str()))
        .cloned()
        .collect();
    let reason = (!unaccounted.is_empty()).then(|| NO_EVIDENCE_REASON.to_string());
    Ok(Accounting {
        repairable: found,
        unaccounted,
        reason,
    })
}
