//! The steps of a random cutover walk: what can happen to a route while it
//! migrates, drawn from a seeded generator so a failing seed replays the
//! same walk. Each step acts through the same code an operator or a fault
//! would (`ops::operate`, `ops::repair`, killing real processes and
//! servers) and describes itself in one line.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::hand_back;
use crate::chaos::load::{self, Acked, Pause};
use crate::chaos::rig::{Rig, LIST};
use crate::chaos::Harness;
use crate::cutover::watch;
use crate::error::{Error, Result};
use crate::model::Phase;
use crate::ops::operate::{self, Refusal, Request};
use crate::ops::{gates, repair};

/// Who the walk acts as in the audit log.
pub const BY: &str = "qbridge-chaos-random";
const REASON: &str = "randomized cutover oracle";

/// One thing that happens to the route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// One phase forward (forced: the walk tests safety, not the gates);
    /// into `postgres_only` with this share of keys flipped.
    Advance { percent: u8 },
    /// One phase back (also below `dual_write`, where nothing is mirrored).
    Rollback,
    /// A new flipped share in `postgres_only`, higher or lower (a lower
    /// one writes the live-key guard first, as the runbook's fallback does).
    Ramp { percent: u8 },
    /// SIGKILL a worker (both consumers inside) and start it again.
    KillWorker { worker: usize },
    /// Kill Redis (no persistence) and start it again; then repair.
    RestartRedis,
    /// Crash Postgres (immediate stop) and start it again.
    RestartPostgres,
    /// Crash Postgres, let the consumers ack what finishes meanwhile (their
    /// outcomes only in memory and in their spool), SIGKILL a worker, bring
    /// Postgres back, maybe restart Redis without persistence (the ran set
    /// gone: only the spool says those jobs ran) and repair, then start the
    /// worker again.
    KillWorkerWhilePostgresAway { worker: usize, restart_redis: bool },
    /// Push an acknowledged job's item again (a client retry), through the
    /// proxy or the producer API.
    Repush { index: usize, via_proxy: bool },
    /// `qbridge diff --repair` on evidence alone.
    Repair,
    /// SIGKILL a proxy process (the rig's own, or the second) and start it
    /// again: what it routed and had not yet written is gone with it.
    KillProxy { proxy: usize },
    /// A client takes a job off the list through a proxy, the phase or
    /// share changes while it holds the job, and it pushes the job back on
    /// the same connection ([`super::hand_back`]).
    HandBack { pick: usize },
}

/// Draws the next step for a route in `phase` with `percent` flipped.
/// Decommission is not drawn: the walk ends with it.
pub fn draw(rng: &mut StdRng, phase: Phase, percent: u8) -> Step {
    loop {
        let step = match rng.random_range(0..110) {
            0..=14 => Step::Advance {
                percent: [10, 50, 100][rng.random_range(0..3)],
            },
            15..=22 => Step::Rollback,
            23..=30 => Step::Ramp {
                percent: rng.random_range(0..=100),
            },
            31..=42 => Step::KillWorker {
                worker: rng.random_range(0..2),
            },
            43..=49 => Step::RestartRedis,
            50..=55 => Step::RestartPostgres,
            56..=65 => Step::KillWorkerWhilePostgresAway {
                worker: rng.random_range(0..2),
                restart_redis: rng.random_bool(0.5),
            },
            66..=89 => Step::Repush {
                index: rng.random_range(0..usize::MAX / 2),
                via_proxy: rng.random_bool(0.5),
            },
            90..=99 => Step::Repair,
            100..=104 => Step::KillProxy {
                proxy: rng.random_range(0..2),
            },
            _ => Step::HandBack {
                pick: rng.random_range(0..usize::MAX / 2),
            },
        };
        let possible = match step {
            Step::Advance { .. } => phase < Phase::PostgresOnly,
            Step::Rollback => phase > Phase::RedisOnly,
            Step::Ramp { percent: to } => phase == Phase::PostgresOnly && to != percent,
            // In `redis_only` Redis alone holds what is pushed, and qbridge
            // promises nothing about a Redis that loses it; there is no
            // mirror to repair either.
            Step::RestartRedis | Step::Repair => phase != Phase::RedisOnly,
            Step::KillWorkerWhilePostgresAway { restart_redis, .. } => {
                !restart_redis || phase != Phase::RedisOnly
            }
            _ => true,
        };
        if possible {
            return step;
        }
    }
}

