//! The scenario's stage: a throwaway Postgres and redis-server of its own
//! (faults restart and kill them, so never the machine's shared ones), the
//! schema, one route, and qbridge itself as separate processes — a RESP
//! proxy and two workers running both consumers — so a fault can SIGKILL a
//! worker the way an OOM killer or a node loss would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::fault::Fault;
use super::items::Items;
use crate::demo::pgbouncer::ThrowawayPgBouncer;
use crate::demo::servers::{free_port, ThrowawayPostgres, ThrowawayRedis};
use crate::error::{Error, Result};
use crate::model::Phase;

/// The route every scenario drives.
pub const ROUTE: &str = "orders";
/// Its Redis list.
pub const LIST: &str = "chaos:orders";
/// Lease of the Postgres pool: short, so a killed worker's jobs come back
/// within seconds.
pub const LEASE: Duration = Duration::from_secs(2);

/// Servers, processes and the connection the harness itself uses.
pub struct Rig {
    pub pg: ThrowawayPostgres,
    pub redis: ThrowawayRedis,
    /// The harness's own pool; `application_name = qbridge-chaos`, so faults
    /// that cut connections can spare it.
    pub db: PgPool,
    pub bin: PathBuf,
    pub dir: tempfile::TempDir,
    pub proxy_port: u16,
    /// The ports of the proxies [`Rig::add_process`] started.
    pub more_proxies: Vec<u16>,
    pub handler_url: String,
    pub workers: Vec<Process>,
    pub proxy: Option<Process>,
    /// When the restarted Redis came back (the redis-restart fault): every
    /// mirror copy from before went to the server that lost its data.
    pub redis_back_at: Option<chrono::DateTime<chrono::Utc>>,
    /// What the producers push, and so the route's format.
    pub items: Items,
    /// A transaction-mode PgBouncer the qbridge processes go through
    /// (`--via-pgbouncer`); the harness and the faults reach Postgres
    /// directly.
    pub pgbouncer: Option<ThrowawayPgBouncer>,
    /// What the operator's steps (advance, rollback, ramp, diff, repair)
    /// connect with: through the PgBouncer when there is one, declared as a
    /// pooler, as an operator's `qbridge advance` there would; else [`Rig::db`].
    pub operator: PgPool,
    /// The faults caused so far, named: the oracle accepts a Redis job run
    /// twice only across one of them.
    pub faults: Vec<Fault>,
    /// When [`Rig::supervise`] last looked: a process found exited since
    /// died within this window.
    last_supervised: chrono::DateTime<chrono::Utc>,
}

/// One qbridge child process.
pub struct Process {
    pub name: String,
    pub args: Vec<String>,
    pub http_port: u16,
    pub child: Option<Child>,
}

