//! A push of items the connection took off the route's list itself: it
//! hands them back, and Redis holds them no more (the evidence that runs
//! their re-push live after the flip).

use bytes::Bytes;
use tokio::io::AsyncWrite;

use super::Reader;
use crate::model::formats::decode_bytes;
use crate::routes::Route;

impl<W: AsyncWrite + Unpin> Reader<W> {
    /// The items of a push this connection took off the route's list itself
    /// (`crate::proxy::list_pop`): it gives them back, and Redis holds them no
    /// more. As `(queue, key, structure)` release rows.
    pub(super) fn given_back(
        &self,
        route: &Route,
        items: &[Bytes],
    ) -> Vec<(String, String, String)> {
        if self.link.taken.is_empty() {
            return Vec::new();
        }
        let list = String::from_utf8_lossy(&route.redis_key).into_owned();
        items
            .iter()
            .filter_map(|item| {
                let key = decode_bytes(&route.format, item.clone()).key;
                let key = (!key.is_content_hash()).then(|| key.with_occurrence(0))?;
                self.link.taken.give_back(&route.name, &key).then(|| {
                    let by = format!("{list} (handed back by the client that took it)");
                    (route.queue.clone(), key, by)
                })
            })
            .collect()
    }
}