/// Takes `step`; its description, or why it could not be taken. The
/// producers' `acked` keys and their `pause` belong to the walk's load.
pub async fn take(
    step: Step,
    rig: &mut Rig,
    h: &Harness,
    acked: &Acked,
    pause: &Pause,
) -> Result<String> {
    let route = &h.route;
    match step {
        Step::Advance { .. } | Step::Rollback | Step::Ramp { .. } => {
            change_phase(step, rig, h, pause).await
        }
        Step::KillWorker { worker } => {
            let from = chrono::Utc::now();
            rig.workers[worker].kill();
            tokio::time::sleep(Duration::from_millis(200)).await;
            rig.faulted(format!("w{} SIGKILLed", worker + 1), from);
            rig.restart_worker(worker)?;
            Ok(format!("SIGKILL w{} and restart", worker + 1))
        }
        Step::RestartRedis => restart_redis(rig, h).await,
        Step::RestartPostgres => {
            let from = chrono::Utc::now();
            rig.pg.kill();
            tokio::time::sleep(Duration::from_millis(500)).await;
            let resumed = rig.pg.try_resume().map_err(Error::Config);
            rig.faulted("Postgres crashed", from);
            resumed?;
            Ok("Postgres crashed and restarted".into())
        }
        Step::KillWorkerWhilePostgresAway {
            worker,
            restart_redis: then_redis,
        } => {
            let from = chrono::Utc::now();
            rig.pg.kill();
            // Jobs that finish now are acked with their outcomes kept.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            rig.workers[worker].kill();
            let resumed = rig.pg.try_resume().map_err(Error::Config);
            rig.faulted(
                format!("Postgres crashed and w{} SIGKILLed meanwhile", worker + 1),
                from,
            );
            resumed?;
            let redis = match then_redis {
                true => format!("; {}", restart_redis(rig, h).await?),
                false => String::new(),
            };
            rig.restart_worker(worker)?;
            Ok(format!(
                "Postgres crashed, SIGKILL w{} meanwhile, Postgres back{redis}; w{} restarted",
                worker + 1,
                worker + 1
            ))
        }
        Step::Repush { index, via_proxy } => {
            let Some(key) = acked.pick(index) else {
                return Ok("re-push: nothing acknowledged yet".into());
            };
            let item = load::item(rig.items, &key);
            let (answer, ok) = match via_proxy {
                // Through any proxy: another than the one that took its
                // first push, as often as not.
                true => {
                    let ports = rig.proxy_ports();
                    repush_through_proxy(ports[(index >> 8) % ports.len()], &item).await
                }
                false => match h.producer.enqueue(&route.name, vec![item]).await {
                    Ok(_) => ("ok".to_string(), true),
                    Err(e) => (e.to_string(), false),
                },
            };
            let via = if via_proxy { "proxy" } else { "producer_api" };
            // Identical bytes pushed again are one more job on a
            // content-hash route, promised like any other.
            if ok && rig.items.repeats_are_new_jobs() {
                acked.add(key.clone(), via);
            }
            Ok(format!("re-push {key} via {via}: {answer}"))
        }
        Step::Repair => repair_once(rig, h, None).await,
        Step::KillProxy { proxy } => {
            let from = chrono::Utc::now();
            let killed = rig.kill_proxy(proxy).await;
            let name = killed.as_deref().unwrap_or("a proxy").to_string();
            rig.faulted(format!("{name} SIGKILLed"), from);
            Ok(format!("SIGKILL {} and restart", killed?))
        }
        Step::HandBack { pick } => take_and_hand_back(rig, h, pick, pause).await,
    }
}

