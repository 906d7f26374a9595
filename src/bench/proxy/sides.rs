//! The bench's reference sides, measured in the same run as the mirroring
//! proxy: qbridge's proxy with the route in `redis_only` (the splice alone,
//! nothing mirrored) and twemproxy (Debian's `nutcracker`, installed by
//! `scripts/bench-deps.sh`) in front of the same Redis. Both only forward,
//! so they tell the cost of the extra hop from the cost of the mirror.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::ProxyConfig;
use crate::demo::servers::free_port;
use crate::error::{Error, Result};
use crate::mirror::Mirror;
use crate::proxy::{ProxyDeps, ProxyServer};
use crate::routes::Routes;

/// A proxy of qbridge's own, serving until the token is cancelled.
pub(super) struct Running {
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts qbridge's proxy for `routes` on a free local port.
    pub async fn qbridge(config: ProxyConfig, routes: Routes, mirror: Mirror) -> Result<Running> {
        let deps = ProxyDeps {
            config,
            routes,
            mirror,
        };
        let server = ProxyServer::bind("127.0.0.1:0", deps).await?;
        let addr = server.local_addr();
        let stop = CancellationToken::new();
        let task = tokio::spawn(server.run(stop.clone()));
        Ok(Running { addr, stop, task })
    }

    /// Stops it once what it read is answered.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// twemproxy in front of `upstream`, killed when dropped.
pub(super) struct Twemproxy {
    pub addr: SocketAddr,
    child: Child,
    dir: std::path::PathBuf,
}

impl Twemproxy {
    /// Starts `nutcracker` on a free port. Not installed is an error naming
    /// the script that installs it: a run without the reference side would
    /// print a table that looks complete.
    pub async fn start(upstream: SocketAddr) -> Result<Twemproxy> {
        let Some(bin) = which("nutcracker") else {
            return Err(Error::InvalidInput(
                "bench proxy: twemproxy (nutcracker) is not installed: run ./scripts/bench-deps.sh, \
                 or pass --without-twemproxy"
                    .into(),
            ));
        };
        let (listen, stats) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("qbridge-twem-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir)?;
        let conf = dir.join("nutcracker.yml");
        // One pool, one server, Redis protocol; the defaults otherwise (no
        // auto ejection, no timeouts beyond its own), as a plain splice.
        std::fs::write(
            &conf,
            format!(
                "bench:\n  listen: 127.0.0.1:{listen}\n  redis: true\n  hash: fnv1a_64\n  \
                 distribution: ketama\n  servers:\n    - {upstream}:1\n"
            ),
        )?;
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .arg("-s")
            .arg(stats.to_string())
            .arg("-o")
            .arg(dir.join("nutcracker.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let addr: SocketAddr = ([127, 0, 0, 1], listen).into();
        let twem = Twemproxy { addr, child, dir };
        let until = Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if Instant::now() > until {
                return Err(Error::InvalidInput(format!(
                    "nutcracker did not listen on {addr} within 5 s (its log: {})",
                    twem.dir.join("nutcracker.log").display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(twem)
    }
}

impl Drop for Twemproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A program on PATH, or in /usr/sbin (where Debian puts `nutcracker`,
/// off an ordinary user's PATH).
fn which(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin"])
        .map(|dir| std::path::Path::new(dir).join(name))
        .find(|p| p.is_file());
    found
}
