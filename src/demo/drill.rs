//! The migration drill: one route walked through every phase under load, the
//! way the runbook (`docs/src/runbook/`) says, with qbridge's own consumers, the RESP
//! proxy and the producer API, and a handler that keeps a ledger of live
//! and shadow calls per job key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::ProgressBar;
use serde::Serialize;
use sqlx::PgPool;

use crate::cutover::store;
use crate::demo::handler::Ledger;
use crate::error::{Error, Result};
use crate::model::Phase;
use crate::ops::gates;
use crate::ops::operate::{self, Refusal, Request};
use crate::ops::repair;
use crate::redis::producer::Producer;
use crate::routes::{Route, Routes};

pub(super) mod script;
pub use script::run;

/// How long one phase holds, and what the drill may print.
pub struct DrillOptions {
    pub step: Duration,
    pub as_json: bool,
}

/// Prints the time each phase took and the total (both drills' summaries).
pub(super) fn print_times(phases: &[PhaseTime], seconds: f64) {
    let phases: Vec<String> = phases
        .iter()
        .map(|p| format!("{} {:.1}s", p.phase, p.seconds))
        .collect();
    println!("time per phase: {}", phases.join(", "));
    println!("total: {seconds:.1}s");
}

/// Time spent in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseTime {
    pub phase: String,
    pub seconds: f64,
}

/// How long one advance waited for its gate, and what held it: what a team
/// plans its migration week by.
#[derive(Debug, Clone, Serialize)]
pub struct GateWait {
    /// `dual_write → shadow`, …
    pub gate: String,
    pub seconds: f64,
    pub forced: bool,
    /// The checks that refused at the first try (none: passed at once).
    pub held_by: Vec<String>,
}

/// What the drill did.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub produced: u64,
    pub produced_via_proxy: u64,
    pub produced_via_producer_api: u64,
    pub run_live: u64,
    pub live_calls: u64,
    pub shadow_calls: u64,
    pub duplicates: u64,
    pub lost: u64,
    /// Up to ten keys of each, to look them up when a run goes wrong.
    pub duplicate_keys: Vec<String>,
    pub lost_keys: Vec<String>,
    pub planted_caught: bool,
    pub planted_repaired: bool,
    pub forced_advances: u32,
    pub rollbacks: u32,
    pub phases: Vec<PhaseTime>,
    pub seconds: f64,
}

pub(super) struct Drill {
    db: PgPool,
    pub(super) route: Arc<Route>,
    routes: Routes,
    producer: Producer,
    redis: redis::aio::ConnectionManager,
    pub(super) ledger: Ledger,
    pub(super) bar: ProgressBar,
    as_json: bool,
    pub(super) via_proxy: Arc<AtomicU64>,
    via_api: Arc<AtomicU64>,
    pub(super) forced: u32,
    rollbacks: u32,
    phase_started: Instant,
    pub(super) phases: Vec<PhaseTime>,
    pub(super) gate_waits: Vec<GateWait>,
}

impl Drill {
    /// A line for people: stdout, or stderr when stdout carries the JSON.
    pub(super) fn say(&self, line: &str) {
        self.bar.suspend(|| match self.as_json {
            true => eprintln!("{line}"),
            false => println!("{line}"),
        });
    }

    pub(super) fn status(&self) {
        let (live, _, shadow, _) = self.ledger.totals();
        let produced =
            self.via_proxy.load(Ordering::Relaxed) + self.via_api.load(Ordering::Relaxed);
        self.bar.set_message(format!(
            "{} | produced {produced} | run live {live} | shadow calls {shadow}",
            self.routes.phase(&self.route)
        ));
    }

