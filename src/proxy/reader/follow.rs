//! The reader's wait before it routes a push: only under a phase every
//! process routing the route's pushes follows, counted until the push is
//! written (why: [`crate::model::following`]).

use std::time::Instant;

use bytes::Bytes;
use tokio::io::AsyncWrite;

use super::{Batch, Reader, Routing};
use crate::metrics as m;
use crate::model::following::{RoutedPush, FOLLOW_WAIT};
use crate::model::Phase;
use crate::proxy::command::Tag;
use crate::routes::Route;

/// The refusal after [`FOLLOW_WAIT`] (its text is
/// `model::following::NOT_FOLLOWED`): nothing was stored or forwarded; the
/// client pushes again.
pub(super) const NOT_FOLLOWED: &[u8] = b"-TRYAGAIN qbridge: not every process routing this \
    route's pushes has followed its latest phase change yet; nothing was stored, push again\r\n";

/// What Redis gets in place of a push inside MULTI that cannot be routed
/// yet when an earlier push of the same MULTI was routed (its count, held
/// until EXEC, may be what the change waits for, so this one cannot wait):
/// a command Redis does not know, so it answers this one with an error and
/// EXEC with `-EXECABORT`, running none of the transaction. (Answering the
/// push locally would let EXEC run the rest: RQ's scheduler removes a job
/// from its registry and pushes it in one MULTI.) The first push of a
/// MULTI waits like any other: Sidekiq, kombu and RQ push once per MULTI.
pub(super) const ABORT_MULTI: &[u8] = b"*1\r\n$16\r\nQBRIDGE.TRYAGAIN\r\n";

impl<W: AsyncWrite + Unpin> Reader<W> {
    /// The phase a push on `route` (first item `first`) is routed in, with
    /// its count; else how it is refused: at once after another push of
    /// the same MULTI (see [`ABORT_MULTI`]), otherwise after
    /// [`FOLLOW_WAIT`] (`-TRYAGAIN`; inside MULTI, [`ABORT_MULTI`] too).
    pub(super) async fn followed_phase(
        &mut self,
        route: &Route,
        first: Option<&Bytes>,
        in_multi: bool,
        batch: &mut Batch,
        read_at: Instant,
    ) -> std::io::Result<Result<(RoutedPush, Phase), Routing>> {
        let mut until = None;
        loop {
            // Counted before the phase is read: a change after the read
            // waits for this push (see `model::following`).
            let routed = self.shared.routes.phases().route_push();
            if let Some(phase) = self.shared.routes.followed_push_phase(route, first) {
                self.routed_in_multi |= in_multi;
                return Ok(Ok((routed, phase)));
            }
            drop(routed);
            let until = *until.get_or_insert_with(|| tokio::time::Instant::now() + FOLLOW_WAIT);
            // After a push of the same MULTI this one cannot wait.
            let waited = !self.routed_in_multi && {
                // What is ready goes to Redis first; this client waits.
                let ready = std::mem::take(batch);
                self.flush(ready, read_at).await?;
                let phases = self.shared.routes.phases();
                phases.wait_followed(&route.name, until).await
            };
            if !waited {
                tracing::warn!(route = %route.name, "a push refused: its route's latest phase change is not followed by every process");
                metrics::counter!(m::PUSHES_NOT_FOLLOWED, "route" => route.name.clone())
                    .increment(1);
                return Ok(Err(match in_multi {
                    true => Routing::AbortMulti,
                    false => Routing::Local(Tag::Answer(NOT_FOLLOWED)),
                }));
            }
        }
    }
}
