//! `qbridge demo --framework sidekiq|celery|rq`: the migration drill with a
//! real framework fleet on the Redis side instead of qbridge's consumer.
//!
//! The framework's own client pushes jobs through qbridge's proxy — ready
//! ones and ones scheduled for later (Sidekiq's `perform_in`, Celery's
//! countdown, RQ's `enqueue_in`) — and the framework's own worker runs them
//! from Redis, moving the scheduled ones when they are due, and reports
//! each outcome to qbridge (`POST /v1/outcomes`). The route walks every
//! phase to `decommissioned` through its gates; jobs scheduled in one phase
//! come due in a later one. Every job, whichever side runs it, tells the
//! demo's ledger (`super::handler`), which is how the summary knows that
//! each produced job ran live exactly once: 0 lost, 0 run twice, or the
//! command fails.
//!
//! The applications are embedded in the binary (`fleet/sidekiq_fleet.rb`,
//! and the examples' `examples/fleets/celery_app.py` and `rq_app.py`)
//! and written to a temporary directory; the interpreter and the framework
//! come from the machine ([`Framework::check`] names what to install).

mod adapters;
mod framework;
mod keys;
mod realistic;
mod ruby;
mod summary;

pub use framework::Framework;
pub use keys::FleetKeys;
pub use summary::{report, FleetSummary};

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::drill::script::{proxy_url, wait_for_port};
use super::drill::Drill;
use super::handler::{self, Ledger};
use super::servers::free_port;
use crate::app::Runtime;
use crate::config::{Config, Overrides};
use crate::demo::attach::AttachedRoute;
use crate::error::{Error, Result};
use crate::model::Phase;
use crate::redis::connect::connect_redis;
use framework::FleetEnv;

/// How the fleet drill runs.
pub struct FleetOptions {
    pub framework: Framework,
    /// The Python for Celery and RQ.
    pub python: String,
    /// `--ruby-lib`: Ruby library directories for Sidekiq (`ruby::Ruby`).
    pub ruby_lib: Option<String>,
    /// The fleet's key options (`--key-prefix`, `--priority-steps`).
    pub keys: FleetKeys,
    pub step: Duration,
    pub as_json: bool,
    /// Default gate settings and a paced producer (`--realistic`).
    pub realistic: bool,
}

/// What the framework's producers pushed: job keys, and how many of them
/// were scheduled for later.
#[derive(Clone, Default)]
struct Produced(Arc<Mutex<(BTreeSet<String>, u64)>>);

/// The fleet: its worker process, and how to run its producer.
struct Fleet {
    framework: Framework,
    env: FleetEnv,
    worker: tokio::process::Child,
    produced: Produced,
    counter: Arc<std::sync::atomic::AtomicU64>,
}

impl Fleet {
    /// Runs the framework's producer once (`produce N`, or `schedule N
    /// SECONDS` with `due_in`) and records the keys it printed.
    async fn push(&self, n: u32, due_in: Option<Duration>) -> Result<()> {
        push(
            self.framework,
            &self.env,
            &self.produced,
            &self.counter,
            n,
            due_in,
        )
        .await
    }

    /// Pushes ready jobs in the background, a batch per producer run,
    /// until the returned token is cancelled: the traffic of a live queue,
    /// so each gate's window (one step) has jobs to measure. A batch is the
    /// gates' `min_jobs` (20): the producer's interpreter start sets the
    /// pace (Celery's import took 2 s on a busy 2-core machine, and 8 jobs
    /// a run left the shadow gate 8 to 16 jobs a window, forcing it).
    fn traffic(&self, realistic: bool) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let stop = CancellationToken::new();
        if realistic {
            let task = realistic::paced(
                (self.framework, self.env.clone()),
                self.produced.clone(),
                Arc::clone(&self.counter),
                stop.clone(),
            );
            return (stop, task);
        }
        let (fw, env, produced, counter) = (
            self.framework,
            self.env.clone(),
            self.produced.clone(),
            Arc::clone(&self.counter),
        );
        let token = stop.clone();
        let task = tokio::spawn(async move {
            while !token.is_cancelled() {
                if let Err(e) = push(fw, &env, &produced, &counter, 20, None).await {
                    tracing::warn!(error = %e, "demo: the producer failed; trying again");
                }
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        });
        (stop, task)
    }

