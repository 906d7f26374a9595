//! Enqueue: on the caller's transaction (rolls back with it, wakes nobody when
//! rolled back), key dedupe against in-flight jobs and within one batch.

use std::time::Duration;

use qbridge::queue::enqueue::{enqueue, enqueue_many, EnqueueOutcome};
use qbridge::queue::{fence, NewJob, NOTIFY_CHANNEL};
use serde_json::json;
use sqlx::postgres::PgListener;
use sqlx::PgPool;

use crate::support::{self, LIMIT};

/// A job enqueued on a transaction exists only if the transaction commits, and
/// only a committed enqueue sends a wake-up.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn enqueue_commits_and_rolls_back_with_the_transaction(pool: PgPool) {
    let mut listener = PgListener::connect(&support::db_url(&pool)).await.unwrap();
    listener.listen(NOTIFY_CHANNEL).await.unwrap();

    sqlx::query("CREATE TABLE orders (id int PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let out = enqueue(
        &mut tx,
        &[NewJob::new("rolled_back", json!({"order": 1}))],
        LIMIT,
    )
    .await
    .unwrap();
    assert!(matches!(out[0], EnqueueOutcome::Inserted(_)));
    // Visible inside the transaction...
    let inside: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(inside, 1);
    tx.rollback().await.unwrap();
    // ...and gone with it.
    assert_eq!(support::jobs(&pool).await, 0);
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM orders").await,
        0
    );

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let out = enqueue(
        &mut tx,
        &[NewJob::new("committed", json!({"order": 2}))],
        LIMIT,
    )
    .await
    .unwrap();
    let EnqueueOutcome::Inserted(id) = out[0] else {
        panic!("{out:?}")
    };
    // Not visible to others before commit.
    assert_eq!(support::jobs(&pool).await, 0);
    tx.commit().await.unwrap();
    let row: (i64, String, serde_json::Value) =
        sqlx::query_as("SELECT id, queue, payload FROM qbridge.jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(row, (id, "committed".into(), json!({"order": 2})));
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM orders").await,
        1
    );

    // The first notification is the committed one: the rollback sent none.
    let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("no NOTIFY after commit")
        .unwrap();
    assert_eq!(n.payload(), "committed");
}

/// Same (queue, key) while the first is in flight is a duplicate naming the
/// first job; inside one batch the first occurrence wins; the same key in
/// another queue is not a duplicate; once the first job completes the key is free.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn key_dedupes_in_flight_jobs(pool: PgPool) {
    let out = enqueue_many(
        &pool,
        &[NewJob::new("q", json!(1)).with_key("order-7")],
        LIMIT,
    )
    .await
    .unwrap();
    let EnqueueOutcome::Inserted(first) = out[0] else {
        panic!("{out:?}")
    };

    let out = enqueue_many(
        &pool,
        &[
            NewJob::new("q", json!(2)).with_key("order-7"),
            NewJob::new("q", json!(3)).with_key("order-8"),
            NewJob::new("q", json!(4)),
            NewJob::new("q", json!(5)).with_key("order-8"),
            NewJob::new("other", json!(6)).with_key("order-7"),
            NewJob::new("q", json!(7)),
        ],
        LIMIT,
    )
    .await
    .unwrap();
    assert_eq!(out[0], EnqueueOutcome::Duplicate(Some(first)));
    let EnqueueOutcome::Inserted(eight) = out[1] else {
        panic!("{out:?}")
    };
    assert!(matches!(out[2], EnqueueOutcome::Inserted(_)));
    assert_eq!(
        out[3],
        EnqueueOutcome::Duplicate(Some(eight)),
        "duplicate inside one batch"
    );
    assert!(
        matches!(out[4], EnqueueOutcome::Inserted(_)),
        "another queue's key collided"
    );
    assert!(matches!(out[5], EnqueueOutcome::Inserted(_)));
    // Unkeyed outcomes map back to their own rows, in input order.
    let EnqueueOutcome::Inserted(plain) = out[2] else {
        unreachable!()
    };
    let payload: serde_json::Value =
        sqlx::query_scalar("SELECT payload FROM qbridge.jobs WHERE id = $1")
            .bind(plain)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(payload, json!(4));
    assert_eq!(support::jobs(&pool).await, 5);
    let kept: serde_json::Value =
        sqlx::query_scalar("SELECT payload FROM qbridge.jobs WHERE id = $1")
            .bind(first)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(kept, json!(1), "a duplicate overwrote the first job");

    // Still a duplicate while running.
    let queues = vec!["q".to_string()];
    let running = qbridge::queue::claim(
        &pool,
        &support::claim_req(&queues, 10, "w", Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let out = enqueue_many(
        &pool,
        &[NewJob::new("q", json!(8)).with_key("order-7")],
        LIMIT,
    )
    .await
    .unwrap();
    assert_eq!(out[0], EnqueueOutcome::Duplicate(Some(first)));

    // Completed: the key can be used again.
    let r = fence::complete(&pool, &support::refs(&running), false)
        .await
        .unwrap();
    assert!(r.lost.is_empty());
    let out = enqueue_many(
        &pool,
        &[NewJob::new("q", json!(9)).with_key("order-7")],
        LIMIT,
    )
    .await
    .unwrap();
    let EnqueueOutcome::Inserted(again) = out[0] else {
        panic!("{out:?}")
    };
    assert_ne!(again, first);
}

/// A batch larger than one insert chunk (10,000 rows) keeps outcomes in input
/// order and finds duplicates across chunks.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn big_batch_outcomes_stay_in_order(pool: PgPool) {
    let mut jobs: Vec<NewJob> = (0..10_050)
        .map(|i| {
            let j = NewJob::new("big", json!({ "i": i }));
            if i % 2 == 0 {
                j.with_key(format!("k{i}"))
            } else {
                j
            }
        })
        .collect();
    // The last job repeats the key of the first: a duplicate from an earlier chunk.
    jobs.push(NewJob::new("big", json!({ "i": -1 })).with_key("k0"));
    let out = enqueue_many(&pool, &jobs, LIMIT).await.unwrap();
    assert_eq!(out.len(), jobs.len());
    let EnqueueOutcome::Inserted(first) = out[0] else {
        panic!()
    };
    assert_eq!(*out.last().unwrap(), EnqueueOutcome::Duplicate(Some(first)));
    let ids: Vec<i64> = out[..10_050]
        .iter()
        .map(|o| match o {
            EnqueueOutcome::Inserted(id) => *id,
            other => panic!("{other:?}"),
        })
        .collect();
    let rows: Vec<(i64, serde_json::Value)> =
        sqlx::query_as("SELECT id, payload FROM qbridge.jobs")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 10_050);
    let by_id: std::collections::HashMap<i64, serde_json::Value> = rows.into_iter().collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            by_id[id],
            json!({ "i": i }),
            "outcome {i} names the wrong row"
        );
    }
}