impl Process {
    fn spawn(&mut self, bin: &Path, dir: &Path, database_url: &str) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.log", self.name)))?;
        let child = Command::new(bin)
            .args(&self.args)
            .env("QBRIDGE_DATABASE_URL", database_url)
            // QBRIDGE_CHAOS_LOG raises the processes' log level to diagnose a
            // failed seed (their logs go to the dump directory).
            .env(
                "RUST_LOG",
                // Leader passes are logged at debug: the record the
                // many-processes scenario reads (`super::leaders`).
                std::env::var("QBRIDGE_CHAOS_LOG")
                    .unwrap_or_else(|_| "warn,qbridge::queue::leader=debug".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| Error::Config(format!("cannot start {}: {e}", bin.display())))?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL: no shutdown, no flush — whatever it held in memory is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait: the graceful stop at the end of a scenario.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            let until = Instant::now() + Duration::from_secs(15);
            while Instant::now() < until {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process's /metrics text, or empty when it does not answer.
    pub async fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.http_port);
        match reqwest::get(url).await {
            Ok(resp) => resp.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}

impl Rig {
    /// Starts the servers, migrates, serves the ledger handler, and starts
    /// the proxy and two workers with the route in `phase`.
    /// `setup` runs first, as the superuser (database settings the
    /// processes must start with).
    /// With `via_pgbouncer` the processes reach Postgres through a
    /// transaction-mode PgBouncer, declared in their config, without a
    /// direct URL (so they poll: no LISTEN).
    pub async fn start(bin: &Path, phase: Phase, setup: &str, via_pgbouncer: bool) -> Result<Rig> {
        Rig::start_with(bin, phase, setup, Items::Ids, via_pgbouncer).await
    }

    /// [`Rig::start`] for producers pushing `items` (the route's format
    /// follows).
    pub async fn start_with(
        bin: &Path,
        phase: Phase,
        setup: &str,
        items: Items,
        via_pgbouncer: bool,
    ) -> Result<Rig> {
        let mut rig = Rig::prepare(setup, items, bin).await?;
        if via_pgbouncer {
            let bouncer = ThrowawayPgBouncer::try_start(rig.pg.port).map_err(Error::Config)?;
            rig.operator = crate::db::connect_via(
                &harness_url(&bouncer.url("postgres")),
                crate::db::Pooler::PgbouncerTransaction,
                4,
            )
            .await?;
            rig.pgbouncer = Some(bouncer);
        }
        rig.launch(phase).await?;
        Ok(rig)
    }

    /// Servers, schema and the ledger handler; no qbridge process yet.
    async fn prepare(setup: &str, items: Items, bin: &Path) -> Result<Rig> {
        let pg = ThrowawayPostgres::try_start().map_err(Error::Config)?;
        let redis = ThrowawayRedis::try_start().map_err(Error::Config)?;
        let db = crate::db::connect(&harness_url(&pg.url()), 24).await?;
        crate::db::migrate(&db).await?;
        sqlx::raw_sql(LEDGER_SQL).execute(&db).await?;
        if !setup.is_empty() {
            sqlx::raw_sql(setup).execute(&db).await?;
        }
        let handler_url = super::handler::serve(db.clone()).await?;
        let dir = tempfile::Builder::new()
            .prefix("qbridge-chaos-")
            .tempdir()?;
        Ok(Rig {
            pg,
            redis,
            db: db.clone(),
            bin: bin.to_path_buf(),
            dir,
            proxy_port: free_port(),
            more_proxies: Vec::new(),
            handler_url,
            workers: Vec::new(),
            proxy: None,
            redis_back_at: None,
            items,
            pgbouncer: None,
            operator: db.clone(),
            faults: Vec::new(),
            last_supervised: chrono::Utc::now(),
        })
    }

    /// Writes the configs and starts the proxy and two workers.
    async fn launch(&mut self, phase: Phase) -> Result<()> {
        for name in ["w1", "w2"] {
            let worker = self.process(name, "run", phase, self.proxy_port)?;
            self.workers.push(worker);
        }
        self.proxy = Some(self.process("proxy", "proxy", phase, self.proxy_port)?);
        self.spawn_all()?;
        self.wait_for_proxy().await
    }

    /// A qbridge process (`command`: `run` or `proxy`) with its config
    /// written and its own HTTP port; not started.
    fn process(&self, name: &str, command: &str, phase: Phase, proxy_port: u16) -> Result<Process> {
        let config = self.write_config(name, phase, proxy_port)?;
        let http_port = free_port();
        Ok(Process {
            name: name.to_string(),
            args: vec![
                command.into(),
                "-c".into(),
                config.to_string_lossy().into_owned(),
                format!("--http-listen=127.0.0.1:{http_port}"),
            ],
            http_port,
            child: None,
        })
    }

    /// postgres://… of the throwaway cluster itself.
    pub fn database_url(&self) -> String {
        self.pg.url()
    }

    /// postgres://… for qbridge's own processes: through the PgBouncer when
    /// there is one.
    pub fn process_url(&self) -> String {
        match &self.pgbouncer {
            Some(b) => b.url("postgres"),
            None => self.pg.url(),
        }
    }

    /// Starts one more qbridge process, `qbridge run` or (`proxy`) a RESP
    /// proxy on a port of its own, which is returned; it joins
    /// [`Rig::workers`] (killed, restarted and stopped like them).
    pub async fn add_process(&mut self, name: &str, phase: Phase, proxy: bool) -> Result<u16> {
        let port = free_port();
        let command = if proxy { "proxy" } else { "run" };
        let mut process = self.process(name, command, phase, port)?;
        process.spawn(&self.bin, self.dir.path(), &self.process_url())?;
        self.workers.push(process);
        if proxy {
            wait_for_port(port, &|| self.log_tail(name)).await?;
            self.more_proxies.push(port);
        }
        Ok(port)
    }

    /// Every proxy's port: the rig's own first.
    pub fn proxy_ports(&self) -> Vec<u16> {
        std::iter::once(self.proxy_port)
            .chain(self.more_proxies.iter().copied())
            .collect()
    }

    /// The processes' shared state folder (one host: a killed worker's
    /// outcome spool is replayed by its restart, a sibling, or repair).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn write_config(&self, name: &str, phase: Phase, proxy_port: u16) -> Result<PathBuf> {
        let state_dir = self.state_dir();
        let text = format!(
            r#"# written by the fault suite for process {name}
worker_id = "{name}"
state_dir = {state_dir:?}
max_connections = 6
shutdown_deadline = "5s"
reaper_interval = "500ms"
redis_url = "{redis}"
[history]
retention_days = 1
{database}[proxy]
listen = "127.0.0.1:{proxy_port}"
[[routes]]
name = "{ROUTE}"
redis_key = "{LIST}"
queue = "{ROUTE}"
format = "{format}"
phase = "{phase}"
handler = {{ type = "http", url = "{url}", timeout = "5s" }}
pool = {{ poll_interval = "250ms", concurrency = 8, lease = "{lease}s" }}
redis_consumer = {{ concurrency = 4, consumer_name = "{name}", retry_delay = "200ms", max_attempts = 25 }}
diff = {{ settle = "1s" }}
gates = {{ window = "2s", min_jobs = 1 }}
"#,
            redis = self.redis.url(),
            database = match self.pgbouncer {
                Some(_) => "[database]\npooler = \"pgbouncer-transaction\"\n",
                None => "",
            },
            phase = phase.as_str(),
            format = self.items.format(),
            url = self.handler_url,
            lease = LEASE.as_secs(),
        );
        let path = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text)?;
        Ok(path)
    }

