//! A TCP relay to Postgres whose traffic the test can pause: a process
//! connected through it keeps its connections open but gets no answer, as
//! behind a stalled network path, until the relay resumes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The relay; dropping it stops accepting (open links end with their peers).
pub struct PausedLink {
    port: u16,
    paused: Arc<AtomicBool>,
    accept: tokio::task::JoinHandle<()>,
}

impl PausedLink {
    /// A relay on a free port to the shared Postgres (127.0.0.1:5432).
    pub async fn to_postgres() -> PausedLink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let paused = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&paused);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect("127.0.0.1:5432").await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(copy(cr, sw, Arc::clone(&flag)));
                tokio::spawn(copy(sr, cw, Arc::clone(&flag)));
            }
        });
        PausedLink {
            port,
            paused,
            accept,
        }
    }

    /// The URL of the test's database through the relay.
    pub fn url(&self, pool: &sqlx::PgPool) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.port,
            crate::support::db_name(pool)
        )
    }

    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }
}

impl Drop for PausedLink {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies one direction; while paused, bytes wait in the sockets' buffers.
async fn copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    paused: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while paused.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just before a pause are held too.
        while paused.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
