//! The thin loop around a maintenance pass: run it every `period` until the
//! token is cancelled. Each pass logs what it did itself; this only paces.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Runs `pass` every `period` until `token` is cancelled — at once first when
/// `now` is true, else after one period (for passes already run at start-up).
pub async fn every<F, Fut>(period: Duration, token: CancellationToken, now: bool, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    if now {
        pass().await;
    }
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        pass().await;
    }
}