    /// SIGTERM (the framework's warm shutdown), then a kill after 10 s.
    async fn stop(mut self) {
        if let Some(pid) = self.worker.id() {
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        if tokio::time::timeout(Duration::from_secs(10), self.worker.wait())
            .await
            .is_err()
        {
            let _ = self.worker.kill().await;
        }
    }
}

/// One run of the framework's producer; see [`Fleet::push`].
async fn push(
    fw: Framework,
    env: &FleetEnv,
    produced: &Produced,
    counter: &std::sync::atomic::AtomicU64,
    n: u32,
    due_in: Option<Duration>,
) -> Result<()> {
    let mut args = vec![
        if due_in.is_some() {
            "schedule"
        } else {
            "produce"
        }
        .to_string(),
        n.to_string(),
    ];
    args.extend(due_in.map(|d| format!("{:.1}", d.as_secs_f64())));
    let run = fw.producer(env, &args).output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .map_err(|_| Error::CheckFailed("the producer did not finish within 60 s".into()))?
        .map_err(|e| Error::Environment(format!("cannot run the producer: {e}")))?;
    // Keys it printed were pushed, even if it failed after them.
    let keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    counter.fetch_add(keys.len() as u64, Ordering::Relaxed);
    {
        let mut p = produced.0.lock().unwrap_or_else(|e| e.into_inner());
        if due_in.is_some() {
            p.1 += keys.len() as u64;
        }
        p.0.extend(keys);
    }
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        let last = why.lines().last().unwrap_or("").to_string();
        return Err(Error::CheckFailed(format!(
            "the {} producer failed: {last}",
            fw.name()
        )));
    }
    Ok(())
}

/// Runs the drill against `database_url` and `redis_url` (both fresh for
/// the demo).
pub async fn run(database_url: &str, redis_url: &str, opts: &FleetOptions) -> Result<FleetSummary> {
    let fw = opts.framework;
    let ruby = ruby::Ruby::from_option(opts.ruby_lib.as_deref())?;
    let version = fw.check(&opts.python, &ruby).await?;
    let started = Instant::now();
    let dir = tempfile::tempdir()
        .map_err(|e| Error::Environment(format!("cannot make a temporary directory: {e}")))?;
    fw.write_app(dir.path())?;
    let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let name = format!("demo_{id}");
    let ledger = Ledger::default();
    let ledger_url = handler::serve(ledger.clone()).await?;
    let (proxy_port, http_port, runner_port) = (free_port(), free_port(), free_port());
    let adapters = adapters::write(dir.path())?;
    let runner_url = format!("http://127.0.0.1:{runner_port}/");
    let toml = fleet_config(
        (fw, &opts.keys),
        &name,
        &runner_url,
        (proxy_port, http_port),
        realistic::route_tuning(opts.realistic, opts.step),
    )?;
    let config = with_servers(toml, database_url, redis_url)?;
    let db = crate::db::connect(database_url, 6).await?;
    crate::db::migrate(&db).await?;
    let AttachedRoute {
        routes,
        route,
        producer,
        watch,
    } = AttachedRoute::attach(&db, &config, &name, redis_url, "qbridge-demo").await?;
    let redis = connect_redis(redis_url).await?;
    let proxy = proxy_url(redis_url, proxy_port)?;
    let rt = Runtime::build(config).await?;
    let runtime_stop = CancellationToken::new();
    let runtime = tokio::spawn(rt.run_until_stopped(runtime_stop.clone()));

    let mut drill = Drill::new(
        db.clone(),
        route,
        routes,
        producer,
        redis,
        ledger.clone(),
        opts.as_json,
    );
    let outcomes = format!("http://127.0.0.1:{http_port}/v1/outcomes");
    let env = FleetEnv {
        dir: dir.path().to_path_buf(),
        python: python_path(&opts.python),
        proxy_url: proxy,
        queue: name.clone(),
        route_queue: name.clone(),
        ledger_url: ledger_url.clone(),
        outcomes_url: outcomes,
        route: name.clone(),
        adapters,
        runner_port,
        ruby,
        keys: opts.keys.clone(),
    };
    let driven = drive(&mut drill, fw, env, (proxy_port, http_port), opts).await;
    drill.bar.finish_and_clear();
    runtime_stop.cancel();
    let _ = runtime.await;
    watch.stop().await;
    let shadow_calls: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.outcomes WHERE queue = $1 AND side = 'postgres' AND mode = 'shadow'",
    )
    .bind(&name)
    .fetch_one(&db)
    .await?;
    db.close().await;
    let (produced, scheduled) = driven?;
    Ok(summary::tally(
        (fw, version),
        drill,
        &ledger,
        (&produced, scheduled),
        shadow_calls as u64,
        started,
    ))
}

