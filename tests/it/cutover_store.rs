//! The stored phase flag: every legal and illegal step, compare-and-swap
//! under a race (exactly one operator wins), the audit log, the NOTIFY.

use serde_json::json;
use sqlx::postgres::PgListener;
use sqlx::PgPool;

use qbridge::cutover::store::{self, Change, PhaseError};
use qbridge::model::Phase;

use crate::support;

fn change<'a>(route: &'a str, from: Phase, to: Phase) -> Change<'a> {
    Change {
        route,
        from,
        to,
        changed_by: "ops@example",
        reason: "gates green",
        forced: false,
        gates: json!({"completeness": 1.0}),
    }
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn every_legal_step_works_and_every_other_is_refused(pool: PgPool) {
    store::register(&pool, "r", Phase::RedisOnly, "config")
        .await
        .unwrap();
    // The stored phase wins over a later config value.
    let again = store::register(&pool, "r", Phase::Shadow, "config")
        .await
        .unwrap();
    assert_eq!(again.phase, Phase::RedisOnly);

    for pair in Phase::ALL.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        // Skipping ahead from here is refused before touching the row.
        for skip in Phase::ALL.iter().filter(|p| !store::is_legal(from, **p)) {
            let err = store::transition(&pool, &change("r", from, *skip))
                .await
                .unwrap_err();
            assert!(
                matches!(err, PhaseError::Illegal { .. }),
                "{from} -> {skip}: {err}"
            );
        }
        let now = store::transition(&pool, &change("r", from, to))
            .await
            .unwrap();
        assert_eq!((now.phase, now.changed_by.as_str()), (to, "ops@example"));
    }
    // And all the way back, one step at a time.
    for pair in Phase::ALL.windows(2).rev() {
        store::transition(&pool, &change("r", pair[1], pair[0]))
            .await
            .unwrap();
    }
    assert_eq!(
        store::current(&pool, "r").await.unwrap().unwrap().phase,
        Phase::RedisOnly
    );
    // 1 registration + 4 advances + 4 rollbacks, in order, with the gates.
    let audit: Vec<(Option<String>, String)> =
        sqlx::query_as("SELECT from_phase, to_phase FROM qbridge.phase_audit ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(audit.len(), 9);
    assert_eq!(audit[0], (None, "redis_only".into()));
    assert_eq!(
        audit[4],
        (Some("postgres_only".into()), "decommissioned".into())
    );
    assert_eq!(audit[8], (Some("dual_write".into()), "redis_only".into()));
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.phase_audit WHERE (gates->>'completeness')::float8 = 1"
        )
        .await,
        8
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn two_operators_racing_one_wins_the_other_gets_a_clear_error(pool: PgPool) {
    store::register(&pool, "r", Phase::DualWrite, "config")
        .await
        .unwrap();
    let mut racers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let pool = pool.clone();
        racers.spawn(async move {
            store::transition(&pool, &change("r", Phase::DualWrite, Phase::Shadow)).await
        });
    }
    let (mut won, mut lost) = (0, 0);
    while let Some(result) = racers.join_next().await {
        match result.unwrap() {
            Ok(state) => {
                assert_eq!(state.phase, Phase::Shadow);
                won += 1;
            }
            Err(PhaseError::Conflict { actual, .. }) => {
                assert_eq!(actual, Phase::Shadow);
                lost += 1;
            }
            Err(other) => panic!("unexpected: {other}"),
        }
    }
    assert_eq!((won, lost), (1, 7));
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.phase_audit WHERE to_phase = 'shadow'"
        )
        .await,
        1
    );
    let msg = store::transition(&pool, &change("r", Phase::DualWrite, Phase::Shadow))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("is in shadow, not dual_write") && !msg.contains('\n'),
        "{msg}"
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_change_is_announced_and_needs_a_known_route_and_a_reason(pool: PgPool) {
    store::register(&pool, "r", Phase::RedisOnly, "config")
        .await
        .unwrap();
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen(store::CHANNEL).await.unwrap();
    store::transition(&pool, &change("r", Phase::RedisOnly, Phase::DualWrite))
        .await
        .unwrap();
    let note = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("NOTIFY within 5s")
        .unwrap();
    assert_eq!(note.payload(), "r");

    let err = store::transition(&pool, &change("nope", Phase::RedisOnly, Phase::DualWrite))
        .await
        .unwrap_err();
    assert!(matches!(err, PhaseError::UnknownRoute(_)), "{err}");
    let mut no_reason = change("r", Phase::DualWrite, Phase::Shadow);
    no_reason.reason = "  ";
    assert!(matches!(
        store::transition(&pool, &no_reason).await.unwrap_err(),
        PhaseError::NoReason
    ));
    assert_eq!(store::all(&pool).await.unwrap().len(), 1);
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_watch_follows_the_store_and_keeps_the_last_known_phase(pool: PgPool) {
    use qbridge::cutover::watch;
    use qbridge::model::PhaseView;
    store::register(&pool, "r", Phase::DualWrite, "config")
        .await
        .unwrap();
    let view = PhaseView::new([("r".to_string(), Phase::RedisOnly)]);
    assert_eq!(watch::run_once(&pool, &view).await.unwrap(), 1);
    assert_eq!(view.get("r"), Phase::DualWrite);
    store::transition(&pool, &change("r", Phase::DualWrite, Phase::Shadow))
        .await
        .unwrap();
    assert_eq!(watch::run_once(&pool, &view).await.unwrap(), 1);
    assert_eq!(view.get("r"), Phase::Shadow);
    assert_eq!(watch::run_once(&pool, &view).await.unwrap(), 0);

    // Postgres unreachable: an error, and the view keeps what it had.
    let gone = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:1/x")
        .unwrap();
    assert!(watch::run_once(&gone, &view).await.is_err());
    assert_eq!(view.get("r"), Phase::Shadow);

    // The loop picks a change up within its interval.
    let token = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(watch::run(
        pool.clone(),
        None,
        view.clone(),
        vec!["r".to_string()],
        watch::INTERVAL,
        token.clone(),
    ));
    store::transition(&pool, &change("r", Phase::Shadow, Phase::PostgresOnly))
        .await
        .unwrap();
    support::wait_for(
        "the view to follow",
        std::time::Duration::from_secs(1),
        || {
            let view = view.clone();
            async move { view.get("r") == Phase::PostgresOnly }
        },
    )
    .await;
    token.cancel();
    task.await.unwrap();
}
