//! The reader's wait before it routes a push: only under a phase every
//! process routing the route's pushes follows, counted until the push is
//! written (why: [`crate::model::following`]).

use std::time::Instant;

use bytes::Bytes;
use tokio::io::AsyncWrite;

use super::{Batch, Reader};
use crate::model::following::{RoutedPush, FOLLOW_WAIT};
use crate::model::Phase;
use crate::routes::Route;

/// The refusal after [`FOLLOW_WAIT`] (its text is
/// `model::following::NOT_FOLLOWED`): nothing was stored or forwarded; the
/// client pushes again.
pub(super) const NOT_FOLLOWED: &[u8] = b"-TRYAGAIN qbridge: not every process routing this \
    route's pushes has followed its latest phase change yet; nothing was stored, push again\r\n";

impl<W: AsyncWrite + Unpin> Reader<W> {
    /// The phase a push on `route` (first item `first`) is routed in, with
    /// its count; `None` when the route's latest change is still not
    /// followed by every process after [`FOLLOW_WAIT`].
    pub(super) async fn followed_phase(
        &mut self,
        route: &Route,
        first: Option<&Bytes>,
        batch: &mut Batch,
        read_at: Instant,
    ) -> std::io::Result<Option<(RoutedPush, Phase)>> {
        let shared = std::sync::Arc::clone(&self.shared);
        let routes = &shared.routes;
        let until = tokio::time::Instant::now() + FOLLOW_WAIT;
        loop {
            // Counted before the phase is read: a change after the read
            // waits for this push (see `model::following`).
            let routed = routes.phases().route_push();
            if let Some(phase) = routes.followed_push_phase(route, first) {
                return Ok(Some((routed, phase)));
            }
            drop(routed);
            // What is ready goes to Redis first; this client waits.
            let ready = std::mem::take(batch);
            self.flush(ready, read_at).await?;
            if !routes.phases().wait_followed(&route.name, until).await {
                tracing::warn!(route = %route.name, "a push refused: its route's latest phase change is not followed by every process");
                return Ok(None);
            }
        }
    }
}
