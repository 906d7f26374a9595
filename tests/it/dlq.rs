//! Dead-letter tools: list and show by queue and error text, requeue back into
//! the hot table with attempts reset, and never requeue a key that is in
//! flight again.

use std::time::Duration;

use qbridge::queue::dlq::{self, Selector};
use qbridge::queue::{fence, NewJob};
use serde_json::json;
use sqlx::PgPool;

use crate::support;

/// Enqueues `jobs`, claims them and dead-letters each with its error.
pub(crate) async fn kill(pool: &PgPool, jobs: &[(NewJob, &str)]) -> Vec<i64> {
    let mut ids = Vec::new();
    for (job, error) in jobs {
        let id = support::enqueue_ids(pool, std::slice::from_ref(job)).await[0];
        let claimed = support::claim(pool, &job.queue, 100, Duration::from_secs(60)).await;
        let mine = claimed
            .iter()
            .find(|j| j.id == id)
            .expect("claimed")
            .job_ref();
        let others: Vec<_> = claimed
            .iter()
            .filter(|j| j.id != id)
            .map(|j| j.job_ref())
            .collect();
        fence::release(pool, &others, true).await.unwrap();
        let r = fence::dead_letter(pool, &[(mine, error.to_string())])
            .await
            .unwrap();
        assert_eq!(r.applied, vec![id]);
        ids.push(id);
    }
    ids
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn list_show_and_requeue_by_queue_and_error(pool: PgPool) {
    let ids = kill(
        &pool,
        &[
            (
                NewJob::new("mail", json!({"to": "a"})).with_kind("Send"),
                "smtp timeout",
            ),
            (NewJob::new("mail", json!({"to": "b"})), "mailbox full"),
            (
                NewJob::new("mail", json!({"to": "c"})),
                "smtp timeout again",
            ),
            (
                NewJob::new("bill", json!({"inv": 1})).with_priority(3),
                "card declined",
            ),
            (NewJob::new("bill", json!({"inv": 2})), "smtp timeout"),
        ],
    )
    .await;
    assert_eq!(support::jobs(&pool).await, 0);

    let all = dlq::list(&pool, &Selector::default(), 100).await.unwrap();
    assert_eq!(all.len(), 5);
    // Newest first.
    assert_eq!(all[0].id, ids[4]);
    let mail = dlq::list(
        &pool,
        &Selector {
            queue: Some("mail".into()),
            ..Default::default()
        },
        100,
    )
    .await
    .unwrap();
    assert_eq!(
        mail.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![ids[2], ids[1], ids[0]]
    );
    let smtp = Selector {
        error_contains: Some("smtp".into()),
        ..Default::default()
    };
    let found = dlq::list(&pool, &smtp, 100).await.unwrap();
    assert_eq!(found.len(), 3);
    assert_eq!(dlq::count(&pool, &smtp).await.unwrap(), 3);
    assert_eq!(
        dlq::list(&pool, &Selector::default(), 2)
            .await
            .unwrap()
            .len(),
        2
    );

    let shown = dlq::show(&pool, ids[3])
        .await
        .unwrap()
        .expect("dead job shown");
    assert_eq!(shown.payload, json!({"inv": 1}));
    assert_eq!(shown.priority, 3);
    assert_eq!(shown.job.queue, "bill");
    assert_eq!(shown.job.attempts, 1);
    assert_eq!(shown.job.last_error.as_deref(), Some("card declined"));
    assert!(dlq::show(&pool, 999_999).await.unwrap().is_none());

    // Requeue by error text within one queue: only "smtp" jobs of mail.
    let sel = Selector {
        queue: Some("mail".into()),
        error_contains: Some("smtp".into()),
        ..Default::default()
    };
    let mut progress = Vec::new();
    let moved = dlq::requeue(&pool, &sel, 1000, |n| progress.push(n))
        .await
        .unwrap();
    assert_eq!(moved, 2);
    assert_eq!(progress.last(), Some(&2));
    let back: Vec<(String, serde_json::Value, i32, String, Option<String>)> = sqlx::query_as(
        "SELECT queue, payload, attempts, state, kind FROM qbridge.jobs ORDER BY payload->>'to'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        back,
        vec![
            (
                "mail".into(),
                json!({"to": "a"}),
                0,
                "ready".into(),
                Some("Send".into())
            ),
            ("mail".into(), json!({"to": "c"}), 0, "ready".into(), None),
        ]
    );
    assert_eq!(support::dead(&pool).await, 3);
    // Requeued jobs are claimable again, starting from attempt 1.
    let again = support::claim(&pool, "mail", 10, Duration::from_secs(60)).await;
    assert_eq!(again.len(), 2);
    assert!(again.iter().all(|j| j.attempts == 1));

    // Requeue by queue takes everything left of that queue; by ids takes those.
    let moved = dlq::requeue_batch(
        &pool,
        &Selector {
            queue: Some("bill".into()),
            ..Default::default()
        },
        10,
    )
    .await
    .unwrap();
    assert_eq!(moved, 2);
    let moved = dlq::requeue_batch(
        &pool,
        &Selector {
            ids: Some(vec![ids[1]]),
            ..Default::default()
        },
        10,
    )
    .await
    .unwrap();
    assert_eq!(moved, 1);
    assert_eq!(support::dead(&pool).await, 0);
    assert_eq!(support::jobs(&pool).await, 5);
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn requeue_skips_a_key_that_is_in_flight_again(pool: PgPool) {
    kill(
        &pool,
        &[
            (
                NewJob::new("q", json!({"v": 1})).with_key("order-1"),
                "failed",
            ),
            (
                NewJob::new("q", json!({"v": 2})).with_key("order-2"),
                "failed",
            ),
        ],
    )
    .await;
    // order-1 was enqueued again and is in flight.
    let live = support::enqueue_ids(
        &pool,
        &[NewJob::new("q", json!({"v": 3})).with_key("order-1")],
    )
    .await[0];

    let sel = Selector {
        queue: Some("q".into()),
        ..Default::default()
    };
    let moved = dlq::requeue(&pool, &sel, 100, |_| {}).await.unwrap();
    assert_eq!(moved, 1, "only order-2 may be requeued");
    let still_dead: Vec<(Option<String>, serde_json::Value)> =
        sqlx::query_as("SELECT key, payload FROM qbridge.jobs_dead")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(still_dead, vec![(Some("order-1".into()), json!({"v": 1}))]);
    let live_payload: serde_json::Value =
        sqlx::query_scalar("SELECT payload FROM qbridge.jobs WHERE id = $1")
            .bind(live)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(live_payload, json!({"v": 3}), "the live job was replaced");
    assert_eq!(support::jobs(&pool).await, 2);
}

/// The same key dead twice (it failed, was re-enqueued and failed again):
/// requeue brings one back and leaves the other dead, instead of failing, and
/// goes on to the rest even when both copies fall into one batch.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn requeue_with_the_same_key_dead_twice(pool: PgPool) {
    kill(
        &pool,
        &[(
            NewJob::new("q", json!({"v": 1})).with_key("order-1"),
            "first",
        )],
    )
    .await;
    kill(
        &pool,
        &[(
            NewJob::new("q", json!({"v": 2})).with_key("order-1"),
            "second",
        )],
    )
    .await;
    kill(
        &pool,
        &[(
            NewJob::new("q", json!({"v": 3})).with_key("order-2"),
            "other",
        )],
    )
    .await;
    assert_eq!(support::dead(&pool).await, 3);

    let sel = Selector {
        queue: Some("q".into()),
        ..Default::default()
    };
    // 20 jobs/s means batches of 2: the first batch holds both order-1 copies.
    let moved = dlq::requeue(&pool, &sel, 20, |_| {})
        .await
        .expect("requeue must not fail");
    assert_eq!(moved, 2, "order-2 was left behind");
    assert_eq!(support::dead(&pool).await, 1);
    let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM qbridge.jobs ORDER BY key")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(keys, vec!["order-1", "order-2"]);
}

/// Requeue honours its rate: at 20 jobs/s, 30 jobs take more than one second.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn requeue_is_rate_limited(pool: PgPool) {
    let jobs: Vec<(NewJob, &str)> = (0..30).map(|i| (NewJob::new("q", json!(i)), "x")).collect();
    kill(&pool, &jobs).await;
    let started = tokio::time::Instant::now();
    let mut calls = 0;
    let moved = dlq::requeue(&pool, &Selector::default(), 20, |_| calls += 1)
        .await
        .unwrap();
    assert_eq!(moved, 30);
    // 2 per batch, 10 batches a second: 15 full batches and a final empty one.
    assert_eq!(calls, 16);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "requeue ran faster than its rate"
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_dead_job_keeps_its_lock_key_through_requeue(pool: PgPool) {
    let job = NewJob::new("serial", json!({"n": 1})).with_lock_key("account-7");
    kill(&pool, &[(job, "boom")]).await;
    let dead_key: Option<String> =
        sqlx::query_scalar("SELECT lock_key FROM qbridge.jobs_dead WHERE queue = 'serial'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dead_key.as_deref(), Some("account-7"));

    let sel = Selector {
        queue: Some("serial".into()),
        ..Default::default()
    };
    assert_eq!(dlq::requeue_batch(&pool, &sel, 10).await.unwrap(), 1);
    let live_key: Option<String> =
        sqlx::query_scalar("SELECT lock_key FROM qbridge.jobs WHERE queue = 'serial'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(live_key.as_deref(), Some("account-7"));
}
