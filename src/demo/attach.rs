//! A route followed from outside the runtime: its phase watch, the route
//! table, the route itself and a producer for it. What the two drills and
//! the fault harness set up before they push and operate.

use std::sync::Arc;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::cutover::watch;
use crate::error::{Error, Result};
use crate::redis::producer::Producer;
use crate::routes::{Route, Routes};

/// The route `name` of `config`, its phase kept current.
pub struct AttachedRoute {
    pub routes: Routes,
    pub route: Arc<Route>,
    pub producer: Producer,
    pub watch: PhaseWatch,
}

/// The running phase watch; [`PhaseWatch::stop`] ends it.
pub struct PhaseWatch {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl PhaseWatch {
    pub async fn stop(self) {
        self.stop.cancel();
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }
}

impl AttachedRoute {
    /// Follows the phases of `config`'s routes (LISTEN on its database URL,
    /// as `application`), finds the route `name` and connects a producer to
    /// `redis_url`.
    pub async fn attach(
        db: &PgPool,
        config: &Config,
        name: &str,
        redis_url: &str,
        application: &str,
    ) -> Result<AttachedRoute> {
        let stop = CancellationToken::new();
        let (view, task) = watch::attach(
            db,
            Some(&config.database_url),
            &config.routes,
            application,
            &stop,
        )
        .await?;
        let watch = PhaseWatch { stop, task };
        let routes = Routes::new(&config.routes, view);
        let connected = match routes.by_name(name).cloned() {
            Some(route) => Producer::connect(
                db.clone(),
                Some(redis_url),
                routes.clone(),
                config.payload_limit,
            )
            .await
            .map(|producer| (route, producer)),
            None => Err(Error::CheckFailed(format!(
                "route {name:?} is not in the config"
            ))),
        };
        let (route, producer) = match connected {
            Ok(both) => both,
            Err(e) => {
                // Not left running behind an error.
                watch.stop().await;
                return Err(e);
            }
        };
        Ok(AttachedRoute {
            routes,
            route,
            producer,
            watch,
        })
    }
}
