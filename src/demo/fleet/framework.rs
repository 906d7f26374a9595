//! What `qbridge demo --framework` needs to know of each framework: its
//! application (a script embedded in the binary and written out for the
//! drill), how its producer and worker start, the route that mirrors its
//! queue, and how to tell the user what to install.

use std::path::Path;
use std::process::Stdio;

use serde::Serialize;
use tokio::process::Command;

use crate::error::{Error, Result};

/// A framework whose own fleet the drill runs on the Redis side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    /// Sidekiq 6 (Ruby; Debian's `ruby-sidekiq`).
    Sidekiq,
    /// Celery 5 with kombu's Redis transport (Python).
    Celery,
    /// RQ (Python).
    Rq,
}

/// Where the fleet's processes find what they need (their environment).
#[derive(Debug, Clone)]
pub(super) struct FleetEnv {
    pub dir: std::path::PathBuf,
    pub python: String,
    pub proxy_url: String,
    /// The framework's queue name.
    pub queue: String,
    /// The route's Postgres queue (outcomes are reported under it).
    pub route_queue: String,
    pub ledger_url: String,
    pub outcomes_url: String,
    /// The route's name (the fleet's reporter records undeliverable
    /// outcomes in its ran set).
    pub route: String,
    /// The fleet adapters, written out.
    pub adapters: super::adapters::Written,
    /// Where the Postgres side's runner listens.
    pub runner_port: u16,
    /// The fleet's key options.
    pub keys: super::FleetKeys,
}