/// Once the runtime's proxy and HTTP listener answer: starts the fleet's
/// worker, walks the phases, stops the worker; returns the produced keys
/// and how many were scheduled.
async fn drive(
    drill: &mut Drill,
    fw: Framework,
    env: FleetEnv,
    (proxy_port, http_port): (u16, u16),
    opts: &FleetOptions,
) -> Result<(BTreeSet<String>, u64)> {
    wait_for_port(proxy_port).await?;
    wait_for_port(http_port).await?;
    let runner = start_process(fw.runner(&env), &env, "runner", fw).await?;
    wait_for_port(env.runner_port).await?;
    let worker = start_process(fw.worker(&env), &env, "worker", fw).await?;
    let fleet = Fleet {
        framework: fw,
        env,
        worker,
        produced: Produced::default(),
        counter: Arc::clone(&drill.via_proxy),
    };
    let walked = walk(drill, &fleet, opts).await;
    let produced = {
        let p = fleet.produced.0.lock().unwrap_or_else(|e| e.into_inner());
        (p.0.clone(), p.1)
    };
    fleet.stop().await;
    drop(runner); // killed on drop
    walked.map(|()| produced)
}

/// The Python as the fleet's processes (which run in the temporary
/// directory) can find it: a relative path made absolute, a bare name left
/// to PATH.
fn python_path(python: &str) -> String {
    let path = std::path::Path::new(python);
    if path.components().count() > 1 && path.is_relative() {
        if let Ok(absolute) = std::path::absolute(path) {
            return absolute.to_string_lossy().into_owned();
        }
    }
    python.to_string()
}

/// Starts the framework's worker or runner (`what`; its output in
/// `<what>.log` beside the application) and fails with its last line if it
/// exits at once.
async fn start_process(
    mut cmd: tokio::process::Command,
    env: &FleetEnv,
    what: &str,
    fw: Framework,
) -> Result<tokio::process::Child> {
    let log_path = env.dir.join(format!("{what}.log"));
    let log = std::fs::File::create(&log_path)
        .map_err(|e| Error::Environment(format!("cannot write the {what}'s log: {e}")))?;
    let err = log
        .try_clone()
        .map_err(|e| Error::Environment(format!("cannot write the {what}'s log: {e}")))?;
    let mut worker =
        cmd.stdout(log).stderr(err).spawn().map_err(|e| {
            Error::Environment(format!("cannot start the {} {what}: {e}", fw.name()))
        })?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Ok(Some(status)) = worker.try_wait() {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(Error::Environment(format!(
            "the {} {what} exited at start ({status}): {last}",
            fw.name()
        )));
    }
    Ok(worker)
}

