//! Throwaway servers: a Postgres cluster (initdb into a temporary directory,
//! a free port) and a redis-server, started from the binaries on PATH (or
//! Debian's /usr/lib/postgresql/<version>/bin). `qbridge demo` runs on them
//! when nothing answers on the default ports; tests that break servers on
//! purpose, or need settings the shared ones lack (TLS: [`ServerTls`]), use
//! them instead of the machine's shared ones. Both stop (and the directory is
//! removed) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use super::ports::free_port;

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

/// PEM files that make a throwaway server speak TLS: its certificate, its
/// key, and the CA that signed the certificate (Redis wants it named).
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// A private Postgres cluster on a free port.
pub struct ThrowawayPostgres {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    pub port: u16,
    /// `ssl = on` with these files (copied into the cluster's directory).
    tls: bool,
}

impl ThrowawayPostgres {
    /// initdb + start; panics with the tool's output if either fails (tests).
    pub fn start() -> ThrowawayPostgres {
        ThrowawayPostgres::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// initdb + start with `ssl = on` and the given certificate; plain
    /// connections are still accepted (the server decides nothing: the
    /// client's sslmode does). Panics if it fails (tests).
    pub fn start_tls(tls: &ServerTls) -> ThrowawayPostgres {
        ThrowawayPostgres::try_start_with(Some(tls)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// initdb + start.
    pub fn try_start() -> Result<ThrowawayPostgres, String> {
        ThrowawayPostgres::try_start_with(None)
    }

    /// initdb + start, with `ssl = on` when `tls` is given.
    pub fn try_start_with(tls: Option<&ServerTls>) -> Result<ThrowawayPostgres, String> {
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
        copy_cluster(&template(&bindir)?, &data)?;
        if let Some(tls) = tls {
            install_server_tls(tls, dir.path())?;
        }
        let pg = ThrowawayPostgres {
            dir,
            bindir,
            port: free_port(),
            tls: tls.is_some(),
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
        let mut opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        if self.tls {
            let dir = self.dir.path().display();
            opts.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={dir}/server.crt -c ssl_key_file={dir}/server.key"
            ));
        }
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

/// An initdb'd cluster to copy: initdb costs seconds, a copy of its ~40 MB
/// a fraction of one, and the fault suite and the randomized cutover oracle
/// start a cluster per scenario or seed. Made once per machine (per
/// PostgreSQL version and user), in the temporary directory; made anew if
/// it is missing or incomplete.
fn template(bindir: &Path) -> Result<PathBuf, String> {
    let version = bindir
        .parent()
        .and_then(|p| p.file_name())
        .map(|v| v.to_string_lossy().into_owned())
        .unwrap_or_default();
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let done = std::env::temp_dir().join(format!("qbridge-pg-template-{version}-{uid}"));
    if done.join("data").join("PG_VERSION").exists() {
        return Ok(done);
    }
    // initdb into a private directory, then rename it into place: two
    // processes racing both succeed, and one rename wins.
    let fresh = tempfile::Builder::new()
        .prefix("qbridge-pg-template-")
        .tempdir()
        .map_err(|e| format!("temporary directory: {e}"))?;
    let _ = Command::new("chown")
        .args(["-R", "postgres"])
        .arg(fresh.path())
        .status();
    let out = as_server_user(bindir.join("initdb"))
        .arg("-D")
        .arg(fresh.path().join("data"))
        .args(["-U", "postgres", "--auth=trust", "--no-sync"])
        .output()
        .map_err(|e| format!("initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let made = fresh.keep();
    if std::fs::rename(&made, &done).is_err() {
        let _ = std::fs::remove_dir_all(&made);
    }
    if done.join("data").join("PG_VERSION").exists() {
        Ok(done)
    } else {
        Err(format!("no cluster template at {}", done.display()))
    }
}

/// Copies the template's data directory to `data`, owner and modes kept.
fn copy_cluster(template: &Path, data: &Path) -> Result<(), String> {
    let out = Command::new("cp")
        .arg("-a")
        .arg(template.join("data"))
        .arg(data)
        .output()
        .map_err(|e| format!("cp: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "copying the cluster template failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Copies the certificate and key where the server user can read them:
/// Postgres refuses a key file others may read, and runs as `postgres`
/// when we are root.
fn install_server_tls(tls: &ServerTls, dir: &Path) -> Result<(), String> {
    let copy = |from: &Path, name: &str| {
        let to = dir.join(name);
        std::fs::copy(from, &to).map_err(|e| format!("copy {}: {e}", from.display()))?;
        Ok::<PathBuf, String>(to)
    };
    copy(&tls.cert, "server.crt")?;
    let key = copy(&tls.key, "server.key")?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("chmod {}: {e}", key.display()))?;
    }
    let _ = Command::new("chown")
        .args(["postgres"])
        .arg(dir.join("server.crt"))
        .arg(&key)
        .status();
    Ok(())
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
    /// Extra redis-server arguments (e.g. `--requirepass`), kept for resume.
    extra: Vec<String>,
    /// When set, `port` speaks only TLS (no plain port), and clients need
    /// no certificate of their own.
    tls: Option<ServerTls>,
}

impl ThrowawayRedis {
    /// Starts redis-server and waits until it answers; panics (tests).
    pub fn start() -> ThrowawayRedis {
        ThrowawayRedis::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts redis-server speaking only TLS with the given certificate;
    /// panics if it fails (tests).
    pub fn start_tls(tls: &ServerTls) -> ThrowawayRedis {
        ThrowawayRedis::launch(&[], Some(tls)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts redis-server and waits until it answers.
    pub fn try_start() -> Result<ThrowawayRedis, String> {
        ThrowawayRedis::try_start_with(&[])
    }

    /// Starts redis-server with extra arguments (`["--requirepass", "pw"]`)
    /// and waits until its port accepts connections; panics (tests).
    pub fn start_with(args: &[&str]) -> ThrowawayRedis {
        ThrowawayRedis::try_start_with(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts redis-server with extra arguments and waits until its port
    /// accepts connections.
    pub fn try_start_with(args: &[&str]) -> Result<ThrowawayRedis, String> {
        ThrowawayRedis::launch(args, None)
    }

    /// Starts redis-server with extra arguments, TLS only when `tls` is
    /// given, and waits until it accepts connections.
    fn launch(args: &[&str], tls: Option<&ServerTls>) -> Result<ThrowawayRedis, String> {
        let mut last = String::new();
        // Another process may take the free port before the server binds it
        // (parallel oracle campaigns start many servers at once): try again
        // on a new port.
        for _ in 0..5 {
            let mut redis = ThrowawayRedis {
                child: None,
                port: free_port(),
                extra: args.iter().map(|a| a.to_string()).collect(),
                tls: tls.cloned(),
            };
            match redis.try_resume() {
                Ok(()) => return Ok(redis),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// redis://… of the server (rediss://… with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
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
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            None => cmd.args(["--port", &port]),
            Some(tls) => cmd
                .args(["--port", "0", "--tls-port", &port])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .args(["--tls-auth-clients", "no"]),
        };
        let child = cmd
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e} ({})", install_hint()))?;
        self.child = Some(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                let why = match self.tls {
                    Some(_) => " (a redis-server built without TLS refuses --tls-port)",
                    None => "",
                };
                return Err(format!("redis-server exited at start-up: {status}{why}"));
            }
            if started.elapsed() > Duration::from_secs(10) {
                return Err("redis-server did not start within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Something answers on the port; it is ours only if our server is
        // still running a moment later. A redis-server that finds the port
        // taken exits at once, and the answer came from another process's
        // server (a parallel oracle walk once shared its Redis that way).
        std::thread::sleep(Duration::from_millis(200));
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            self.child = None;
            return Err(format!(
                "redis-server exited at start-up ({status}): port {} is taken by another process",
                self.port
            ));
        }
        Ok(())
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
