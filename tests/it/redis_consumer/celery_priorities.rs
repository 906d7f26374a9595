//! Kombu puts a Celery task sent with a priority into a list of
//! its own (`<queue>\x06\x16<step>`), and Celery's workers read the queue's
//! own list first, then the priority lists in order. qbridge's Redis
//! consumer reads them the same way, so a route whose Redis side qbridge
//! runs leaves no prioritized task behind. Real Celery 5.7 sends the tasks.

use std::time::Duration;

use sqlx::PgPool;

use qbridge::config::PushEnd;
use qbridge::model::Phase;

use super::{outcomes, redis, Fixture};
use crate::exactly_once::fleet::produce;
use crate::exactly_once::REDIS;
use crate::support::{sh, wait_for};

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_consumer_runs_tasks_from_every_priority_list_own_list_first(pool: PgPool) {
    let fx = Fixture::new(
        "celery",
        Phase::DualWrite,
        PushEnd::Lpush,
        sh("exit 0", &[]),
        1,
        3,
    );
    let ledger = format!("{}:ledger", fx.list);
    let later = produce(REDIS, &fx.list, &ledger, 2, Some(7)).await;
    let first = produce(REDIS, &fx.list, &ledger, 2, None).await;
    let sub_list = format!("{}\x06\x166", fx.list);
    let waiting: i64 = ::redis::cmd("LLEN")
        .arg(&sub_list)
        .query_async(&mut redis().await)
        .await
        .unwrap();
    assert_eq!(waiting, 2, "kombu put priority 7 in the list of step 6");

    let running = fx.start(&pool).await;
    wait_for("every task ran", Duration::from_secs(20), || async {
        outcomes(&pool).await.len() == 4
    })
    .await;
    running.stop().await;
    let ran: Vec<String> = outcomes(&pool).await.into_iter().map(|o| o.0).collect();
    let (own, prioritized) = ran.split_at(2);
    let mut own = own.to_vec();
    own.sort();
    let mut expected = first.clone();
    expected.sort();
    assert_eq!(own, expected, "the queue's own list first: {ran:?}");
    assert!(prioritized.iter().all(|k| later.contains(k)), "{ran:?}");
    let left: i64 = ::redis::cmd("EXISTS")
        .arg(&fx.list)
        .arg(&sub_list)
        .query_async(&mut redis().await)
        .await
        .unwrap();
    assert_eq!(left, 0, "a list still holds tasks");
    fx.cleanup().await;
}