/// Every phase in turn under the framework's traffic, with jobs scheduled
/// in each phase coming due in later ones; then every produced job must
/// have run.
async fn walk(drill: &mut Drill, fleet: &Fleet, opts: &FleetOptions) -> Result<()> {
    let step = opts.step;
    let patience = realistic::patience(opts.realistic, step);
    let fw = fleet.framework.name();
    drill.say(&format!(
        "route {}: {fw}'s queue {} → Postgres queue {}; {fw}'s own client pushes through the proxy, {fw}'s own worker runs the Redis side and reports outcomes (POST /v1/outcomes)",
        drill.route.name, fleet.env.queue, drill.route.queue
    ));
    let (traffic, traffic_task) = fleet.traffic(opts.realistic);
    let walked = async {
        drill.say(&format!("== redis_only: {fw} alone"));
        drill.hold(step).await;
        drill.advance(None, patience).await?;
        drill.say(&format!(
            "== dual_write: every push also lands in Postgres, scheduled ones too (due when {fw} would run them)"
        ));
        fleet.push(5, Some(step * 4)).await?;
        drill.hold(step).await;
        drill.print_diff().await?;
        drill.advance(None, patience).await?;
        drill.say("== shadow: Postgres calls the handler in shadow mode and compares with the outcomes the fleet reports");
        fleet.push(5, Some(step * 3)).await?;
        drill.hold(step).await;
        drill.print_diff().await?;
        drill.advance(Some(50), patience).await?;
        drill.say(&format!(
            "== postgres_only at 50%: half the job keys run in Postgres through the runner ({fw}'s own task code), the rest still on {fw}"
        ));
        drill.hold(step).await;
        drill.rollback("demo: practising the way back").await?;
        drill.say("== shadow again: the flipped jobs already in Postgres still run there once");
        drill.hold(step).await;
        drill.advance(Some(50), patience).await?;
        drill.hold(step).await;
        drill.ramp(100).await?;
        drill.say(&format!(
            "== postgres_only: new jobs run in Postgres; {fw} drains what it holds, and its jobs scheduled before the flip run once due"
        ));
        fleet.push(5, Some(step)).await?;
        drill.hold(step).await;
        drill.print_diff().await
    }
    .await;
    traffic.cancel();
    // A producer run in flight finishes first: its jobs count as produced.
    let _ = traffic_task.await;
    walked?;
    // The gate waits for the scheduled jobs to come due and be run.
    drill.advance(None, patience + step * 6).await?;
    drill.say("== decommissioned: the route's Redis keys are gone; Postgres only");
    let produced = fleet
        .produced
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .0
        .clone();
    let until = Instant::now() + Duration::from_secs(60);
    while produced.iter().any(|key| drill.ledger.live(key) == 0) && Instant::now() < until {
        drill.hold(Duration::from_millis(200)).await;
    }
    // A second run would come late: give it a moment to show.
    drill.hold(Duration::from_secs(1)).await;
    drill.close_phase(Phase::Decommissioned);
    Ok(())
}

/// The drill's config: one route for the framework's queue, the proxy, the
/// HTTP listener (the fleet reports outcomes to it), the demo's handler,
/// and gates sized so each can pass within a few steps.
fn fleet_config(
    (fw, keys): (Framework, &FleetKeys),
    name: &str,
    handler_url: &str,
    (proxy_port, http_port): (u16, u16),
    tuning: String,
) -> Result<String> {
    let (_, format) = fw.route_key(name);
    let redis_key = keys.redis_key(fw, name);
    let key_lines = keys.route_lines();
    Ok(format!(
        r#"max_connections = 12
shutdown_deadline = "5s"
[proxy]
enabled = true
listen = "127.0.0.1:{proxy_port}"
[http]
listen = "127.0.0.1:{http_port}"
[[routes]]
name = "{name}"
redis_key = "{redis_key}"
queue = "{name}"
format = "{format}"
{key_lines}phase = "redis_only"
redis_side = "fleet"
handler = {{ type = "http", url = "{handler_url}" }}
pool = {{ poll_interval = "100ms", concurrency = 8 }}
{tuning}"#
    ))
}

/// `toml` loaded against the chosen servers.
fn with_servers(toml: String, database_url: &str, redis_url: &str) -> Result<Config> {
    let overrides = Overrides {
        database_url: Some(database_url.to_string()),
        redis_url: Some(redis_url.to_string()),
        ..Overrides::default()
    };
    Config::from_toml(&toml, &overrides)
}
