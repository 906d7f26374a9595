//! The reader's part for a framework's sets: a `ZADD` to a schedule or
//! retry set mirrored as copies due later, and the commands that may take
//! members out of such a set (`super::super::set_pop`), tagged so the reply
//! side can record what Redis handed out.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::io::AsyncWrite;

use super::{Batch, Reader, Routing};
use crate::metrics as m;
use crate::model::structures::score_time;
use crate::model::Phase;
use crate::proxy::command::{classify, zadd_members, Cmd, MirrorPush};
use crate::proxy::{held_read, list_pop, set_pop};

impl<W: AsyncWrite + Unpin> Reader<W> {
    /// A `ZADD` to a framework's schedule or retry set (Sidekiq's are shared
    /// by every queue): the command always goes to Redis as it is; when the
    /// route of its first owned member is in `dual_write`/`shadow`, that
    /// route's members are then mirrored as copies due at their scores
    /// (`mirror::due`). Members of other routes in the same ZADD (Sidekiq's
    /// client adds one queue's jobs at a time) are left to `qbridge import`
    /// and the decommission carry, which read the sets.
    pub(super) async fn route_set_add(
        &mut self,
        args: &[Bytes],
        in_multi: bool,
        batch: &mut Batch,
        read_at: Instant,
    ) -> std::io::Result<Routing> {
        if args.len() < 4 || !self.shared.routes.is_mirrored_set(&args[1]) {
            return Ok(Routing::NotRouted);
        }
        let Some(members) = zadd_members(&args[1..]) else {
            return Ok(Routing::NotRouted);
        };
        let Some(db) = self.selected_db(batch, read_at).await?.db else {
            return Ok(Routing::NotRouted);
        };
        let routes = &self.shared.routes;
        let Some(route) = members
            .iter()
            .find_map(|(_, member)| routes.set_route(db, &args[1], member))
            .cloned()
        else {
            return Ok(Routing::NotRouted);
        };
        let (routed, phase) = match self
            .followed_phase(&route, None, in_multi, batch, read_at)
            .await?
        {
            Ok(followed) => followed,
            Err(refused) => return Ok(refused),
        };
        let routes = &self.shared.routes;
        if !matches!(phase, Phase::DualWrite | Phase::Shadow) {
            return Ok(Routing::NotRouted);
        }
        let (items, due) = members
            .into_iter()
            .filter(|(_, member)| {
                routes
                    .set_route(db, &args[1], member)
                    .is_some_and(|r| Arc::ptr_eq(r, &route))
            })
            .map(|(score, member)| (member.clone(), score_time(score)))
            .unzip();
        metrics::counter!(m::ROUTE_PUSHES, "route" => route.name.clone(), "phase" => phase.as_str(), "via" => "proxy")
            .increment(1);
        let due = Some(due);
        // A set's members are due later: their copies keep their rows.
        let ledger_only = false;
        Ok(Routing::Forward(MirrorPush {
            route,
            items,
            due,
            ledger_only,
            routed,
        }))
    }

    /// A forwarded command that is no routed push: a pop from a mirrored
    /// set is tagged for the reply side, anything else as pairing needs.
    pub(super) fn classify_forwarded(&self, name: &str, args: &[Bytes]) -> Cmd {
        let routes = &self.shared.routes;
        match set_pop::classify(name, args, &self.shared.pop_scripts, |key| {
            routes.is_mirrored_set(key) || (name == "HDEL" && routes.is_held_hash(key))
        }) {
            Some(pop) => Cmd::SetPop(pop),
            None => match list_pop::classify(name, args, |key| routes.is_routed_key(key)) {
                Some(pop) => Cmd::ListPop(pop),
                None => match held_read::classify(name, args, |key| routes.is_held_hash(key)) {
                    Some((hash, field)) => Cmd::HeldRead(hash, field),
                    None => classify(name, args),
                },
            },
        }
    }
}
