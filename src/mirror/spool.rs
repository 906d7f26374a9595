//! Parking items whose mirror write failed: they go to the end of the
//! route's gap list (`qbridge:gap:<route>`), where gap repair finds them once
//! Postgres is back. Redis already holds the items themselves and runs them;
//! only their Postgres copies wait here, each with its write id
//! (`redis::gap_entry`): a failed commit may have committed after all, and
//! writing it again must not number its content hash again.

use ::redis::aio::ConnectionManager;
use ::redis::AsyncCommands;
use bytes::Bytes;

use crate::redis::gap_entry;
use crate::redis::keys::RouteKeys;
use crate::routes::Route;

/// The write id of item `index` of a request whose writes are `writes`.
pub(super) fn write_id(writes: uuid::Uuid, index: usize) -> String {
    format!("{}.{index}", writes.simple())
}

/// Appends `items` (a request's, written as `writes`) to the route's gap
/// list, in order.
pub(super) async fn park(
    conn: &mut ConnectionManager,
    route: &Route,
    writes: uuid::Uuid,
    items: &[Bytes],
) -> ::redis::RedisResult<()> {
    let entries: Vec<Vec<u8>> = items
        .iter()
        .enumerate()
        .map(|(i, item)| gap_entry::encode(&write_id(writes, i), item))
        .collect();
    conn.rpush::<_, _, ()>(RouteKeys::of(route).gap(), entries)
        .await
}