    fn spawn_all(&mut self) -> Result<()> {
        let url = self.process_url();
        let dir = self.dir.path().to_path_buf();
        for p in self.workers.iter_mut().chain(self.proxy.iter_mut()) {
            p.spawn(&self.bin, &dir, &url)?;
        }
        Ok(())
    }

    /// What a supervisor (systemd, Kubernetes) does for a qbridge process
    /// that exited on its own (a worker started while Postgres was down
    /// exits with its error): starts it again. Returns one line per restart,
    /// with the exit status and the last log lines, for the walk's report.
    pub fn supervise(&mut self) -> Vec<String> {
        let url = self.process_url();
        let dir = self.dir.path().to_path_buf();
        let mut said = Vec::new();
        let mut exited_names = Vec::new();
        for p in self.workers.iter_mut().chain(self.proxy.iter_mut()) {
            let exited = match p.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => status,
                _ => continue,
            };
            p.child = None;
            let tail = std::fs::read_to_string(dir.join(format!("{}.log", p.name)))
                .unwrap_or_default()
                .lines()
                .last()
                .unwrap_or("")
                .chars()
                .take(200)
                .collect::<String>();
            let again = match p.spawn(&self.bin, &dir, &url) {
                Ok(()) => "restarted, as a supervisor would".to_string(),
                Err(e) => format!("not restarted: {e}"),
            };
            said.push(format!(
                "{} exited on its own ({exited}; last log: {tail}); {again}",
                p.name
            ));
            exited_names.push(p.name.clone());
        }
        // When it exited is not known: any time since the last look.
        let since = std::mem::replace(&mut self.last_supervised, chrono::Utc::now());
        for name in exited_names {
            self.faulted(format!("{name} exited on its own"), since);
        }
        said
    }

    /// SIGKILLs proxy `i` (the rig's own first, then those
    /// [`Rig::add_process`] started, in [`Rig::proxy_ports`] order) and
    /// starts it again, waiting until it accepts connections; its name.
    pub async fn kill_proxy(&mut self, i: usize) -> Result<String> {
        let port = self.proxy_ports()[i];
        let process = match i {
            0 => self.proxy.as_mut(),
            i => self
                .workers
                .iter_mut()
                .filter(|p| p.args.first().is_some_and(|c| c == "proxy"))
                .nth(i - 1),
        };
        let Some(process) = process else {
            return Err(Error::Config(format!("no proxy {i}")));
        };
        process.kill();
        let name = process.name.clone();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let url = self.process_url();
        let dir = self.dir.path().to_path_buf();
        let process = match i {
            0 => self.proxy.as_mut(),
            _ => self.workers.iter_mut().find(|p| p.name == name),
        };
        if let Some(process) = process {
            process.spawn(&self.bin, &dir, &url)?;
        }
        wait_for_port(port, &|| self.log_tail(&name)).await?;
        Ok(name)
    }

    /// Records a fault that began at `from` and ends now.
    pub fn faulted(&mut self, what: impl Into<String>, from: chrono::DateTime<chrono::Utc>) {
        self.faults.push(Fault {
            what: what.into(),
            from,
            until: chrono::Utc::now(),
        });
    }

    /// Starts worker `i` again after a kill.
    pub fn restart_worker(&mut self, i: usize) -> Result<()> {
        let url = self.process_url();
        let dir = self.dir.path().to_path_buf();
        self.workers[i].spawn(&self.bin, &dir, &url)
    }

    async fn wait_for_proxy(&self) -> Result<()> {
        wait_for_port(self.proxy_port, &|| self.log_tail("proxy")).await
    }

    /// The last lines a process logged (for a failure message).
    pub fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
            .unwrap_or_default();
        let colours = regex::Regex::new("\x1b\\[[0-9;]*m").expect("a valid regex");
        let text = colours.replace_all(&text, "");
        let lines: Vec<&str> = text.lines().rev().take(2).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// Stops every process gracefully.
    pub fn stop(&mut self) {
        for w in &mut self.workers {
            w.stop();
        }
        if let Some(p) = &mut self.proxy {
            p.stop();
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for w in &mut self.workers {
            w.kill();
        }
        if let Some(p) = &mut self.proxy {
            p.kill();
        }
    }
}

