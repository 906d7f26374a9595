//! Decommission over the lists of a consumer that is gone (no heartbeat):
//! every item is archived once (and its dead list copied once), also when two runs overlap (two operators,
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
    // And one item it gave up on.
    let _: i64 = redis()
        .await
        .lpush(fx.dead(), b"given up".as_slice())
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
    assert_eq!(first.dead + second.dead, 1, "{first:?} {second:?}");
    assert_eq!(support::dead(&pool).await, 1);
    assert_eq!(fx.leftovers().await, Vec::<String>::new());
    fx.cleanup().await;
}

/// A run that stored a list and then failed before deleting it (Redis went
/// away between the commit and the DEL): the next run finds the list under
/// its archiving name, and its row, and stores nothing again.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_rerun_after_a_failure_before_the_delete_stores_nothing_twice(pool: PgPool) {
    let fx = Fixture::new(
        "raw",
        Phase::Decommissioned,
        PushEnd::Lpush,
        sh("exit 0", &[]),
        1,
        3,
    );
    let _: i64 = redis()
        .await
        .lpush(fx.processing(0), b"same".as_slice())
        .await
        .unwrap();
    let mut conn = connect_redis(REDIS).await.unwrap();
    let first = decommission::archive_and_delete(&pool, &mut conn, &fx.route, support::LIMIT)
        .await
        .expect("first run");
    assert_eq!(first.enqueued, 1, "{first:?}");
    // As if its DEL had not happened: the list it stored is still there.
    let stored: String = sqlx::query_scalar("SELECT list FROM qbridge.archived_lists")
        .fetch_one(&pool)
        .await
        .unwrap();
    let _: i64 = redis()
        .await
        .lpush(&stored, b"same".as_slice())
        .await
        .unwrap();
    let second = decommission::archive_and_delete(&pool, &mut conn, &fx.route, support::LIMIT)
        .await
        .expect("second run");
    assert_eq!((second.enqueued, second.duplicates), (0, 0), "{second:?}");
    assert_eq!(support::jobs(&pool).await, 1);
    assert_eq!(fx.leftovers().await, Vec::<String>::new());
    fx.cleanup().await;
}
