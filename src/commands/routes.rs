//! The route table the subcommands act on: the config's routes with their
//! stored phases, and a route by name with a one-line error.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::routes::{Route, Routes};

/// The route table with the stored phases.
pub async fn stored_routes(db: &sqlx::PgPool, config: &Config) -> Result<Routes> {
    let view = crate::cutover::watch::stored_view(db, &config.routes).await?;
    Ok(Routes::new(&config.routes, view))
}

/// The route named `name`, or a one-line error naming it.
pub(super) fn find(routes: &Routes, name: &str) -> Result<std::sync::Arc<Route>> {
    routes
        .by_name(name)
        .cloned()
        .ok_or_else(|| Error::InvalidInput(format!("no route named {name:?} in the config")))
}
