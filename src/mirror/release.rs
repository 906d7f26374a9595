//! Recording, for the proxy, that Redis handed a scheduled job out of a
//! framework's set after the flip (`proxy::set_pop`, `ingest::release`).
//! The proxy waits for the write before the client sees Redis's reply, so
//! the push it sends next finds the evidence — but [`HOLD_REPLY`] at most:
//! Redis has already popped the job, and a client that times out on the
//! reply (redis-client, Sidekiq 7's driver, waits 1 s by default) pops the
//! next one and never pushes this one. Past that the write goes on in the
//! background; the push is then held, and the settle pass (every second)
//! releases it once the row has committed.

use super::writer::Mirror;

/// How long the proxy holds the pop's reply for the write: far below a
/// client's reply timeout.
const HOLD_REPLY: std::time::Duration = std::time::Duration::from_millis(200);

/// How long the write may take in the background before it counts as failed.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Mirror {
    /// Records releases `(queue, key, structure)`; a failure is logged (by
    /// key count and structure, never the job).
    pub async fn record_releases(&self, rows: Vec<(String, String, String)>) {
        let pool = self.due.pool.clone();
        let write = tokio::spawn(async move {
            let written =
                tokio::time::timeout(WRITE_TIMEOUT, crate::ingest::release::record(&pool, &rows))
                    .await;
            let failed = match written {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no commit within {WRITE_TIMEOUT:?}"),
            };
            let structure = rows.first().map_or("", |r| r.2.as_str());
            tracing::warn!(keys = rows.len(), structure, error = %failed,
                "Redis handed scheduled jobs out of their set after the flip, and that was not \
                 recorded: their pushes are held until an operator decides");
        });
        if tokio::time::timeout(HOLD_REPLY, write).await.is_err() {
            tracing::debug!("release write still running; the reply goes on without it");
        }
    }
}