/// A client takes a job through a proxy, the phase or share changes while
/// it holds it (`pick` chooses the proxy and the change), and it pushes the
/// job back on the same connection ([`hand_back::Taken`]).
async fn take_and_hand_back(rig: &Rig, h: &Harness, pick: usize, pause: &Pause) -> Result<String> {
    let taken = match hand_back::take(rig, pick).await? {
        Ok(taken) => taken,
        Err(why) => return Ok(format!("hand-back: {why}")),
    };
    let key = taken.key(&h.route.format);
    let port = taken.port;
    let state = operate::state_of(&rig.operator, &h.route, BY).await?;
    let change = match (state.phase, pick % 3) {
        (Phase::PostgresOnly, 0) => Step::Rollback,
        (Phase::PostgresOnly, n) => Step::Ramp {
            percent: match (state.percent, n) {
                (100, _) => 0,
                (0, _) | (_, 1) => 100,
                (p, _) => p / 2,
            },
        },
        (_, n) => Step::Advance {
            percent: [10, 50, 100][n],
        },
    };
    let changed = match change_phase(change, rig, h, pause).await {
        Ok(said) => said,
        Err(e) => format!("{change:?} failed: {e}"),
    };
    let back = taken.give_back().await;
    Ok(format!(
        "hand-back: took {key} via proxy :{port}; {changed}; pushed it back on the same connection: {back}"
    ))
}

/// An advance, a rollback or a new share (any other step is refused).
async fn change_phase(step: Step, rig: &Rig, h: &Harness, pause: &Pause) -> Result<String> {
    let route = &h.route;
    match step {
        Step::Advance { percent } => advance(rig, h, percent, pause).await,
        Step::Rollback => {
            let mut redis = crate::redis::connect::connect_redis(&rig.redis.url()).await?;
            let req = Request::new(BY, Some(REASON));
            let state = operate::rollback(&rig.operator, Some(&mut redis), route, &req).await?;
            Ok(format!("rollback → {}", state.phase))
        }
        Step::Ramp { percent } => {
            let req = Request::new(BY, Some(REASON));
            let mut redis = crate::redis::connect::connect_redis(&rig.redis.url()).await?;
            operate::ramp(&rig.operator, Some(&mut redis), route, percent, &req).await?;
            Ok(format!("ramp → {percent}%"))
        }
        other => Err(Error::InvalidInput(format!("{other:?} changes no phase"))),
    }
}

/// One phase forward, forced. Out of `redis_only` as the runbook says: the
/// advance counts the identical items Redis holds, and once every process
/// mirrors, `qbridge import` copies the backlog of ids. Identical items
/// pushed between the flip and the processes following it are neither
/// counted nor mirrored (an open path, `docs/src/internals/fault-suite.md`),
/// so on a content-hash route the producers wait meanwhile.
async fn advance(rig: &Rig, h: &Harness, percent: u8, pause: &Pause) -> Result<String> {
    let route = &h.route;
    let from = operate::state_of(&rig.operator, route, BY).await?.phase;
    let req = Request {
        by: BY,
        reason: Some(REASON),
        force: true,
        // A share is flipped only on the step into postgres_only.
        percent: (from == Phase::Shadow).then_some(percent),
    };
    let out_of_redis_only = from == Phase::RedisOnly;
    let paused = out_of_redis_only && rig.items.repeats_are_new_jobs();
    if paused {
        pause.hold().await;
    }
    let mut redis = crate::redis::connect::connect_redis(&rig.redis.url()).await?;
    let advanced = operate::advance(&rig.operator, Some(&mut redis), route, &req, 1 << 20).await;
    if out_of_redis_only {
        tokio::time::sleep(watch::FOLLOWED).await;
    }
    pause.release();
    let advanced = advanced.map_err(|r| match r {
        Refusal::Gate(_) => Error::CheckFailed("a forced advance was refused".into()),
        Refusal::Error(e) => e,
    })?;
    let state = advanced.state;
    let mut said = format!("advance → {} ({}%)", state.phase, state.percent);
    if out_of_redis_only {
        let imported = crate::ops::import::import(
            &rig.operator,
            &mut redis,
            route,
            state.phase,
            false,
            1 << 20,
            |_, _| {},
        )
        .await?;
        let new: usize = imported.structures.iter().map(|s| s.new).sum();
        said.push_str(&format!(
            "; counted {} identical copies waiting; imported {new}",
            advanced.counted_backlog
        ));
    }
    Ok(said)
}

