//! Parking items whose mirror write failed: they go to the end of the
//! route's gap list (`qbridge:gap:<route>`), where gap repair finds them once
//! Postgres is back. Redis already holds the items themselves and runs them;
//! only their Postgres copies wait here.

use ::redis::aio::ConnectionManager;
use ::redis::AsyncCommands;
use bytes::Bytes;

use crate::redis::keys::RouteKeys;
use crate::routes::Route;

/// Appends `items` to the route's gap list, in order.
pub(super) async fn park(
    conn: &mut ConnectionManager,
    route: &Route,
    items: &[Bytes],
) -> ::redis::RedisResult<()> {
    let items: Vec<&[u8]> = items.iter().map(|b| b.as_ref()).collect();
    conn.rpush::<_, _, ()>(RouteKeys::of(route).gap(), items)
        .await
}
