//! Outcome recording: the recorder's batches, its bounded buffer (drops are
//! counted, never waited for), the writer's shutdown flush, and the
//! `qbridge.report_outcome` SQL function for workers qbridge does not run;
//! [`spool`]: the kept recorder's local spool and its replay.

mod spool;

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use qbridge::shadow::{
    self, digest_hex, Mode, Outcome, OutcomeKind, OutcomeRecorder, RecorderOptions, Side,
};

use crate::support;

pub(crate) fn outcome(i: usize) -> Outcome {
    Outcome {
        queue: "q".into(),
        key: format!("k-{i}"),
        side: if i.is_multiple_of(2) {
            Side::Redis
        } else {
            Side::Postgres
        },
        mode: if i.is_multiple_of(3) {
            Mode::Shadow
        } else {
            Mode::Live
        },
        outcome: [OutcomeKind::Ok, OutcomeKind::Failed, OutcomeKind::Dead][i % 3],
        error_class: (!i.is_multiple_of(3)).then_some("exit_code"),
        digest: Some(digest_hex(format!("response {i}").as_bytes())),
        attempt: Some(i as i32 + 1),
    }
}

pub(crate) fn opts(capacity: usize, batch: usize) -> RecorderOptions {
    RecorderOptions {
        capacity,
        batch,
        retries: 1,
        retry_delay: Duration::from_millis(10),
        keep: false,
    }
}

type Row = (
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<i32>,
);

