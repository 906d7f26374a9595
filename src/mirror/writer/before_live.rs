//! What a batch holding live copies settles before it is stored: every
//! mirror copy of its routes pushed before it must be in `job_keys` first,
//! or a client's re-push of that key after the flip is taken for a new job
//! and runs in Postgres while Redis runs the original. Three places hold
//! such copies: another writer's batch being written (waited for, in gather
//! order: `super::super::order`), this mirror's parked copies (written
//! now), and the route's gap list, where any process parked what it could
//! not write during a Postgres outage (written now, under the gap repair's
//! lock). What cannot be settled is not guessed at: the live copies of
//! that route are refused with the reason, and the client retries. One
//! exception: when Redis does not answer, the gap list cannot be read, and
//! the live push is stored without it — `postgres_only` must not depend on
//! Redis, and the Redis side cannot run the originals through qbridge then
//! either.

use std::collections::HashMap;
use std::sync::Arc;

use super::super::gap_repair::{drain_route, Drained};
use super::super::options::StoreError;
use super::super::request::Request;
use super::Writer;
use crate::queue::JobCopy;
use crate::routes::Route;

impl Writer {
    /// Settles what `batch`'s live copies (if any) must come after; returns
    /// the batch without the live requests it had to refuse (answered).
    pub(super) async fn before_live(&mut self, batch: Vec<Request>, place: u64) -> Vec<Request> {
        let mut live_routes: Vec<Arc<Route>> = Vec::new();
        for request in batch.iter().filter(|r| r.copy == JobCopy::Live) {
            if !live_routes.iter().any(|r| r.name == request.route.name) {
                live_routes.push(Arc::clone(&request.route));
            }
        }
        if live_routes.is_empty() {
            return batch;
        }
        let routes: Vec<&str> = live_routes.iter().map(|r| r.name.as_str()).collect();
        self.gather.order.wait_before(place, &routes).await;
        if !self.retained.is_empty() {
            self.write_kept().await;
        }
        // Another writer may have taken the parked copies between the wait
        // and the look above: it took its ticket before them, so waiting
        // again covers its write. What is still parked after that stays so.
        self.gather.order.wait_before(place, &routes).await;
        let mut refused: HashMap<String, String> = HashMap::new();
        for route in self.retained.routes() {
            refused.insert(
                route,
                "mirror copies parked during a Postgres outage are not written yet".into(),
            );
        }
        if let Some(conn) = self.spool.as_mut() {
            for route in &live_routes {
                if refused.contains_key(&route.name) {
                    continue;
                }
                match drain_route(&self.pool, conn, route, self.opts.payload_limit).await {
                    Drained::Empty => {}
                    Drained::Left(why) => {
                        refused.insert(route.name.clone(), why);
                    }
                    Drained::RedisAway(why) => {
                        tracing::warn!(route = %route.name, error = %why,
                            "cannot read the gap list; storing the live push without it");
                    }
                }
            }
        }
        if refused.is_empty() {
            return batch;
        }
        let mut kept = Vec::with_capacity(batch.len());
        for request in batch {
            let why = (request.copy == JobCopy::Live)
                .then(|| refused.get(&request.route.name))
                .flatten();
            match (why, request.reply) {
                (Some(why), Some(reply)) => {
                    let _ = reply.send(Err(StoreError::NotYet(why.clone())));
                }
                (_, reply) => kept.push(Request { reply, ..request }),
            }
        }
        kept
    }
}
