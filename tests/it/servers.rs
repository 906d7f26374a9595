//! Throwaway servers for tests that break them on purpose: a Postgres cluster
//! (initdb into a temporary directory, a free port) and a redis-server, never
//! the machine's shared ones. Both stop when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The directory of initdb and pg_ctl: pg_config's answer, else the newest
/// Debian-style /usr/lib/postgresql/<version>/bin.
fn pg_bindir() -> PathBuf {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return dir;
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .filter(|d| d.join("initdb").exists())
        .expect("initdb not found: install the PostgreSQL server packages")
}

/// initdb refuses to run as root: run the server tools as `postgres` then.
fn as_server_user(program: PathBuf) -> Command {
    // `id -u` rather than libc::geteuid: no unsafe, no extra dependency.
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// A private Postgres cluster on a free port.
pub struct ThrowawayPostgres {
    dir: tempfile::TempDir,
    pub port: u16,
}

impl ThrowawayPostgres {
    /// initdb + start; panics with the tool's output if either fails.
    pub fn start() -> ThrowawayPostgres {
        let dir = tempfile::Builder::new()
            .prefix("qbridge-pg-")
            .tempdir()
            .expect("temp dir");
        // The server user must own its data directory.
        let _ = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(dir.path())
            .status();
        let data = dir.path().join("data");
        let out = as_server_user(pg_bindir().join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .output()
            .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pg = ThrowawayPostgres {
            dir,
            port: free_port(),
        };
        pg.resume();
        pg
    }

    /// postgres://… of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn pg_ctl(&self, args: &[&str]) -> std::process::Output {
        as_server_user(pg_bindir().join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(args)
            .output()
            .expect("pg_ctl runs")
    }

    /// Stops at once, like a crash (`-m immediate`).
    pub fn kill(&self) {
        self.pg_ctl(&["stop", "-m", "immediate", "-w"]);
    }

    /// Starts (again) and waits until it accepts connections.
    pub fn resume(&self) {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log");
        let out = self.pg_ctl(&[
            "start",
            "-w",
            "-t",
            "30",
            "-o",
            &opts,
            "-l",
            &log.to_string_lossy(),
        ]);
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
}

impl Drop for ThrowawayPostgres {
    fn drop(&mut self) {
        self.pg_ctl(&["stop", "-m", "immediate"]);
    }
}

/// A private redis-server on a free port, without persistence.
pub struct ThrowawayRedis {
    child: Option<Child>,
    pub port: u16,
}

impl ThrowawayRedis {
    /// Starts redis-server and waits until it answers.
    pub fn start() -> ThrowawayRedis {
        let mut redis = ThrowawayRedis {
            child: None,
            port: free_port(),
        };
        redis.resume();
        redis
    }

    /// redis://… of the server.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL): everything in it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts (again) on the same port and waits until it answers.
    pub fn resume(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        self.child = Some(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
