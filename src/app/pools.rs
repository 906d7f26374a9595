//! The Postgres consumer of a process, built from the config: one
//! [`WorkerPool`] per `[[pools]]` entry and per route with a handler, each
//! with its waker (for the LISTEN connection), the completer's channel, and
//! — for a route's pool — the outcome recorder, the route table and the
//! route's separate shadow handler.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, PoolConfig};
use crate::error::Result;
use crate::handler::Handler;
use crate::queue::completer::Finished;
use crate::queue::listener::Wakers;
use crate::routes::Routes;
use crate::shadow::outcomes::WriterReport;
use crate::shadow::{OutcomeRecorder, RecorderOptions};
use crate::worker::pool::{RouteRuns, WorkerPool};

/// The pools of a process, not yet running.
pub struct Pools {
    pub pools: Vec<WorkerPool>,
    /// Wakes each pool on a NOTIFY for one of its queues.
    pub wakers: Wakers,
    /// Writes the outcomes the route pools record; it ends once every pool
    /// (and so every recorder clone) is gone.
    pub outcome_writer: Option<JoinHandle<WriterReport>>,
}

/// Builds every pool of `cfg`. `handler_override` replaces every configured
/// handler (benchmarks and tests).
pub fn build(
    cfg: &Config,
    db: &sqlx::PgPool,
    routes: &Routes,
    completer: &mpsc::Sender<Finished>,
    handler_override: Option<&Arc<Handler>>,
) -> Result<Pools> {
    // A route's pool records its live attempts for the shadow comparison.
    let route_queues: Vec<&str> = cfg.routes.iter().map(|r| r.queue.as_str()).collect();
    let is_route_pool =
        |pc: &PoolConfig| pc.queues.iter().all(|q| route_queues.contains(&q.as_str()));
    let (recorder, outcome_writer) = match cfg.pools.iter().any(is_route_pool) {
        true => {
            let (recorder, writer) = OutcomeRecorder::spawn(
                db.clone(),
                RecorderOptions::default(),
                CancellationToken::new(),
            );
            (Some(recorder), Some(writer))
        }
        false => (None, None),
    };
    let shadow_handlers = shadow_handlers(cfg)?;
    let mut wakers = Wakers::default();
    let mut pools = Vec::new();
    for pc in &cfg.pools {
        let waker = Arc::new(Notify::new());
        wakers.register(&pc.queues, waker.clone());
        pools.push(WorkerPool {
            config: pc.clone(),
            db: db.clone(),
            handler: match handler_override {
                Some(h) => Arc::clone(h),
                None => Arc::new(Handler::from_config(&pc.handler)?),
            },
            completer: completer.clone(),
            waker,
            worker_id: cfg.worker_id.clone(),
            routes: recorder
                .clone()
                .filter(|_| is_route_pool(pc))
                .map(|recorder| RouteRuns {
                    recorder,
                    routes: routes.clone(),
                    shadow_handlers: shadow_handlers.clone(),
                }),
        });
    }
    Ok(Pools {
        pools,
        wakers,
        outcome_writer,
    })
}

/// Each route's separate shadow handler (`[routes.shadow] handler`), by
/// route name.
fn shadow_handlers(cfg: &Config) -> Result<HashMap<String, Arc<Handler>>> {
    let mut handlers = HashMap::new();
    for route in &cfg.routes {
        if let Some(h) = &route.cutover.shadow.handler {
            handlers.insert(route.name.clone(), Arc::new(Handler::from_config(h)?));
        }
    }
    Ok(handlers)
}
