//! Decommission over the lists of a consumer that is gone (no heartbeat):
//! every item is archived once, also when two runs overlap (two operators,
//! or a retry while the first run still works) and for formats without an
//! id, whose keys are numbered by occurrence so that `job_keys` cannot tell
//! a second store of the same item from a new one.

use ::redis::AsyncCommands;
use sqlx::PgPool;

use qbridge::config::PushEnd;
use qbridge::model::Phase;
use qbridge::ops::decommission;
use qbridge::redis::connect::connect_redis;

use super::{redis, Fixture, REDIS};
use crate::support::{self, sh};

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn overlapping_runs_archive_a_gone_consumers_items_once(pool: PgPool) {
    let fx = Fixture::new(
        "raw",
        Phase::Decommissioned,
        PushEnd::Lpush,
        sh("exit 0", &[]),
        2,
        3,
    );
    // The consumer died holding items in two slots; its heartbeat is gone.
    let _: i64 = redis()
        .await
        .lpush(fx.processing(0), &[b"same".as_slice(), b"\xffother"])
        .await
        .unwrap();
    let _: i64 = redis()
        .await
        .lpush(fx.processing(1), b"same".as_slice())
        .await
        .unwrap();
    let (mut one, mut two) = (
        connect_redis(REDIS).await.unwrap(),
        connect_redis(REDIS).await.unwrap(),
    );
    let (first, second) = tokio::join!(
        decommission::archive_and_delete(&pool, &mut one, &fx.route, support::LIMIT),
        decommission::archive_and_delete(&pool, &mut two, &fx.route, support::LIMIT),
    );
    let (first, second) = (first.expect("first run"), second.expect("second run"));
    assert_eq!(first.enqueued + second.enqueued, 3, "{first:?} {second:?}");
    assert!(
        first.consumers_gone.contains(&fx.consumer) || second.consumers_gone.contains(&fx.consumer),
        "{first:?} {second:?}"
    );
    // A later run finds nothing more.
    let third = decommission::archive_and_delete(&pool, &mut one, &fx.route, support::LIMIT)
        .await
        .expect("third run");
    assert_eq!((third.enqueued, third.duplicates), (0, 0), "{third:?}");
    assert_eq!(support::jobs(&pool).await, 3);
    assert_eq!(fx.leftovers().await, Vec::<String>::new());
    fx.cleanup().await;
}