/// Pushes `count` items through the proxy at once (one pipelined write):
/// the backlog a route has when it leaves `redis_only`.
pub async fn push_backlog(rig: &Rig, acked: &Acked, count: usize) -> String {
    let names: Vec<String> = (0..count as u64).map(|n| rig.items.name("b", n)).collect();
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", rig.proxy_port)).await else {
        return "backlog: proxy unreachable".into();
    };
    let mut pipeline = Vec::new();
    for name in &names {
        pipeline.extend(load::lpush(LIST, &load::item(rig.items, name)));
    }
    let sent = conn.write_all(&pipeline).await.is_ok();
    let mut pushed = 0;
    for name in names {
        let line = match sent {
            true => tokio::time::timeout(Duration::from_secs(10), load::reply_line(&mut conn))
                .await
                .ok()
                .flatten(),
            false => None,
        };
        match line {
            Some(line) if line.starts_with(b":") => {
                acked.add(name, "proxy");
                pushed += 1;
            }
            _ => acked.unsure(name),
        }
    }
    format!("backlog: {pushed} of {count} pushed in redis_only")
}

/// One LPUSH of `item` through the proxy; the reply line, and whether it
/// acknowledged the push (an integer reply).
async fn repush_through_proxy(port: u16, item: &[u8]) -> (String, bool) {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)).await else {
        return ("proxy unreachable".into(), false);
    };
    if conn.write_all(&load::lpush(LIST, item)).await.is_err() {
        return ("write failed".into(), false);
    }
    match tokio::time::timeout(Duration::from_secs(10), load::reply_line(&mut conn)).await {
        Ok(Some(line)) => (
            String::from_utf8_lossy(&line).trim().to_string(),
            line.starts_with(b":"),
        ),
        _ => ("no reply".into(), false),
    }
}

/// Kills Redis, starts it again, and repairs as the runbook says: on
/// evidence, then the operator's decision for what was mirrored before
/// Redis came back.
async fn restart_redis(rig: &mut Rig, h: &Harness) -> Result<String> {
    let from = chrono::Utc::now();
    rig.redis.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resumed = rig.redis.try_resume().map_err(Error::Config);
    rig.faulted("Redis killed without persistence", from);
    resumed?;
    let back = chrono::Utc::now();
    // Past the route's settle time (1 s), so the losses are counted.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let first = repair_once(rig, h, None).await?;
    let assume = repair::Assumption {
        before: Some(back),
        by: BY.into(),
        reason: "Redis was killed without persistence (randomized oracle)".into(),
        ..repair::Assumption::default()
    };
    let second = repair_once(rig, h, Some(&assume)).await?;
    Ok(format!(
        "Redis killed and restarted; {first}; assumed lost before the restart: {second}"
    ))
}

/// One diff and repair of the route; what it pushed back and left.
async fn repair_once(
    rig: &Rig,
    h: &Harness,
    assume: Option<&repair::Assumption>,
) -> Result<String> {
    let route = &h.route;
    // As `qbridge diff --repair` does: outcomes a killed worker synced to
    // its spool are on record before repair judges.
    crate::shadow::spool::bring_in(&rig.state_dir(), &rig.operator).await?;
    let mut redis = crate::redis::connect::connect_redis(&rig.redis.url()).await?;
    let state = operate::state_of(&rig.operator, route, BY).await?;
    let since = chrono::Utc::now() - chrono::Duration::hours(1);
    let (_, held) = gates::diff_since(&rig.operator, &mut redis, route, state.phase, since).await?;
    let input = repair::RepairInput {
        route,
        phase: state.phase,
        since,
        held: &held,
        payload_limit: 1 << 20,
        assume,
    };
    let r = repair::repair_with(&rig.operator, &mut redis, input).await?;
    // A copy the repair found lost but took as pushed back already is
    // shown: it is what hid seed 90000's loss.
    let already = match r.already_repushed {
        0 => String::new(),
        n => format!(" ({n} taken as pushed back already)"),
    };
    let not_judged = match (r.not_judged, r.read_while_moving) {
        (0, false) => String::new(),
        (n, false) => format!(", {n} not judged"),
        (n, true) => format!(", {n} not judged, read while copies moved"),
    };
    Ok(format!(
        "repair: {} mirrored, {} pushed back{already}, {} unaccounted{not_judged}, {} released",
        r.mirrored, r.repushed, r.unaccounted, r.released
    ))
}
