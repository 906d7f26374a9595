//! Recording, for the proxy, that Redis handed a scheduled job out of a
//! framework's set after the flip (`proxy::set_pop`, `ingest::release`).
//! Awaited before the client sees Redis's reply, so the push it sends next
//! finds the evidence; bounded, so Postgres hanging cannot hold the reply
//! for good (the push is then held, as without the evidence, and the
//! settle pass releases it once the row is there).

use super::writer::Mirror;

/// How long the proxy holds the pop's reply for the write.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Mirror {
    /// Records releases `(queue, key, structure)`; a failure is logged (by
    /// key count and structure, never the job).
    pub async fn record_releases(&self, rows: Vec<(String, String, String)>) {
        let pool = &self.due.pool;
        let written =
            tokio::time::timeout(WRITE_TIMEOUT, crate::ingest::release::record(pool, &rows)).await;
        let failed = match written {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no commit within {WRITE_TIMEOUT:?}"),
        };
        tracing::warn!(keys = rows.len(), structure = %rows[0].2, error = %failed,
            "Redis handed scheduled jobs out of their set after the flip, and that was not \
             recorded: their pushes are held until it is, or until an operator decides");
    }
}
