//! Feeds a process's [`PhaseView`] from the stored phase flag.
//!
//! At start-up every configured route is registered (its config phase is
//! stored unless a phase is stored already: from then on the stored one
//! wins) and the view starts from what is stored. Then a poll every
//! `interval` (500 ms in production) is the source of truth, so every
//! process learns a change within a second without depending on a LISTEN
//! connection; a LISTEN on [`store::CHANNEL`] only makes it sooner. When
//! Postgres does not answer, the view keeps the last phases it had — the last
//! known good — and never falls back to a default.

use std::time::{Duration, Instant};

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::RouteConfig;
use crate::cutover::follow::{Follow, SOON};
use crate::cutover::store::{self, PhaseError};
use crate::metrics as m;
use crate::model::{Phase, PhaseView};

/// How often [`run`] reads the stored phases.
pub const INTERVAL: Duration = Duration::from_millis(500);
/// How long after a flip every running process has seen it (a few polls):
/// what decommission, the identical-item count and the oracle wait for.
pub const FOLLOWED: Duration = Duration::from_millis(INTERVAL.as_millis() as u64 * 3 + 500);
/// How long a lost LISTEN connection waits before it is tried again.
const RELISTEN_EVERY: Duration = Duration::from_secs(5);

/// Registers `routes`, returns a view of their stored phases and the task
/// that keeps it current until `token` is cancelled. `by` names this process
/// in the audit log of a first registration. `listen_url` is where the
/// LISTEN connection goes (`None` behind a transaction-mode pooler without
/// a direct URL: the poll alone, within [`INTERVAL`]).
pub async fn attach(
    pool: &PgPool,
    listen_url: Option<&str>,
    routes: &[RouteConfig],
    by: &str,
    token: &CancellationToken,
) -> Result<(PhaseView, Option<JoinHandle<()>>), PhaseError> {
    attach_following(pool, listen_url, routes, by, token, None).await
}

/// [`attach`] for a process that routes pushes (it runs the proxy): it
/// is recorded as `follower` among those every push waits for after a
/// change (`super::follow`).
pub async fn attach_following(
    pool: &PgPool,
    listen_url: Option<&str>,
    routes: &[RouteConfig],
    by: &str,
    token: &CancellationToken,
    follower: Option<uuid::Uuid>,
) -> Result<(PhaseView, Option<JoinHandle<()>>), PhaseError> {
    if routes.is_empty() {
        return Ok((PhaseView::default(), None));
    }
    let view = PhaseView::default();
    for route in routes {
        let state = store::register(pool, &route.name, route.phase, by).await?;
        if state.phase != route.phase {
            tracing::info!(route = %route.name, stored = %state.phase, config = %route.phase,
                "the stored phase wins over the config's");
        }
        view.set_with_percent(&route.name, state.phase, state.percent);
    }
    run_once(pool, &view).await?;
    publish(&view, routes.iter().map(|r| r.name.as_str()));
    let names: Vec<String> = routes.iter().map(|r| r.name.clone()).collect();
    // Before the first push: this process's place among the followers, and
    // whether every live one follows what the view holds.
    let mut follow = Follow::start(pool, &view, names.clone(), follower).await?;
    follow.step(pool, &view).await?;
    let listen_url = listen_url.map(str::to_string);
    let task = tokio::spawn(follow_loop(
        pool.clone(),
        listen_url,
        view.clone(),
        (names, follow),
        INTERVAL,
        token.clone(),
    ));
    Ok((view, Some(task)))
}

/// Reads every stored phase into `view`; returns how many routes changed.
/// On error `view` is left as it was.
pub async fn run_once(pool: &PgPool, view: &PhaseView) -> Result<usize, PhaseError> {
    let mut changed = 0;
    for (state, revision) in store::all_revised(pool).await? {
        let before = (view.get(&state.route), view.percent(&state.route));
        let moved = before != (state.phase, state.percent);
        if moved {
            tracing::info!(route = %state.route, from = %before.0, to = %state.phase,
                percent = state.percent, by = %state.changed_by, "route phase changed");
            changed += 1;
        }
        if moved || view.revision(&state.route) != revision {
            view.set_revised(&state.route, state.phase, state.percent, revision);
        }
    }
    Ok(changed)
}

