//! Throwaway servers: a Postgres cluster (initdb into a temporary directory,
//! a free port) and a redis-server, started from the binaries on PATH (or
//! Debian's /usr/lib/postgresql/<version>/bin). `qbridge demo` runs on them
//! when nothing answers on the default ports; tests that break servers on
//! purpose use them instead of the machine's shared ones. Both stop (and the
//! directory is removed) when dropped.

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
fn pg_bindir() -> Result<PathBuf, String> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return Ok(dir);
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
        .ok_or_else(|| {
            format!(
                "initdb not found: install the PostgreSQL server ({})",
                install_hint()
            )
        })
}

/// Whether redis-server is on PATH.
pub fn have_redis_server() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the PostgreSQL server tools can be found.
pub fn have_postgres_server() -> bool {
    pg_bindir().is_ok()
}

/// The command that installs both servers on this OS.
pub fn install_hint() -> String {
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let like = |name: &str| {
        os.lines()
            .any(|l| (l.starts_with("ID=") || l.starts_with("ID_LIKE=")) && l.contains(name))
    };
    if like("debian") || like("ubuntu") {
        "sudo apt-get install -y postgresql redis-server".into()
    } else if like("fedora") || like("rhel") || like("centos") {
        "sudo dnf install -y postgresql-server redis".into()
    } else if like("arch") {
        "sudo pacman -S postgresql redis".into()
    } else if like("alpine") {
        "sudo apk add postgresql redis".into()
    } else if cfg!(target_os = "macos") {
        "brew install postgresql@15 redis".into()
    } else {
        "install PostgreSQL (initdb, pg_ctl) and redis-server with your OS packages".into()
    }
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
    bindir: PathBuf,
    pub port: u16,
}

impl ThrowawayPostgres {
    /// initdb + start; panics with the tool's output if either fails (tests).
    pub fn start() -> ThrowawayPostgres {
        ThrowawayPostgres::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// initdb + start.
    pub fn try_start() -> Result<ThrowawayPostgres, String> {
        let bindir = pg_bindir()?;
        let dir = tempfile::Builder::new()
            .prefix("qbridge-pg-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        // The server user must own its data directory.
        let _ = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(dir.path())
            .status();
        let data = dir.path().join("data");
        let out = as_server_user(bindir.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .output()
            .map_err(|e| format!("initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let pg = ThrowawayPostgres {
            dir,
            bindir,
            port: free_port(),
        };
        pg.try_resume()?;
        Ok(pg)
    }

    /// postgres://… of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn pg_ctl(&self, args: &[&str]) -> std::process::Output {
        as_server_user(self.bindir.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(args)
            .output()
            .unwrap_or_else(|e| std::process::Output {
                status: std::process::ExitStatus::default(),
                stdout: Vec::new(),
                stderr: format!("pg_ctl: {e}").into_bytes(),
            })
    }

    /// Stops at once, like a crash (`-m immediate`).
    pub fn kill(&self) {
        self.pg_ctl(&["stop", "-m", "immediate", "-w"]);
    }

    /// Starts (again) and waits until it accepts connections; panics (tests).
    pub fn resume(&self) {
        self.try_resume().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts (again) and waits until it accepts connections.
    pub fn try_resume(&self) -> Result<(), String> {
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
        if !out.status.success() {
            return Err(format!(
                "pg_ctl start failed: {}{}{}",
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim(),
                std::fs::read_to_string(&log).unwrap_or_default().trim()
            ));
        }
        Ok(())
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
    /// Starts redis-server and waits until it answers; panics (tests).
    pub fn start() -> ThrowawayRedis {
        ThrowawayRedis::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts redis-server and waits until it answers.
    pub fn try_start() -> Result<ThrowawayRedis, String> {
        let mut redis = ThrowawayRedis {
            child: None,
            port: free_port(),
        };
        redis.try_resume()?;
        Ok(redis)
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

    /// Starts (again) on the same port and waits until it answers; panics (tests).
    pub fn resume(&mut self) {
        self.try_resume().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts (again) on the same port and waits until it answers.
    pub fn try_resume(&mut self) -> Result<(), String> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e} ({})", install_hint()))?;
        self.child = Some(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                return Err("redis-server did not start within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