async fn rows(pool: &PgPool) -> Vec<Row> {
    sqlx::query_as(
        "SELECT key, side, mode, outcome, error_class, digest, attempt
           FROM qbridge.outcomes ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_writer_inserts_in_batches_with_every_field(pool: PgPool) {
    let (recorder, mut writer) = OutcomeRecorder::new(pool.clone(), opts(100, 10));
    for i in 0..25 {
        assert!(recorder.record(outcome(i)));
    }
    let report = writer.run_once().await;
    assert_eq!((report.written, report.batches, report.dropped), (25, 3, 0));
    let got = rows(&pool).await;
    assert_eq!(got.len(), 25);
    for (i, row) in got.into_iter().enumerate() {
        let o = outcome(i);
        let want: Row = (
            o.key,
            o.side.as_str().into(),
            o.mode.as_str().into(),
            o.outcome.as_str().into(),
            o.error_class.map(String::from),
            o.digest,
            o.attempt,
        );
        assert_eq!(row, want);
    }
    // Nothing left: a second pass writes nothing.
    assert_eq!(writer.run_once().await.written, 0);
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_full_buffer_drops_and_counts_instead_of_waiting(pool: PgPool) {
    let (recorder, mut writer) = OutcomeRecorder::new(pool.clone(), opts(5, 100));
    let clone = recorder.clone();
    let accepted = tokio::time::timeout(Duration::from_secs(1), async {
        (0..8).filter(|&i| clone.record(outcome(i))).count()
    })
    .await
    .expect("record never waits");
    assert_eq!(accepted, 5);
    assert_eq!(recorder.dropped(), 3);
    assert_eq!(writer.run_once().await.written, 5);
    // Room again once the writer took them.
    assert!(recorder.record(outcome(9)));
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_spawned_writer_flushes_when_every_recorder_is_gone(pool: PgPool) {
    let (recorder, writer) =
        OutcomeRecorder::spawn(pool.clone(), opts(1000, 7), CancellationToken::new());
    for i in 0..50 {
        recorder.clone().record(outcome(i));
    }
    drop(recorder);
    let report = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("writer ends once recorders are dropped")
        .unwrap();
    assert_eq!((report.written, report.dropped), (50, 0));
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.outcomes").await,
        50
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_batch_postgres_refuses_is_dropped_and_counted(pool: PgPool) {
    let other = support::extra_pool(&pool, 1).await;
    let (recorder, mut writer) = OutcomeRecorder::new(other.clone(), opts(100, 100));
    other.close().await;
    for i in 0..4 {
        recorder.record(outcome(i));
    }
    let report = tokio::time::timeout(Duration::from_secs(10), writer.run_once())
        .await
        .expect("bounded retries");
    assert_eq!((report.written, report.dropped), (0, 4));
    // After shutdown nothing is accepted, and that is counted too.
    drop(writer);
    assert!(!recorder.record(outcome(5)));
    assert_eq!(recorder.dropped(), 1);
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn record_writes_directly_in_one_statement(pool: PgPool) {
    let batch: Vec<Outcome> = (0..3).map(outcome).collect();
    assert_eq!(shadow::record(&pool, &batch).await.unwrap(), 3);
    assert_eq!(shadow::record(&pool, &[]).await.unwrap(), 0);
    assert_eq!(rows(&pool).await.len(), 3);
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn report_outcome_stores_a_digest_never_the_detail(pool: PgPool) {
    let detail = "card 4242-4242 declined for alice@example.com";
    let id: i64 =
        sqlx::query_scalar("SELECT qbridge.report_outcome('emails', 'jid-1', 'failed', $1)")
            .bind(detail)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(id > 0);
    let row: (String, String, String, String, String, Option<String>, Option<String>) = sqlx::query_as(
        "SELECT queue, key, side, mode, outcome, error_class, digest FROM qbridge.outcomes WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        row,
        (
            "emails".into(),
            "jid-1".into(),
            "redis".into(),
            "live".into(),
            "failed".into(),
            Some("reported".into()),
            Some(digest_hex(detail.as_bytes())),
        )
    );
    let leaked = support::count(
        &pool,
        "SELECT count(*) FROM qbridge.outcomes o WHERE row_to_json(o)::text LIKE '%4242%'",
    )
    .await;
    assert_eq!(leaked, 0, "the detail itself must not be stored");

    // The Rust form writes the same row.
    let same = Outcome::reported("emails", "jid-1", OutcomeKind::Failed, Some(detail)).unwrap();
    shadow::record(&pool, &[same]).await.unwrap();
    let twins = support::count(
        &pool,
        "SELECT count(DISTINCT (queue, key, side, mode, outcome, error_class, digest)) FROM qbridge.outcomes",
    )
    .await;
    assert_eq!(twins, 1);

    // ok without detail: no class, no digest.
    sqlx::query("SELECT qbridge.report_outcome('emails', 'jid-2', 'ok')")
        .execute(&pool)
        .await
        .unwrap();
    let plain: (Option<String>, Option<String>) =
        sqlx::query_as("SELECT error_class, digest FROM qbridge.outcomes WHERE key = 'jid-2'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(plain, (None, None));
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn report_outcome_rejects_bad_input_clearly(pool: PgPool) {
    for (outcome, key, want) in [
        (
            Some("success"),
            "k",
            "outcome must be ok, failed, dead or skipped, got success",
        ),
        (None, "k", "got NULL"),
        (Some("ok"), "", "queue and key must be non-empty"),
    ] {
        let err = sqlx::query("SELECT qbridge.report_outcome('q', $1, $2, 'x')")
            .bind(key)
            .bind(outcome)
            .execute(&pool)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains(want), "{text}");
        let code = err
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.to_string());
        assert_eq!(code.as_deref(), Some("22023"), "{text}");
    }
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.outcomes").await,
        0
    );
}

#[tokio::test]
async fn a_kept_outcome_outlives_a_postgres_outage_longer_than_the_retries() {
    // The Redis consumer acks an item once its outcome is handed over. Its
    // recorder used to drop a batch after its retries (about 3 s): with
    // Redis then restarted without persistence (the ran set gone), repair
    // took the job for lost and pushed it back, and it ran twice. A kept
    // recorder tries until Postgres takes the batch.
    let server = crate::servers::ThrowawayPostgres::start();
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(500))
        .connect(&server.url())
        .await
        .expect("throwaway Postgres");
    qbridge::MIGRATOR.run(&db).await.expect("migrate");
    let token = CancellationToken::new();
    let (recorder, writer) = OutcomeRecorder::spawn(
        db.clone(),
        RecorderOptions {
            keep: true,
            ..opts(100, 100)
        },
        token.clone(),
    );
    server.kill();
    for i in 0..3 {
        recorder.record_kept(outcome(i)).await;
    }
    // Far past the retries (1 try, 10 ms apart).
    tokio::time::sleep(Duration::from_secs(4)).await;
    server.resume();
    support::wait_for("the kept outcomes written", Duration::from_secs(30), || {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM qbridge.outcomes")
                .fetch_one(&db)
                .await
                .unwrap_or(0)
                == 3
        }
    })
    .await;
    drop(recorder);
    let report = writer.await.unwrap();
    assert_eq!((report.written, report.dropped), (3, 0));
    token.cancel();
}
