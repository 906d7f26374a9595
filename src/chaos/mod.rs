//! The fault suite: qbridge's promise — no acknowledged job lost, none run
//! live twice except after a lease expiry — checked under faults.
//!
//! Each [`Scenario`] gets its own throwaway Postgres and redis-server (faults
//! crash and restart them), qbridge as real processes (a RESP proxy and two
//! workers running both consumers; see [`rig`]), producers through the proxy
//! and the producer API ([`load`]), and a handler whose side effect is a row
//! in a ledger table ([`handler`]). While the load runs the fault is
//! injected ([`faults`]); then the run waits until every acknowledged job is
//! done — the recovery time — and the [`oracle`] judges the ledger and
//! qbridge's tables.
//!
//! `qbridge chaos` runs it at full size and prints the table; the
//! integration tests run every scenario at a reduced size. The randomized
//! cutover oracle ([`cutover_random`]) uses the same rig and oracle for
//! random walks through the cutover, by seed.

pub mod cutover_random;
pub mod fault;
pub mod faults;
pub mod handler;
pub mod items;
pub mod leaders;
pub mod load;
pub mod oracle;
pub mod rig;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{Config, Overrides};
use crate::demo::attach::{AttachedRoute, PhaseWatch};
use crate::error::{Error, Result};
use crate::model::Phase;
use crate::redis::producer::Producer;
use oracle::Verdict;
use rig::{Rig, ROUTE};

/// The faults, in the order of the issue that asked for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    WorkerKill,
    TerminateBackends,
    PostgresRestart,
    RedisRestart,
    ProxyDisconnect,
    IdleInTransaction,
    NotifyQueueFull,
    PoolExhaustion,
    PhaseFlip,
    /// Three `qbridge run` and two proxies on one database: one run
    /// SIGKILLed, another restarted; exactly once, one leader at a time.
    ManyProcesses,
    /// The randomized cutover oracle: runs by seeds ([`cutover_random`]),
    /// not in the table of the nine faults.
    CutoverRandom,
}

impl Scenario {
    pub const ALL: [Scenario; 10] = [
        Scenario::WorkerKill,
        Scenario::TerminateBackends,
        Scenario::PostgresRestart,
        Scenario::RedisRestart,
        Scenario::ProxyDisconnect,
        Scenario::IdleInTransaction,
        Scenario::NotifyQueueFull,
        Scenario::PoolExhaustion,
        Scenario::PhaseFlip,
        Scenario::ManyProcesses,
    ];

    /// Its name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::WorkerKill => "worker-kill",
            Scenario::TerminateBackends => "terminate-backends",
            Scenario::PostgresRestart => "postgres-restart",
            Scenario::RedisRestart => "redis-restart",
            Scenario::ProxyDisconnect => "proxy-disconnect",
            Scenario::IdleInTransaction => "idle-in-transaction",
            Scenario::NotifyQueueFull => "notify-queue-full",
            Scenario::PoolExhaustion => "pool-exhaustion",
            Scenario::PhaseFlip => "phase-flip",
            Scenario::ManyProcesses => "many-processes",
            Scenario::CutoverRandom => "cutover-random",
        }
    }

    /// The phase the route starts in: where the fault hurts most. Live
    /// copies run in Postgres in `postgres_only`; Redis faults need Redis
    /// live (`dual_write`); the flip starts at the beginning.
    fn phase(self) -> Phase {
        match self {
            Scenario::RedisRestart | Scenario::PhaseFlip | Scenario::CutoverRandom => {
                Phase::DualWrite
            }
            _ => Phase::PostgresOnly,
        }
    }
}

/// How big a run is.
#[derive(Debug, Clone)]
pub struct Options {
    /// The qbridge binary the workers and the proxy run.
    pub bin: PathBuf,
    /// Jobs per second produced (half via the proxy, half via the API).
    pub rate: u32,
    /// How long the fault phase of a scenario lasts.
    pub span: Duration,
    /// How long recovery may take before the scenario fails.
    pub patience: Duration,
    /// Megabytes of notifications the NOTIFY scenario writes. Below 4,096
    /// (half of Postgres's 8 GB queue) the skip threshold is lowered to
    /// 0.02% so the fallback is still reached.
    pub notify_fill_mb: u64,
    /// The qbridge processes go through a transaction-mode PgBouncer.
    pub via_pgbouncer: bool,
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: Scenario,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// From the fault's end until every job acknowledged by then was done.
    pub recovery_seconds: Option<f64>,
    pub note: String,
}

