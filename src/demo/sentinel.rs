//! A throwaway Redis behind Sentinel: a master, one replica and three
//! sentinels (quorum 2) on free ports, without persistence; for the
//! Sentinel tests. Everything stops when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::servers::{free_port, ThrowawayRedis};

/// The name the sentinels monitor the master under.
pub const MASTER: &str = "qbridge-master";

/// The servers and sentinels.
pub struct ThrowawaySentinels {
    pub master: ThrowawayRedis,
    pub replica: ThrowawayRedis,
    sentinels: Vec<Child>,
    pub sentinel_ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

impl ThrowawaySentinels {
    /// Starts them and waits until every sentinel knows the replica (a
    /// failover needs one); panics with the reason (tests).
    pub fn start() -> ThrowawaySentinels {
        ThrowawaySentinels::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts them and waits until every sentinel knows the replica.
    pub fn try_start() -> Result<ThrowawaySentinels, String> {
        let have = Command::new("redis-sentinel")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !have {
            return Err("redis-sentinel is not installed: run scripts/test-deps.sh \
                        (Debian: apt-get install -y redis-sentinel)"
                .into());
        }
        let master = ThrowawayRedis::try_start()?;
        let port = master.port.to_string();
        let replica = ThrowawayRedis::try_start_with(&["--replicaof", "127.0.0.1", &port])?;
        let dir = tempfile::Builder::new()
            .prefix("qbridge-sentinel-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        let mut sentinels = Vec::new();
        let mut sentinel_ports = Vec::new();
        for i in 0..3 {
            let sport = free_port();
            let conf = dir.path().join(format!("sentinel-{i}.conf"));
            // Sentinel rewrites its file: it must be its own and writable.
            std::fs::write(
                &conf,
                format!(
                    "port {sport}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                     sentinel monitor {MASTER} 127.0.0.1 {mport} 2\n\
                     sentinel down-after-milliseconds {MASTER} 1000\n\
                     sentinel failover-timeout {MASTER} 5000\n",
                    dir = dir.path().display(),
                    mport = master.port,
                ),
            )
            .map_err(|e| format!("sentinel config: {e}"))?;
            let child = Command::new("redis-sentinel")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start redis-sentinel: {e}"))?;
            sentinels.push(child);
            sentinel_ports.push(sport);
        }
        let set = ThrowawaySentinels {
            master,
            replica,
            sentinels,
            sentinel_ports,
            _dir: dir,
        };
        set.wait_until_replica_known()?;
        Ok(set)
    }

    /// `redis+sentinel://…/<MASTER>` naming the three sentinels.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// One sentinel's answer to a command, as text (`redis-cli`).
    pub fn ask(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.sentinel_ports[0].to_string()])
            .args(args)
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The port the sentinels name as the master now.
    pub fn master_port(&self) -> Option<u16> {
        self.ask(&["SENTINEL", "get-master-addr-by-name", MASTER])
            .lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
    }

    fn wait_until_replica_known(&self) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(20);
        for port in &self.sentinel_ports {
            loop {
                let out = Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "SENTINEL", "replicas", MASTER])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                if out.contains(&self.replica.port.to_string()) {
                    break;
                }
                if Instant::now() > until {
                    return Err(format!(
                        "sentinel on {port} did not see the replica within 20s"
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }
}

impl Drop for ThrowawaySentinels {
    fn drop(&mut self) {
        for child in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
