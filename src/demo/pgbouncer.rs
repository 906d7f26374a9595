//! A throwaway PgBouncer in transaction mode on a free port, in front of a
//! Postgres on 127.0.0.1 (trust auth, users `postgres` and `root`): the
//! pooler of the pooler tests and of `qbridge chaos --via-pgbouncer`. Its
//! server pool is small on purpose, so clients share server connections
//! the way they do behind a managed pooler. It stops (and its directory is
//! removed) when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::servers::free_port;

/// Server connections per database and user: fewer than qbridge's clients.
/// (`server_login_retry` is 1 s instead of PgBouncer's 15: after a Postgres
/// restart PgBouncer refuses every client for that long after one failed
/// login, which would stretch a one-second outage to fifteen; docs/src/operations/production.md says
/// so for production poolers too.)
pub const SERVER_POOL: u32 = 4;

/// A pgbouncer process and its files.
pub struct ThrowawayPgBouncer {
    child: Child,
    dir: tempfile::TempDir,
    pub port: u16,
}

/// Whether `pgbouncer` is on PATH.
pub fn have_pgbouncer() -> bool {
    Command::new("pgbouncer")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl ThrowawayPgBouncer {
    /// Starts pgbouncer in front of the Postgres on `upstream_port`; panics
    /// with the reason (tests).
    pub fn start(upstream_port: u16) -> ThrowawayPgBouncer {
        ThrowawayPgBouncer::try_start(upstream_port).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts pgbouncer in front of the Postgres on `upstream_port` and
    /// waits until it accepts connections.
    pub fn try_start(upstream_port: u16) -> Result<ThrowawayPgBouncer, String> {
        if !have_pgbouncer() {
            return Err("pgbouncer is not installed: run scripts/test-deps.sh \
                        (Debian: apt-get install -y pgbouncer)"
                .into());
        }
        let dir = tempfile::Builder::new()
            .prefix("qbridge-pgbouncer-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        let port = free_port();
        let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        let ini = format!(
            "[databases]\n* = host=127.0.0.1 port={upstream_port}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
             unix_socket_dir =\nauth_type = trust\nauth_file = {users}\n\
             pool_mode = transaction\ndefault_pool_size = {SERVER_POOL}\n\
             max_client_conn = 400\nserver_login_retry = 1\nlogfile = {log}\n",
            users = path("users.txt"),
            log = path("pgbouncer.log"),
        );
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).map_err(|e| format!("{name}: {e}"))
        };
        write("pgbouncer.ini", &ini)?;
        write("users.txt", "\"postgres\" \"\"\n\"root\" \"\"\n")?;
        // pgbouncer will not run as root: it drops to `nobody` (-u), which
        // must be able to write its log in the directory.
        let _ = Command::new("chmod")
            .args(["-R", "a+rwX"])
            .arg(dir.path())
            .status();
        let mut cmd = Command::new("pgbouncer");
        if is_root() {
            cmd.args(["-u", "nobody"]);
        }
        let child = cmd
            .arg(path("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start pgbouncer: {e}"))?;
        let mut bouncer = ThrowawayPgBouncer { child, dir, port };
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = bouncer.child.try_wait() {
                return Err(format!(
                    "pgbouncer exited ({status}): {}",
                    bouncer.log_tail()
                ));
            }
            if Instant::now() > until {
                return Err(format!(
                    "pgbouncer did not listen within 10s: {}",
                    bouncer.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(bouncer)
    }

    /// postgres://… of `database` through the pooler.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The last lines of pgbouncer's log, for a failure message.
    pub fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for ThrowawayPgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
