//! SIGINT/SIGTERM → one `CancellationToken`. The worker runtime stops intake on
//! it, then drains under a deadline (see `worker::runtime`).

use tokio_util::sync::CancellationToken;

/// Returns a token that is cancelled on the first SIGINT or SIGTERM.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received: stopping intake and draining (again to force)");
        cancel.cancel();
        // A second signal means "now": leases of unfinished jobs expire and
        // the reaper hands them out again, so nothing is lost.
        wait_for_signal().await;
        tracing::warn!("second signal: exiting without draining");
        std::process::exit(130);
    });
    token
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