/// `qbridge_route_phase{route, phase}`: 1 for the route's phase, 0 for the others.
fn publish<'a>(view: &PhaseView, routes: impl Iterator<Item = &'a str>) {
    for route in routes {
        let now = view.get(route);
        for phase in Phase::ALL {
            metrics::gauge!(m::ROUTE_PHASE, "route" => route.to_string(), "phase" => phase.as_str())
                .set(f64::from(u8::from(phase == now)));
        }
    }
}

/// Polls (and listens) until `token` is cancelled, as a process that
/// routes no pushes. A failure is logged once when it starts and once when
/// it ends, not on every poll.
pub async fn run(
    pool: PgPool,
    listen_url: Option<String>,
    view: PhaseView,
    routes: Vec<String>,
    interval: Duration,
    token: CancellationToken,
) {
    let follow = match Follow::start(&pool, &view, routes.clone(), None).await {
        Ok(follow) => follow,
        Err(e) => return tracing::error!(error = %e, "cannot follow the route phases"),
    };
    follow_loop(pool, listen_url, view, (routes, follow), interval, token).await
}

/// [`run`], with this process's [`Follow`].
async fn follow_loop(
    pool: PgPool,
    listen_url: Option<String>,
    view: PhaseView,
    (routes, mut follow): (Vec<String>, Follow),
    interval: Duration,
    token: CancellationToken,
) {
    let mut failing = false;
    let mut listener: Option<PgListener> = None;
    let mut last_listen_try: Option<Instant> = None;
    loop {
        let polled = match run_once(&pool, &view).await {
            Ok(changed) => (follow.step(&pool, &view).await)
                .map(|all| (changed, all))
                .map_err(PhaseError::from),
            Err(e) => Err(e),
        };
        let mut settled = true;
        match polled {
            Ok((changed, all)) => {
                settled = all;
                if failing {
                    tracing::info!("phase store answers again");
                    failing = false;
                }
                // Gauges keep their values: set them again only on a change.
                if changed > 0 {
                    publish(&view, routes.iter().map(String::as_str));
                }
            }
            Err(e) if !failing => {
                tracing::warn!(error = %e, "cannot read route phases; keeping the last known ones");
                failing = true;
            }
            Err(_) => {}
        }
        if let Some(url) = listen_url.as_deref().filter(|_| {
            listener.is_none()
                && !failing
                && last_listen_try.is_none_or(|t| t.elapsed() >= RELISTEN_EVERY)
        }) {
            last_listen_try = Some(Instant::now());
            listener = listen(url).await;
        }
        // While a change is not followed by every process, pushes wait.
        let wait = tokio::time::sleep(if settled { interval } else { SOON });
        tokio::select! {
            _ = token.cancelled() => return,
            _ = wait => {}
            got = async {
                match listener.as_mut() {
                    Some(l) => l.try_recv().await,
                    None => std::future::pending().await,
                }
            } => {
                // A notification: poll now. An error or a closed connection:
                // drop it (polling goes on) and listen again later.
                if !matches!(got, Ok(Some(_))) {
                    listener = None;
                }
            }
        }
    }
}

async fn listen(url: &str) -> Option<PgListener> {
    let mut listener = PgListener::connect(url).await.ok()?;
    listener.listen(store::CHANNEL).await.ok()?;
    Some(listener)
}

/// A one-off view of the stored phases of `routes` (for commands that run
/// once): a route no process registered yet reads as its config phase.
pub async fn stored_view(pool: &PgPool, routes: &[RouteConfig]) -> Result<PhaseView, PhaseError> {
    let view = PhaseView::new(routes.iter().map(|r| (r.name.clone(), r.phase)));
    for state in store::all(pool).await? {
        view.set_with_percent(&state.route, state.phase, state.percent);
    }
    Ok(view)
}
