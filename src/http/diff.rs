//! `GET /v1/routes/{route}/diff?since=10m`: the diff of `qbridge diff`, as
//! JSON (the verdict line is its `verdict` field). Read-only; behind the
//! admin token because it names job keys. Repairs and phase changes are in
//! [`super::admin`].

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::{error_reply, AppState, Reply};

#[derive(Debug, Deserialize)]
pub(super) struct DiffQuery {
    since: Option<String>,
}

pub(super) async fn get_diff(
    State(state): State<AppState>,
    Path(route): Path<String>,
    Query(q): Query<DiffQuery>,
) -> Reply {
    let Some(producer) = &state.producer else {
        return Err(error_reply(
            StatusCode::NOT_FOUND,
            "this process has no routes",
        ));
    };
    let routes = producer.routes();
    let Some(route) = routes.by_name(&route).cloned() else {
        return Err(error_reply(
            StatusCode::NOT_FOUND,
            &format!("no route named {route:?}"),
        ));
    };
    let since = match &q.since {
        Some(text) => crate::ops::window::parse_since(text),
        None => crate::ops::gates::default_since(&state.db, &route).await,
    }
    .map_err(|e| match q.since {
        Some(_) => error_reply(StatusCode::BAD_REQUEST, &e.to_string()),
        None => error_reply(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    })?;
    let Some(redis) = producer.redis() else {
        return Err(error_reply(
            StatusCode::CONFLICT,
            "every route is decommissioned: there is no Redis side to compare",
        ));
    };
    let mut redis = redis.clone();
    let phase = routes.phase(&route);
    match crate::ops::gates::diff_since(&state.db, &mut redis, &route, phase, since).await {
        Ok((diff, _)) => Ok((StatusCode::OK, Json(json!(diff)))),
        Err(e) => Err(error_reply(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())),
    }
}
