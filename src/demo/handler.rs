//! The demo's job handler: an in-process HTTP endpoint that counts live and
//! shadow calls per job key (the demo's ledger of "ran live exactly once")
//! and answers like a real service would, with a volatile `processed_at`
//! field the route's ignore rules leave out of the comparison.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;

/// Calls per job key: (live, shadow), the live runs of a framework's own
/// workers on the Redis side (`qbridge demo --framework`), which call in
/// with `qbd-side: redis`, and the keys whose first attempt was made to
/// fail (`qbd-flaky: 1`, asked before the side effect).
#[derive(Clone, Default)]
pub struct Ledger(
    Arc<Mutex<HashMap<String, (u32, u32)>>>,
    Arc<Mutex<u64>>,
    Arc<Mutex<std::collections::HashSet<String>>>,
);

impl Ledger {
    /// Whether this attempt of `key` must fail: only its first.
    fn fail_once(&self, key: &str) -> bool {
        let mut failed = self.2.lock().unwrap_or_else(|e| e.into_inner());
        failed.insert(key.to_string())
    }

    /// Jobs whose first attempt failed on purpose.
    pub fn failed_once(&self) -> usize {
        self.2.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn record(&self, key: &str, shadow: bool, on_redis: bool) {
        let mut calls = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let entry = calls.entry(key.to_string()).or_default();
        if shadow {
            entry.1 += 1;
        } else {
            entry.0 += 1;
        }
        if on_redis {
            *self.1.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        }
    }

    /// Live runs the Redis side's own workers made.
    pub fn ran_on_redis(&self) -> u64 {
        *self.1.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (keys run live at least once, live calls, shadow calls, keys run live more than once)
    pub fn totals(&self) -> (usize, u64, u64, usize) {
        let calls = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let live_keys = calls.values().filter(|c| c.0 > 0).count();
        let live: u64 = calls.values().map(|c| u64::from(c.0)).sum();
        let shadow: u64 = calls.values().map(|c| u64::from(c.1)).sum();
        let twice = calls.values().filter(|c| c.0 > 1).count();
        (live_keys, live, shadow, twice)
    }

    /// Keys run live more than once (at most `n`, sorted).
    pub fn twice(&self, n: usize) -> Vec<String> {
        let calls = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut keys: Vec<String> = calls
            .iter()
            .filter(|(_, c)| c.0 > 1)
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys.truncate(n);
        keys
    }

    /// Live calls of one key.
    pub fn live(&self, key: &str) -> u32 {
        let calls = self.0.lock().unwrap_or_else(|e| e.into_inner());
        calls.get(key).map_or(0, |c| c.0)
    }
}

/// A request header as text; empty when absent or not visible ASCII
/// (the test handlers treat both alike).
pub(crate) fn header_text(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Serves the handler on a free local port; returns its URL.
pub async fn serve(ledger: Ledger) -> std::io::Result<String> {
    let app = axum::Router::new().route(
        "/jobs",
        axum::routing::post(move |headers: HeaderMap| {
            let ledger = ledger.clone();
            async move {
                let header = |name: &str| header_text(&headers, name);
                let key = header("qbridge-job-key");
                // A task asking whether this attempt fails (its first does):
                // 409 if so; not a run either way.
                if header("qbd-flaky") == "1" {
                    let code = if ledger.fail_once(&key) {
                        axum::http::StatusCode::CONFLICT
                    } else {
                        axum::http::StatusCode::OK
                    };
                    return (code, String::new());
                }
                // Shadow mode: compute the same answer, cause no side effect.
                let on_redis = header("qbd-side") == "redis";
                ledger.record(&key, header("qbridge-mode") == "shadow", on_redis);
                let at = chrono::Utc::now().to_rfc3339();
                (
                    axum::http::StatusCode::OK,
                    format!(r#"{{"ok":true,"key":"{key}","processed_at":"{at}"}}"#),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}/jobs"))
}
