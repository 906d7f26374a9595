//! Before decommission touches a processing list: the route's Redis
//! consumers are idle. Each qbridge Redis consumer beats
//! `qbridge:consumer:<route>:<consumer>` (`redis::consumer::heartbeat`);
//! the archive may start only when every consumer of the route
//!
//! - has acknowledged `decommissioned` and holds nothing (its slots have
//!   stopped, its handlers finished), or
//! - has no heartbeat any more (it expired, or the process exited cleanly)
//!   — it is gone, and its processing lists are archived with the rest.
//!
//! A heartbeat that is there but says another phase, or holds items, means
//! wait: a late beat is not a dead consumer. After the route's
//! `gates.decommission_wait` the archive is refused, naming the consumers
//! it waited for, with nothing renamed or archived, so the operator can run
//! `qbridge cutover advance` again.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

use crate::error::{Error, Result};
use crate::ops::redis_view::scan;
use crate::redis::consumer::heartbeat::{self, Heartbeat};
use crate::redis::keys::RouteKeys;
use crate::routes::Route;

/// How often the heartbeats are read again while waiting.
const POLL: Duration = Duration::from_millis(200);

/// The consumers of a route as decommission found them.
#[derive(Debug, Default)]
pub(super) struct Consumers {
    /// Said `decommissioned`, holding nothing.
    pub acknowledged: Vec<String>,
    /// No heartbeat, with processing lists left: gone.
    pub gone: Vec<String>,
    /// Still beating another phase or holding items.
    busy: Vec<Heartbeat>,
}

/// Waits until every consumer of `route` is idle (see the module docs).
pub(super) async fn wait(
    redis: &mut ConnectionManager,
    route: &Route,
    keys: &RouteKeys,
) -> Result<Consumers> {
    let patience = route.config.cutover.gates.decommission_wait;
    let until = Instant::now() + patience;
    loop {
        let found = look(redis, keys).await?;
        if found.busy.is_empty() {
            return Ok(found);
        }
        if Instant::now() >= until {
            return Err(refusal(route, patience, &found.busy));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One look at the route's consumers. The processing lists are read before
/// the heartbeats: a consumer beats before it touches a list, so a list it
/// is using is never seen without its heartbeat being seen after it.
async fn look(redis: &mut ConnectionManager, keys: &RouteKeys) -> Result<Consumers> {
    let lists = scan(redis, &keys.any_processing()).await?;
    let owners: BTreeSet<&str> = lists
        .iter()
        .filter_map(|l| keys.processing_owner(l))
        .collect();
    let found = scan(redis, &keys.any_heartbeat()).await?;
    let beats = heartbeat::read(redis, keys, &found).await?;
    let beating: BTreeSet<&str> = beats.iter().map(|b| b.consumer.as_str()).collect();
    let gone = owners.difference(&beating).map(|c| c.to_string()).collect();
    let (idle, busy): (Vec<Heartbeat>, Vec<Heartbeat>) = beats
        .into_iter()
        .partition(Heartbeat::acknowledged_decommission);
    Ok(Consumers {
        acknowledged: idle.into_iter().map(|b| b.consumer).collect(),
        gone,
        busy,
    })
}

fn refusal(route: &Route, patience: Duration, busy: &[Heartbeat]) -> Error {
    let now = chrono::Utc::now().timestamp_millis();
    let named: Vec<String> = busy
        .iter()
        .map(|b| {
            let phase = b.phase.map_or("an unreadable phase", |p| p.as_str());
            let holding = match b.holding {
                u64::MAX => "an unreadable count of".to_string(),
                n => n.to_string(),
            };
            let ago = (now - b.at_ms).max(0) as f64 / 1000.0;
            format!(
                "{} (on {phase}, holding {holding} items, beat {ago:.1}s ago)",
                b.consumer
            )
        })
        .collect();
    Error::Refused(format!(
        "route {:?} is decommissioned but its Redis consumers did not stop within {}s \
         (gates.decommission_wait): {}; nothing was archived: run `qbridge cutover advance {}` \
         again once they finish",
        route.name,
        patience.as_secs_f64(),
        named.join(", "),
        route.name
    ))
}
