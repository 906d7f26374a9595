//! The reader's part for pushes made from a known Lua script
//! (`super::super::push_scripts`): forwarded to Redis, which runs the script,
//! and mirrored once Redis answers that it pushed.
//!
//! The script runs inside Redis, so the proxy cannot answer it in Redis's
//! place: after the flip (`postgres_only`) such a push still goes to Redis,
//! where the fleet runs it, and is mirrored as the Redis side's copy (the
//! decommission gate waits for it like any job Redis still holds). A
//! decommissioned route has no Redis side any more, so there the command is
//! refused with an error the producer sees, never forwarded into a list
//! nobody reads.

use std::time::Instant;

use bytes::Bytes;
use tokio::io::AsyncWrite;

use super::{Batch, Reader, Routing};
use crate::metrics as m;
use crate::model::structures::score_time;
use crate::model::Phase;
use crate::proxy::command::{MirrorPush, Tag};
use crate::proxy::push_scripts::{self, ScriptPush};

/// The answer to a script push on a decommissioned route.
const DECOMMISSIONED: &[u8] =
    b"-ERR qbridge: this queue is decommissioned and runs on Postgres only; \
a push from a Lua script (RQ's unique enqueue) cannot run there: enqueue without unique=True\r\n";

impl<W: AsyncWrite + Unpin> Reader<W> {
    /// `EVAL`/`EVALSHA` of a script known to push onto a routed list or into
    /// a route's scheduled set; anything else is not routed here.
    pub(super) async fn route_script(
        &mut self,
        name: &str,
        args: &[Bytes],
        in_multi: bool,
        batch: &mut Batch,
        read_at: Instant,
    ) -> std::io::Result<Routing> {
        let Some(push) = push_scripts::classify(name, args) else {
            return Ok(Routing::NotRouted);
        };
        let routes = &self.shared.routes;
        let target = match &push {
            ScriptPush::List { list, .. } => list,
            ScriptPush::SetAdd { set, .. } => set,
        };
        if !routes.is_routed_key(target) && !routes.is_mirrored_set(target) {
            return Ok(Routing::NotRouted);
        }
        let Some(db) = self.selected_db(batch, read_at).await?.db else {
            return Ok(Routing::NotRouted);
        };
        let routes = &self.shared.routes;
        let (route, first) = match &push {
            ScriptPush::List { list, item } => (routes.by_db_key(db, list), Some(item)),
            ScriptPush::SetAdd { set, member, .. } => (routes.set_route(db, set, member), None),
        };
        let Some(route) = route.cloned() else {
            return Ok(Routing::NotRouted);
        };
        let first = first.cloned();
        let (routed, phase) = match self
            .followed_phase(&route, first.as_ref(), in_multi, batch, read_at)
            .await?
        {
            Ok(followed) => followed,
            Err(refused) => return Ok(refused),
        };
        let mirror = match push {
            ScriptPush::List { item, .. } => {
                MirrorPush::new(route.clone(), vec![item], phase, routed)
            }
            ScriptPush::SetAdd { member, score, .. } => MirrorPush {
                route: route.clone(),
                items: vec![member],
                due: Some(vec![score_time(score)]),
                ledger_only: false,
                routed,
            },
        };
        metrics::counter!(m::ROUTE_PUSHES, "route" => route.name.clone(), "phase" => phase.as_str(), "via" => "proxy")
            .increment(1);
        Ok(match phase {
            Phase::RedisOnly => Routing::NotRouted,
            Phase::DualWrite | Phase::Shadow | Phase::PostgresOnly => Routing::Forward(mirror),
            Phase::Decommissioned => Routing::Local(Tag::Answer(DECOMMISSIONED)),
        })
    }
}
