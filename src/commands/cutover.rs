//! `qbridge cutover status|advance|rollback`: the operator's side of the
//! phase flag. Advances are gated (the failing numbers are printed and the
//! exit code is non-zero); `--force --reason` overrides and is audited.

use redis::aio::ConnectionManager;
use sqlx::PgPool;

use crate::cli::{CutoverArgs, CutoverCommand};
use crate::commands::routes::{find, stored_routes};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::ops::gates;
use crate::ops::operate::{self, Advanced, Refusal, Request};
use crate::output;
use crate::redis::connect::connect_redis_with;
use crate::routes::Routes;

use super::operator;

pub async fn run(config: &Config, cmd: CutoverCommand, as_json: bool) -> Result<()> {
    let db = config.open_db(2).await?;
    crate::db::check_schema(&db).await?;
    if config.routes.is_empty() {
        return Err(Error::Config(
            "no [[routes]] in the config: there is nothing to cut over".into(),
        ));
    }
    let routes = stored_routes(&db, config).await?;
    // Gates and decommissioning read Redis; status still works without it.
    let mut redis = connect_redis_with(&config.redis_url, &config.redis_tls).await;
    match cmd {
        CutoverCommand::Status => status(&db, redis.as_mut().ok(), &routes, as_json).await,
        CutoverCommand::Advance(args) => {
            let redis = redis.as_mut().ok();
            advance(&db, redis, &routes, &args, config.payload_limit, as_json).await
        }
        CutoverCommand::Percent(args) => {
            let route = find(&routes, &args.route)?;
            let by = operator(args.by.as_deref());
            let req = Request::new(&by, args.reason.as_deref());
            let state = operate::ramp(&db, redis.as_mut().ok(), &route, args.percent, &req).await?;
            let rest = match state.percent {
                100 => "every job key now goes Postgres-only".to_string(),
                p => format!(
                    "{p}% of job keys now go Postgres-only; the other {}% still go to Redis \
                     with a mirror copy, as in shadow",
                    100 - p
                ),
            };
            output::done(as_json, &format!("{}: {rest}", route.name));
            Ok(())
        }
        CutoverCommand::ShadowTest(args) => {
            let route = find(&routes, &args.route)?;
            let t = crate::ops::shadow_test::run(&db, config, &route, args.key.as_deref()).await?;
            if as_json {
                output::json(&t);
            } else {
                println!(
                    "{}: shadow call of job {}{} to {} answered: {}{}",
                    t.route,
                    t.key,
                    t.kind
                        .as_deref()
                        .map(|k| format!(" ({k})"))
                        .unwrap_or_default(),
                    t.handler,
                    t.answer,
                    t.digest
                        .as_deref()
                        .map(|d| format!(" (response digest {})", &d[..12.min(d.len())]))
                        .unwrap_or_default(),
                );
                println!(
                    "Now check that nothing happened: no email sent, no charge, no row written."
                );
            }
            Ok(())
        }
        CutoverCommand::Rollback(args) => {
            let route = find(&routes, &args.route)?;
            let by = operator(args.by.as_deref());
            let req = Request::new(&by, args.reason.as_deref());
            let state = operate::rollback(&db, redis.as_mut().ok(), &route, &req).await?;
            output::done(
                as_json,
                &format!("{}: rolled back to {}", route.name, state.phase),
            );
            Ok(())
        }
    }
}