    /// A drill on `route`, its status line on a spinner (none with `as_json`).
    pub(super) fn new(
        db: PgPool,
        route: Arc<Route>,
        routes: Routes,
        producer: Producer,
        redis: redis::aio::ConnectionManager,
        ledger: Ledger,
        as_json: bool,
    ) -> Drill {
        let bar = crate::output::progress(0, as_json, "");
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Drill {
            db,
            route,
            routes,
            producer,
            redis,
            ledger,
            bar,
            as_json,
            via_proxy: Arc::new(AtomicU64::new(0)),
            via_api: Arc::new(AtomicU64::new(0)),
            forced: 0,
            rollbacks: 0,
            phase_started: Instant::now(),
            phases: Vec::new(),
            gate_waits: Vec::new(),
        }
    }

    /// Waits `d`, refreshing the status line.
    pub(super) async fn hold(&self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.status();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(super) fn close_phase(&mut self, phase: Phase) {
        self.phases.push(PhaseTime {
            phase: phase.to_string(),
            seconds: self.phase_started.elapsed().as_secs_f64(),
        });
        self.phase_started = Instant::now();
    }

    pub(super) async fn print_diff(&mut self) -> Result<()> {
        let state = store::current(&self.db, &self.route.name)
            .await?
            .ok_or_else(|| Error::CheckFailed("demo route not registered".into()))?;
        let since = gates::window_start(&self.route, &state);
        let (diff, _) =
            gates::diff_since(&self.db, &mut self.redis, &self.route, state.phase, since).await?;
        self.say(&format!("   diff: {}", diff.verdict));
        Ok(())
    }

    /// Advances once the gate passes, printing a refusal's numbers once;
    /// forces (audited, counted) if it has not passed within `patience`.
    pub(super) async fn advance(
        &mut self,
        percent: Option<u8>,
        patience: Duration,
    ) -> Result<Phase> {
        let from = self.routes.phase(&self.route);
        let started = Instant::now();
        let mut refused_once = false;
        let mut held_by = Vec::new();
        loop {
            let force = started.elapsed() > patience;
            let req = Request {
                by: "qbridge-demo",
                reason: Some(if force {
                    "demo: the gate did not pass in time"
                } else {
                    "demo: gate passed"
                }),
                force,
                percent,
            };
            let mut conn = self.redis.clone();
            match operate::advance(&self.db, Some(&mut conn), &self.route, &req, 1 << 20).await {
                Ok(done) => {
                    if done.forced {
                        self.forced += 1;
                    }
                    self.gate_waits.push(GateWait {
                        gate: format!("{} → {}", done.gate.from, done.gate.to),
                        seconds: started.elapsed().as_secs_f64(),
                        forced: done.forced,
                        held_by: std::mem::take(&mut held_by),
                    });
                    self.close_phase(from);
                    self.say(&format!(
                        "-> {} → {}{}",
                        done.gate.from,
                        done.gate.to,
                        if done.forced {
                            " (forced)"
                        } else {
                            " (gate passed)"
                        }
                    ));
                    if let Some(a) = done.archived {
                        self.say(&format!(
                            "   archived {} items left in Redis, deleted {} Redis keys",
                            a.enqueued, a.keys_deleted
                        ));
                    }
                    self.wait_for_view(done.state.phase).await;
                    return Ok(done.state.phase);
                }
                Err(Refusal::Gate(gate)) => {
                    if !refused_once {
                        refused_once = true;
                        held_by = gate
                            .checks
                            .iter()
                            .filter(|c| !c.passed)
                            .map(|c| c.name.clone())
                            .collect();
                        self.say(&format!(
                            "   gate {} → {} refuses for now:\n{}",
                            gate.from,
                            gate.to,
                            gate.failures()
                        ));
                    }
                    self.hold(Duration::from_millis(500)).await;
                }
                Err(Refusal::Error(e)) => return Err(e),
            }
        }
    }

    /// Steps the route back one phase, with a reason (no gate), and waits
    /// for this process to follow.
    pub(super) async fn rollback(&mut self, reason: &str) -> Result<()> {
        let from = self.routes.phase(&self.route);
        let req = Request {
            by: "qbridge-demo",
            reason: Some(reason),
            force: false,
            percent: None,
        };
        let state = operate::rollback(&self.db, Some(&mut self.redis), &self.route, &req).await?;
        self.close_phase(from);
        self.say(&format!("-> {from} → {} (rollback: {reason})", state.phase));
        self.wait_for_view(state.phase).await;
        Ok(())
    }

    /// Changes the share flipped to Postgres in `postgres_only`.
    pub(super) async fn ramp(&mut self, percent: u8) -> Result<()> {
        let req = Request {
            by: "qbridge-demo",
            reason: Some("demo: the flipped share ran clean"),
            force: false,
            percent: Some(percent),
        };
        operate::ramp(&self.db, Some(&mut self.redis), &self.route, percent, &req).await?;
        self.say(&format!("-> flipped share {percent}%"));
        // Processes follow the flag within a poll.
        self.hold(Duration::from_secs(1)).await;
        Ok(())
    }

    /// Until this process's producers see `phase` (they poll the flag).
    pub(super) async fn wait_for_view(&self, phase: Phase) {
        let until = Instant::now() + Duration::from_secs(5);
        while self.routes.phase(&self.route) != phase && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A job Redis loses (as after a restart without persistence): mirrored
    /// in Postgres, its Redis push never made. Returns (caught, repaired).
    async fn plant_and_repair(&mut self) -> Result<(bool, bool)> {
        let key = "lost-1";
        let mut tx = self.db.begin().await?;
        let pending = self
            .producer
            .enqueue_in(
                &mut tx,
                &self.route.name,
                vec![Bytes::from(format!(r#"{{"id":"{key}"}}"#))],
            )
            .await?;
        tx.commit().await?;
        drop(pending);
        sqlx::query("DELETE FROM qbridge.redis_outbox WHERE queue = $1 AND key = $2")
            .bind(&self.route.queue)
            .bind(key)
            .execute(&self.db)
            .await?;
        self.say("   planted: a job Redis lost (mirrored in Postgres, never in Redis)");
        self.hold(self.route.config.cutover.diff.settle + Duration::from_millis(300))
            .await;
        let state = operate::state_of(&self.db, &self.route, "qbridge-demo").await?;
        let since = gates::window_start(&self.route, &state);
        let (diff, held) =
            gates::diff_since(&self.db, &mut self.redis, &self.route, state.phase, since).await?;
        let caught = diff.sample_only_postgres.iter().any(|k| k == key);
        self.say(&format!("   diff: {}", diff.verdict));
        let report = repair::repair(
            &self.db,
            &mut self.redis,
            &self.route,
            state.phase,
            since,
            &held,
            1 << 20,
        )
        .await?;
        // Nothing shows Redis lost it (no restart, flush or failover): the
        // repair pushes nothing back on its own, and says why.
        self.say(&format!(
            "   qbridge diff --repair: pushed back {}; {} unaccounted ({})",
            report.repushed,
            report.unaccounted,
            report.unaccounted_reason.as_deref().unwrap_or("none")
        ));
        // The operator knows: the drill deleted its Redis push.
        let assume = repair::Assumption {
            keys: vec![key.to_string()],
            by: "qbridge-demo".into(),
            reason: "the drill planted this loss".into(),
            ..repair::Assumption::default()
        };
        let input = repair::RepairInput {
            route: &self.route,
            phase: state.phase,
            since,
            held: &held,
            payload_limit: 1 << 20,
            assume: Some(&assume),
        };
        let report = repair::repair_with(&self.db, &mut self.redis, input).await?;
        self.say(&format!(
            "   qbridge diff --repair --assume-lost {key} --reason '…': pushed {} lost job(s) back to Redis (audited)",
            report.repushed
        ));
        let until = Instant::now() + Duration::from_secs(10);
        while self.ledger.live(key) == 0 && Instant::now() < until {
            self.hold(Duration::from_millis(100)).await;
        }
        Ok((caught, self.ledger.live(key) == 1))
    }
}
