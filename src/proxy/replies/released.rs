//! The reply side of a pop from a framework's set (`super::super::set_pop`),
//! a list (`super::super::list_pop`) or a hash of held jobs
//! (`super::super::held_read`): what Redis handed out, recorded or
//! remembered before the client sees the reply.

use bytes::Bytes;
use tokio::io::AsyncRead;

use super::Replies;
use crate::model::formats::decode_bytes;
use crate::model::Phase;
use crate::proxy::session::Evidence;
use crate::proxy::set_pop::SetPop;

impl<R: AsyncRead + Unpin> Replies<R> {
    /// Records or remembers what a reply proves.
    pub(super) async fn record_evidence(&mut self, evidence: Evidence) {
        match evidence {
            Evidence::Released(pop, members, db) => self.record_released(pop, members, db).await,
            Evidence::Taken(items, db) => self.remember_taken(items, db),
        }
    }

    /// Records the handed-out members whose key is produced Postgres-only
    /// now (`postgres_only`, or a flipped share): the push that moves them
    /// on will be answered here and never reach Redis. Members of a route
    /// still produced to Redis need nothing: their push goes to Redis.
    pub(super) async fn record_released(
        &mut self,
        pop: SetPop,
        members: Vec<Bytes>,
        db: Option<i64>,
    ) {
        let Some(db) = db else {
            return;
        };
        let routes = &self.shared.routes;
        let structure = String::from_utf8_lossy(&pop.set).into_owned();
        let mut rows = Vec::new();
        for member in members {
            let Some((route, job)) = routes.set_job(db, &pop.set, &member) else {
                continue;
            };
            let decoded = decode_bytes(&route.format, Bytes::from(job));
            if matches!(
                routes.item_phase(route, &decoded),
                Phase::PostgresOnly | Phase::Decommissioned
            ) {
                let key = decoded.key.with_occurrence(0);
                rows.push((route.queue.clone(), key, structure.clone()));
            }
        }
        if rows.is_empty() {
            return;
        }
        // The replies before this one do not wait on Postgres.
        self.flush().await;
        self.shared.mirror.record_releases(rows).await;
    }

    /// Remembers the jobs Redis handed this client off routed lists, by
    /// route and key, so the same client pushing one back is known to give
    /// it up (`super::super::list_pop`).
    pub(super) fn remember_taken(&mut self, items: Vec<(Bytes, Bytes)>, db: Option<i64>) {
        let Some(db) = db else {
            return;
        };
        for (list, item) in items {
            let Some(route) = self.shared.routes.by_db_key(db, &list) else {
                continue;
            };
            let decoded = decode_bytes(&route.format, item);
            if decoded.key.is_content_hash() {
                // Identical texts are counted, not named: nothing to match.
                continue;
            }
            let key = decoded.key.with_occurrence(0);
            self.link.taken.add(route.name.clone(), key);
        }
    }
}