/// `cutover status`: each route's phase and what its next gate says.
async fn status(
    db: &PgPool,
    mut redis: Option<&mut ConnectionManager>,
    routes: &Routes,
    as_json: bool,
) -> Result<()> {
    let mut rows = Vec::new();
    let mut report = Vec::new();
    for route in routes.iter() {
        let state = operate::state_of(db, route, &operator(None)).await?;
        let gate = gates::evaluate(db, redis.as_deref_mut(), route, &state).await?;
        let gate_text = match &gate {
            None => "-".to_string(),
            Some(g) if g.from == g.to && g.passed() => "archived; Redis empty".to_string(),
            Some(g) if g.passed() => format!("{} → {}: passes", g.from, g.to),
            Some(g) => format!(
                "{} → {}: refuses ({})",
                g.from,
                g.to,
                g.checks
                    .iter()
                    .filter(|c| !c.passed)
                    .map(|c| format!("{} {}", c.name, c.value))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        };
        // What the route's jobs wait in besides its list.
        let held = match redis.as_deref_mut() {
            Some(conn) => crate::ops::structures::read(conn, route).await?,
            None => Vec::new(),
        };
        let elsewhere = match crate::ops::structures::non_empty(&held) {
            left if left.is_empty() => "-".to_string(),
            left => left.join("; "),
        };
        let phase = match (state.phase, state.percent) {
            (crate::model::Phase::PostgresOnly, p) if p < 100 => {
                format!("postgres_only ({p}% of keys)")
            }
            (phase, _) => phase.to_string(),
        };
        rows.push(vec![
            state.route.clone(),
            phase,
            state.since.format("%Y-%m-%d %H:%M:%S").to_string(),
            state.changed_by.clone(),
            elsewhere,
            gate_text,
        ]);
        report.push(serde_json::json!({ "state": state, "gate": gate, "structures": held }));
    }
    if as_json {
        output::json(&serde_json::json!({ "routes": report }));
    } else {
        println!(
            "{}",
            output::table(
                &[
                    "route",
                    "phase",
                    "since",
                    "changed by",
                    "also waiting in",
                    "next"
                ],
                &rows
            )
        );
    }
    Ok(())
}

/// `cutover advance`: the gate, then the change (or the refusal and why).
async fn advance(
    db: &PgPool,
    redis: Option<&mut ConnectionManager>,
    routes: &Routes,
    args: &CutoverArgs,
    payload_limit: usize,
    as_json: bool,
) -> Result<()> {
    let route = find(routes, &args.route)?;
    let by = operator(args.by.as_deref());
    let req = Request {
        by: &by,
        reason: args.reason.as_deref(),
        force: args.force,
        percent: args.percent,
    };
    match operate::advance(db, redis, &route, &req, payload_limit).await {
        Ok(done) => {
            print_advanced(&route.name, &done, as_json);
            Ok(())
        }
        Err(Refusal::Gate(gate)) => {
            if as_json {
                output::json(&gate);
            } else {
                println!("{}: {} → {} refused:", route.name, gate.from, gate.to);
                println!("{}", gate.failures());
            }
            Err(Error::InvalidInput(format!(
                "gate {} → {} refused for route {:?} ({} of {} checks failed); wait and retry, or --force --reason",
                gate.from,
                gate.to,
                route.name,
                gate.checks.iter().filter(|c| !c.passed).count(),
                gate.checks.len()
            )))
        }
        Err(Refusal::Error(e)) => Err(e),
    }
}

fn print_advanced(name: &str, done: &Advanced, as_json: bool) {
    if as_json {
        output::json(&done);
    } else {
        println!(
            "{}: {} → {}{}",
            name,
            done.gate.from,
            done.gate.to,
            if done.forced {
                " (FORCED past a refusing gate; audited)"
            } else {
                " (gate passed)"
            }
        );
        for c in &done.gate.checks {
            println!(
                "  {} {}: {} (needs {})",
                if c.passed { "ok  " } else { "FAIL" },
                c.name,
                c.value,
                c.needs
            );
        }
        if done.counted_backlog > 0 {
            println!(
                "  counted {} copies of items without an id that Redis already held (mirror copies now)",
                done.counted_backlog
            );
        }
        if let Some(a) = &done.archived {
            println!(
                "  archived {} items into Postgres ({} already there), {} dead items into jobs_dead; deleted {} Redis keys",
                a.enqueued, a.duplicates, a.dead, a.keys_deleted
            );
            let p = &a.parked;
            if p.mirrored + p.known > 0 {
                println!(
                    "  gap list: {} parked items stored as mirror copies (Redis had them; they do not run here), {} already known",
                    p.mirrored, p.known
                );
            }
            if p.unaccounted > 0 {
                println!(
                    "  UNACCOUNTED {} parked items: in no Redis list and no sign Redis ran them; not run, bytes kept in job_keys.original (see qbridge diff)",
                    p.unaccounted
                );
            }
            let c = &a.carried;
            if c.scheduled + c.retrying + c.dead > 0 {
                println!(
                    "  carried from the framework's other structures: {} scheduled and {} retrying jobs enqueued due at their times, {} dead into jobs_dead",
                    c.scheduled, c.retrying, c.dead
                );
            }
            for left in &c.left {
                println!(
                    "  LEFT IN REDIS (qbridge does not carry these; see docs/src/runbook/frameworks.md): {left}"
                );
            }
            if !a.consumers_acknowledged.is_empty() {
                println!(
                    "  Redis consumers stopped and idle: {}",
                    a.consumers_acknowledged.join(", ")
                );
            }
            if !a.consumers_gone.is_empty() {
                println!(
                    "  Redis consumers gone (no heartbeat; their processing lists archived): {}",
                    a.consumers_gone.join(", ")
                );
            }
            if a.interrupted > 0 {
                println!(
                    "  {} of their jobs had begun an attempt on Redis that no outcome finished: \
                     recorded as interrupted; when they run in Postgres the diff counts them \
                     as run on both sides (they may have done their work twice)",
                    a.interrupted
                );
            }
        }
    }
}
