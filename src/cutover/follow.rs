//! Following phase changes across processes: each process running the
//! proxy records in `qbridge.phase_followers` the revision of each route's
//! flag it follows — once every push it routed under an earlier one is
//! written — and every process reads from there whether all live followers
//! follow the revision its view holds (why: [`crate::model::following`]).
//!
//! Run by the phase watch after each poll ([`Follow::step`]); while a
//! route is not followed by all, the watch polls every [`SOON`].

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use crate::metrics as m;
use crate::model::following::{Barrier, FOLLOW_WAIT};
use crate::model::PhaseView;

/// A follower silent this long is taken for gone (crashed, or cut off from
/// Postgres): a dead process must not hold every push. What it routed and
/// did not write before it died is the one way left around the rule.
pub const EXPIRY: Duration = Duration::from_secs(5);

/// How often the watch polls while a route is not followed by all.
pub const SOON: Duration = Duration::from_millis(20);

/// How long one step waits for this process's earlier pushes to be
/// written before it polls again.
const DRAIN_STEP: Duration = Duration::from_millis(100);

const BEAT_SQL: &str = r#"
INSERT INTO qbridge.phase_followers AS f (process, route, followed)
SELECT $1, t.route, t.followed FROM unnest($2::text[], $3::int8[]) AS t(route, followed)
ON CONFLICT (process, route)
DO UPDATE SET followed = greatest(f.followed, EXCLUDED.followed), beat = now()
"#;

/// Rows of followers gone for good (each start is a new process).
const FORGET_SQL: &str =
    "DELETE FROM qbridge.phase_followers WHERE beat < now() - interval '1 day'";

/// What a stopping follower leaves: a revision no change reaches, so its
/// row holds nothing back even if a last beat writes it again.
const LEFT: i64 = i64::MAX;

/// How long a generation may take to drain before the watch says which
/// process holds every route's pushes back, and how many it waits for.
const SLOW_DRAIN: Duration = Duration::from_secs(5);

/// Per route, the lowest revision a live follower follows.
const FOLLOWED_SQL: &str = r#"
SELECT route, min(followed) FROM qbridge.phase_followers
 WHERE route = ANY($1) AND beat > now() - make_interval(secs => $2::float8)
 GROUP BY route
"#;

/// One process's part in following its routes' phase changes.
#[derive(Debug)]
pub struct Follow {
    /// This process's name among the followers, when it routes pushes.
    process: Option<Uuid>,
    routes: Vec<String>,
    /// The revision this process follows, per route.
    follows: HashMap<String, i64>,
    /// A generation closed, and the revisions followed once it drains.
    closing: Option<Closing>,
}

/// A generation this process closed and waits for.
#[derive(Debug)]
struct Closing {
    barrier: Barrier,
    /// The revisions followed once it drains.
    held: HashMap<String, i64>,
    since: std::time::Instant,
    warned: bool,
}

impl Follow {
    /// Starts following `routes` as `view` holds them; a `process` that
    /// routes pushes is recorded as a follower of what its view holds now
    /// (it routed nothing before).
    pub async fn start(
        pool: &PgPool,
        view: &PhaseView,
        routes: Vec<String>,
        process: Option<Uuid>,
    ) -> sqlx::Result<Follow> {
        let follows = routes
            .iter()
            .map(|r| (r.clone(), view.revision(r)))
            .collect();
        let follow = Follow {
            process,
            routes,
            follows,
            closing: None,
        };
        if process.is_some() {
            sqlx::query(FORGET_SQL).execute(pool).await?;
        }
        follow.beat(pool).await?;
        Ok(follow)
    }

    /// After a poll: follows what the view holds once this process's
    /// earlier pushes are written, says so, and reads whether every live
    /// follower does. Returns whether every route is followed by all.
    pub async fn step(&mut self, pool: &PgPool, view: &PhaseView) -> sqlx::Result<bool> {
        if self.process.is_some() {
            let behind = self
                .routes
                .iter()
                .any(|r| view.revision(r) > self.follows[r]);
            if behind && self.closing.is_none() {
                self.closing = Some(Closing {
                    barrier: view.routed().barrier(),
                    held: self
                        .routes
                        .iter()
                        .map(|r| (r.clone(), view.revision(r)))
                        .collect(),
                    since: std::time::Instant::now(),
                    warned: false,
                });
            }
            if let Some(closing) = &mut self.closing {
                if view.routed().drain(closing.barrier, DRAIN_STEP).await {
                    self.follows = std::mem::take(&mut closing.held);
                    self.closing = None;
                } else if closing.since.elapsed() >= SLOW_DRAIN && !closing.warned {
                    closing.warned = true;
                    let pending = view.routed().pending(closing.barrier);
                    tracing::warn!(pending, process = %self.process.unwrap_or_default(),
                        refused_after = ?FOLLOW_WAIT,
                        "pushes this proxy routed before a phase change are still not written \
                         (a client not reading its replies, a Redis not answering, a MULTI \
                         left open); until they are, pushes on changed routes wait, then are \
                         refused");
                }
            }
            self.beat(pool).await?;
        }
        let unsettled: Vec<&String> = self
            .routes
            .iter()
            .filter(|r| !view.followed_by_all(r))
            .collect();
        if !unsettled.is_empty() {
            let rows: Vec<(String, Option<i64>)> = sqlx::query_as(FOLLOWED_SQL)
                .bind(&unsettled)
                .bind(EXPIRY.as_secs_f64())
                .fetch_all(pool)
                .await?;
            let lowest: HashMap<String, Option<i64>> = rows.into_iter().collect();
            for route in unsettled {
                // No live follower: nothing routed elsewhere can be in flight.
                let followed = lowest.get(route).copied().flatten();
                view.set_followed(route, followed.unwrap_or(view.revision(route)));
            }
        }
        let mut all = self.closing.is_none();
        for route in &self.routes {
            let followed = view.followed_by_all(route);
            metrics::gauge!(m::ROUTE_FOLLOWED, "route" => route.clone())
                .set(f64::from(u8::from(followed)));
            all &= followed;
        }
        Ok(all)
    }

    /// Records the revisions this process follows (and that it is alive).
    async fn beat(&self, pool: &PgPool) -> sqlx::Result<()> {
        let Some(process) = self.process else {
            return Ok(());
        };
        let followed: Vec<i64> = self.routes.iter().map(|r| self.follows[r]).collect();
        sqlx::query(BEAT_SQL)
            .bind(process)
            .bind(&self.routes)
            .bind(&followed)
            .execute(pool)
            .await?;
        Ok(())
    }
}

/// A stopping follower, once everything it routed is written, no longer
/// holds any push back (its row expires after [`EXPIRY`]).
pub async fn leave(pool: &PgPool, process: Uuid) -> sqlx::Result<()> {
    sqlx::query("UPDATE qbridge.phase_followers SET followed = $2 WHERE process = $1")
        .bind(process)
        .bind(LEFT)
        .execute(pool)
        .await?;
    Ok(())
}