impl Framework {
    pub(super) fn name(self) -> &'static str {
        match self {
            Framework::Sidekiq => "sidekiq",
            Framework::Celery => "celery",
            Framework::Rq => "rq",
        }
    }

    /// The application's file name and source. Celery's and RQ's are the
    /// examples' applications (`examples/fleets/`), which the tests drive
    /// too: one application per framework.
    fn script(self) -> (&'static str, &'static str) {
        match self {
            Framework::Sidekiq => ("sidekiq_fleet.rb", include_str!("sidekiq_fleet.rb")),
            Framework::Celery => (
                "celery_app.py",
                include_str!("../../../examples/fleets/celery_app.py"),
            ),
            Framework::Rq => (
                "rq_app.py",
                include_str!("../../../examples/fleets/rq_app.py"),
            ),
        }
    }

    /// The route's Redis key and format for the framework's queue `queue`.
    pub(super) fn route_key(self, queue: &str) -> (String, &'static str) {
        match self {
            Framework::Sidekiq => (format!("queue:{queue}"), "sidekiq"),
            Framework::Celery => (queue.to_string(), "celery"),
            Framework::Rq => (format!("rq:queue:{queue}"), "rq"),
        }
    }

    /// Fails with what to install when the framework's client cannot be
    /// loaded here.
    pub(super) async fn check(self, python: &str) -> Result<()> {
        let (program, args, hint): (&str, Vec<&str>, String) = match self {
            Framework::Sidekiq => (
                "ruby",
                vec!["-e", "require 'sidekiq'; exit(Sidekiq::VERSION.start_with?('6') ? 0 : 3)"],
                "Ruby with Sidekiq 6: apt-get install ruby-sidekiq".into(),
            ),
            Framework::Celery => (
                python,
                vec!["-c", "import celery, redis"],
                format!("{python} with Celery 5 and redis-py: {python} -m pip install celery redis (or --python PATH)"),
            ),
            Framework::Rq => (
                python,
                vec!["-c", "import rq, redis"],
                format!("{python} with RQ: {python} -m pip install rq (or --python PATH)"),
            ),
        };
        let ok = Command::new(program)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(Error::Environment(format!(
                "qbridge demo --framework {} needs {hint}",
                self.name()
            )));
        }
        Ok(())
    }

    /// Writes the application into `dir`.
    pub(super) fn write_app(self, dir: &Path) -> Result<()> {
        let (file, source) = self.script();
        std::fs::write(dir.join(file), source)
            .map_err(|e| Error::Environment(format!("cannot write the demo's {file}: {e}")))
    }

    /// The producer: `args` are `produce N` or `schedule N SECONDS`; it
    /// prints one job key per line.
    pub(super) fn producer(self, env: &FleetEnv, args: &[String]) -> Command {
        let (file, _) = self.script();
        let mut cmd = match self {
            Framework::Sidekiq => Command::new("ruby"),
            Framework::Celery | Framework::Rq => Command::new(&env.python),
        };
        cmd.arg(file).args(args);
        self.environment(&mut cmd, env);
        cmd
    }

    /// The Postgres side's handler: the framework's runner from the fleet
    /// adapters, calling the same task code.
    pub(super) fn runner(self, env: &FleetEnv) -> Command {
        let (file, _) = self.script();
        let listen = format!("127.0.0.1:{}", env.runner_port);
        let mut cmd = match self {
            Framework::Sidekiq => {
                let mut cmd = Command::new("ruby");
                cmd.arg(&env.adapters.sidekiq_runner).args([
                    "-r",
                    &format!("./{file}"),
                    "--listen",
                    &listen,
                ]);
                cmd
            }
            Framework::Celery => {
                let mut cmd = Command::new(&env.python);
                cmd.args(["-m", "qbridge_adapters.runner", "celery"]).args([
                    "--app",
                    "celery_app:app",
                    "--listen",
                    &listen,
                ]);
                cmd
            }
            Framework::Rq => {
                let mut cmd = Command::new(&env.python);
                cmd.args(["-m", "qbridge_adapters.runner", "rq"])
                    .args(["--import", "rq_app", "--redis-url", &env.proxy_url])
                    .args(["--listen", &listen]);
                cmd
            }
        };
        self.environment(&mut cmd, env);
        cmd.env("QBD_SIDE", "postgres")
            .env("LEDGER_SIDE", "postgres");
        cmd
    }

    /// The fleet's worker, four jobs at a time, moving due scheduled jobs,
    /// reporting outcomes through the fleet adapter.
    pub(super) fn worker(self, env: &FleetEnv) -> Command {
        let (file, _) = self.script();
        let mut cmd = match self {
            Framework::Sidekiq => {
                let mut cmd = Command::new("sidekiq");
                cmd.args(["-r", &format!("./{file}"), "-q", &env.queue, "-c", "4"]);
                cmd
            }
            Framework::Celery => {
                let mut cmd = Command::new(&env.python);
                cmd.args([
                    "-m",
                    "celery",
                    "-A",
                    "celery_app",
                    "worker",
                    "-P",
                    "threads",
                ])
                .args(["-c", "4", "-Q", &env.queue, "-l", "WARNING"])
                .args([
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ]);
                cmd
            }
            Framework::Rq => {
                let mut cmd = Command::new(&env.python);
                cmd.args([file, "worker"]);
                cmd
            }
        };
        self.environment(&mut cmd, env);
        cmd.env("QBD_SIDE", "redis")
            .env("LEDGER_SIDE", "redis")
            .env("QBRIDGE_OUTCOMES", &env.outcomes_url)
            .env("QBRIDGE_ROUTE", &env.route)
            .env("QBRIDGE_QUEUE", &env.route_queue);
        cmd
    }

    /// The application's environment: `QBD_*` for the Sidekiq fleet, the
    /// Python applications' own names (`examples/fleets/*.py`) for Celery
    /// and RQ.
    fn environment(self, cmd: &mut Command, env: &FleetEnv) {
        cmd.current_dir(&env.dir)
            .env("REDIS_URL", &env.proxy_url)
            .env("QUEUE_NAME", &env.queue)
            .env("LEDGER_URL", &env.ledger_url)
            .env("QBD_REDIS_URL", &env.proxy_url)
            .env("QBD_QUEUE", &env.queue)
            .env("QBD_ROUTE_QUEUE", &env.route_queue)
            .env("QBD_LEDGER", &env.ledger_url)
            .env("QBD_ADAPTERS", &env.adapters.ruby_lib)
            .env("PYTHONPATH", python_path(&env.adapters.python))
            .kill_on_drop(true);
        env.keys.environment(self, cmd);
    }
}

/// `PYTHONPATH` with the adapters first.
fn python_path(adapters: &Path) -> std::ffi::OsString {
    let mut path = adapters.as_os_str().to_os_string();
    if let Some(rest) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(rest);
    }
    path
}