/// Waits until a proxy accepts connections on `port` (30 s at most; the
/// error carries `log_tail()`).
async fn wait_for_port(port: u16, log_tail: &dyn Fn() -> String) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if Instant::now() > until {
            return Err(Error::Config(format!(
                "the proxy did not start within 30 s; its log: {}",
                log_tail()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The harness's URL: the same database, marked so faults spare it.
pub fn harness_url(url: &str) -> String {
    format!("{url}?application_name=qbridge-chaos")
}

/// The handler's ledger and the harness's record of acknowledged enqueues.
const LEDGER_SQL: &str = r#"
CREATE SCHEMA chaos;
CREATE TABLE chaos.ledger (
    key         text        NOT NULL,
    job_id      bigint      NOT NULL,   -- 0 on the Redis side
    attempt     integer     NOT NULL,
    lease       bigint      NOT NULL,   -- 0 on the Redis side
    worker      text,                   -- locked_by of the row at call time
    lease_until timestamptz,            -- the lease's expiry at call time
    mode        text        NOT NULL,   -- live | shadow
    ok          boolean     NOT NULL,   -- what the handler answered
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON chaos.ledger (key);
CREATE TABLE chaos.acked (key text PRIMARY KEY, via text NOT NULL);
-- Content-hash routes: one row per acknowledged push of identical bytes
-- (`sha256:<hex>`, the key without its occurrence number).
CREATE TABLE chaos.pushes (hash text NOT NULL, via text NOT NULL);
CREATE TABLE chaos.aborted (key text PRIMARY KEY);
"#;