impl Report {
    /// Whether the promise held.
    pub fn passed(&self) -> bool {
        self.verdict.violations.is_empty() && self.recovery_seconds.is_some()
    }
}

/// Runs one scenario end to end.
pub async fn run(scenario: Scenario, opts: &Options) -> Result<Report> {
    let setup = match (scenario, opts.notify_fill_mb < 4096) {
        (Scenario::NotifyQueueFull, true) => {
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET qbridge.notify_max_usage = 0.0002', current_database()); END $$"
        }
        _ => "",
    };
    let mut rig = Rig::start(&opts.bin, scenario.phase(), setup, opts.via_pgbouncer).await?;
    let harness = Harness::attach(&rig).await?;
    let route = Arc::clone(&harness.route);
    let mut proxy_ports = vec![rig.proxy_port];
    if scenario == Scenario::ManyProcesses {
        rig.add_process("w3", scenario.phase(), false).await?;
        proxy_ports.push(rig.add_process("proxy2", scenario.phase(), true).await?);
    }
    let load =
        load::Load::start_across(opts.rate, &proxy_ports, harness.producer.clone(), rig.items);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let span = opts.span;
    let fault_from = chrono::Utc::now();
    let note = match scenario {
        Scenario::WorkerKill => faults::kill_worker(&mut rig, span).await,
        Scenario::TerminateBackends => faults::terminate_backends(&mut rig, span).await,
        Scenario::PostgresRestart => faults::restart_postgres(&mut rig, span).await,
        Scenario::RedisRestart => faults::restart_redis(&mut rig, span).await,
        Scenario::ProxyDisconnect => faults::disconnect_clients(&mut rig, span).await,
        Scenario::IdleInTransaction => faults::idle_in_transaction(&mut rig, span).await,
        Scenario::NotifyQueueFull => {
            faults::notify_queue_full(&mut rig, span, opts.notify_fill_mb).await
        }
        Scenario::PoolExhaustion => faults::exhaust_connections(&mut rig, span).await,
        Scenario::PhaseFlip => faults::flip_phases(&mut rig, span, &route).await,
        Scenario::ManyProcesses => faults::kill_one_restart_another(&mut rig, span).await,
        Scenario::CutoverRandom => Err(Error::InvalidInput(
            "cutover-random runs by seeds (qbridge chaos --scenario cutover-random --seeds N)"
                .into(),
        )),
    };
    let mut note = match note {
        Ok(n) => n,
        Err(e) => format!("FAULT FAILED: {e}"),
    };
    let fault_end = Instant::now();
    // Flipping phases is no fault: a Redis job run twice there is a duplicate.
    if scenario != Scenario::PhaseFlip {
        rig.faulted(scenario.name(), fault_from);
    }
    oracle::record_acked(&rig.db, rig.items, &load.acked.take()).await?;
    if scenario == Scenario::RedisRestart {
        note.push_str("; ");
        note.push_str(&diff_and_repair(&rig).await?);
    }
    let recovered = oracle::wait_until_done(&rig.db, opts.patience)
        .await
        .map(|_| fault_end.elapsed());
    // A little more load after recovery, then everything must drain.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let acked = load.stop().await;
    oracle::record_acked(&rig.db, rig.items, &acked.take()).await?;
    let drained = oracle::wait_until_done(&rig.db, opts.patience).await;
    let mut verdict = oracle::judge(&rig.db, &rig.faults).await?;
    if scenario == Scenario::ManyProcesses {
        let (led, overlaps) = leaders::judge(&leaders::read(rig.dir.path()));
        note.push_str("; ");
        note.push_str(&led);
        verdict.violations.extend(overlaps);
    }
    if note.starts_with("FAULT FAILED") {
        verdict.violations.push(note.clone());
    }
    if recovered.is_none() || drained.is_none() {
        let tails: Vec<String> = ["w1", "w2", "proxy"]
            .iter()
            .map(|n| format!("{n}: {}", rig.log_tail(n)))
            .collect();
        verdict.violations.push(format!(
            "not recovered within {:.0} s ({})",
            opts.patience.as_secs_f64(),
            tails.join("; ")
        ));
    }
    rig.stop();
    harness.detach().await;
    Ok(Report {
        scenario,
        verdict,
        recovery_seconds: recovered.map(|d| d.as_secs_f64()),
        note,
    })
}

