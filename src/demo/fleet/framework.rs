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
    /// Sidekiq 6 or 7 (Ruby; Debian's `ruby-sidekiq`, or `--ruby-lib`).
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
    /// The Sidekiq to run (`--ruby-lib`).
    pub ruby: super::ruby::Ruby,
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
            // The repository's one sample app per framework, as the examples run it.
            Framework::Sidekiq => (
                "sidekiq_app.rb",
                include_str!("../../../examples/fleets/sidekiq_app.rb"),
            ),
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

    /// The framework's version, or an error with what to install when its
    /// client cannot be loaded here (for Sidekiq: also a version the drill
    /// was not run on).
    pub(super) async fn check(self, python: &str, ruby: &super::ruby::Ruby) -> Result<String> {
        let (program, args, hint): (&str, Vec<&str>, String) = match self {
            Framework::Sidekiq => (
                "ruby",
                vec![
                    "-e",
                    "require 'sidekiq'; print Sidekiq::VERSION; exit(Sidekiq::VERSION.start_with?('6.', '7.') ? 0 : 3)",
                ],
                ruby.install_hint().into(),
            ),
            Framework::Celery => (
                python,
                vec!["-c", "import celery, redis, importlib.metadata as m; print(m.version('celery'), end='')"],
                format!("{python} with Celery 5 and redis-py: {python} -m pip install celery redis (or --python PATH)"),
            ),
            Framework::Rq => (
                python,
                vec!["-c", "import rq, redis, importlib.metadata as m; print(m.version('rq'), end='')"],
                format!("{python} with RQ: {python} -m pip install rq (or --python PATH)"),
            ),
        };
        let out = Command::new(program)
            .args(&args)
            .env("RUBYLIB", ruby.rubylib(None))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .await;
        match out {
            Ok(out) if out.status.success() => {
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            }
            _ => Err(Error::Environment(format!(
                "qbridge demo --framework {} needs {hint}",
                self.name()
            ))),
        }
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
                let mut cmd = env.ruby.sidekiq_server();
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
            // The Sidekiq app's names for its Redis and queue.
            .env("REDIS_URL", &env.proxy_url)
            .env("SIDEKIQ_QUEUE", &env.queue)
            .env("RUBYLIB", env.ruby.rubylib(Some(&env.adapters.ruby_lib)))
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