/// What the harness needs beside the rig: the route as the processes see
/// it (following the stored phase) and a producer on the rig's servers.
pub struct Harness {
    pub config: Config,
    pub route: Arc<crate::routes::Route>,
    pub producer: Producer,
    watch: PhaseWatch,
}

impl Harness {
    /// Reads w1's config (the processes' route) and follows its phase.
    pub async fn attach(rig: &Rig) -> Result<Harness> {
        let config = Config::load(
            Some(&rig.dir.path().join("w1.toml")),
            &Overrides {
                database_url: Some(rig::harness_url(&rig.database_url())),
                ..Overrides::default()
            },
        )?;
        let attached =
            AttachedRoute::attach(&rig.db, &config, ROUTE, &rig.redis.url(), "qbridge-chaos")
                .await?;
        Ok(Harness {
            config,
            route: attached.route,
            producer: attached.producer,
            watch: attached.watch,
        })
    }

    /// Stops following the phase.
    pub async fn detach(self) {
        self.watch.stop().await;
    }
}

/// The diff must see what Redis lost; `--repair` pushes back what it has
/// evidence for (the restart after the push, observed by the processes).
/// Jobs mirrored within a moment of the crash may have none; for those the
/// harness does what the runbook tells an operator who saw Redis crash:
/// `--assume-lost-before` the time Redis came back, with the reason. All of
/// it runs through the binary.
async fn diff_and_repair(rig: &Rig) -> Result<String> {
    // Newer jobs are not expected on the other side yet (settle = 1 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let back = rig.redis_back_at.map(|t| t.to_rfc3339());
    let run = |repair: bool, assume: bool| {
        let mut cmd = Command::new(&rig.bin);
        cmd.args(["-c"])
            .arg(rig.dir.path().join("w1.toml"))
            .args(["--json", "diff", "--route", ROUTE, "--since", "1h"])
            .env("QBRIDGE_DATABASE_URL", rig.process_url());
        if repair {
            cmd.arg("--repair");
        }
        if let (true, Some(back)) = (assume, &back) {
            cmd.args(["--assume-lost-before", back, "--by", "qbridge-chaos"])
                .args(["--reason", "Redis was killed without persistence (chaos)"]);
        }
        cmd.output()
    };
    let json = |out: std::process::Output| -> Result<serde_json::Value> {
        serde_json::from_slice(&out.stdout).map_err(|e| {
            Error::CheckFailed(format!(
                "qbridge diff did not answer JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        })
    };
    let number = |v: &serde_json::Value, at: &str| v.pointer(at).and_then(|n| n.as_u64());
    let before = json(run(false, false)?)?;
    let on_evidence = json(run(true, false)?)?;
    let unaccounted = number(&on_evidence, "/repair/unaccounted").unwrap_or(0);
    let assumed = if unaccounted > 0 {
        number(&json(run(true, true)?)?, "/repair/repushed").unwrap_or(0)
    } else {
        0
    };
    Ok(format!(
        "diff saw {} mirrored jobs unknown to Redis; --repair pushed back {} on evidence (Redis restarted after their push), {} unaccounted pushed back by --assume-lost-before the restart",
        number(&before, "/diff/only_postgres").unwrap_or(0),
        number(&on_evidence, "/repair/repushed").unwrap_or(0),
        assumed,
    ))
}

/// The table, one row per scenario.
pub fn table(reports: &[Report]) -> String {
    let mut out = String::from(
        "| scenario | jobs | lost | extra attempts (why) | stale results discarded | recovery | verdict | what happened |\n\
         |---|---:|---:|---|---:|---:|---|---|\n",
    );
    for r in reports {
        let extra = if r.verdict.extra.is_empty() {
            "0".to_string()
        } else {
            r.verdict
                .extra
                .iter()
                .map(|(why, n)| format!("{n} ({why})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let verdict = match r.passed() {
            true => "ok".to_string(),
            false => format!("FAILED: {}", r.verdict.violations.join("; ")),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scenario.name(),
            r.verdict.jobs,
            r.verdict.lost,
            extra,
            r.verdict.stale_discarded,
            r.recovery_seconds
                .map_or("-".into(), |s| format!("{s:.1} s")),
            verdict,
            r.note
        ));
    }
    out
}
