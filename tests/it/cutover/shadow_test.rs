//! `qbridge cutover shadow-test`: one shadow call of the route's handler
//! with a job the route stored, exactly as the worker makes it in `shadow`
//! (the `Qbridge-Mode: shadow` header, the stored payload), recording
//! nothing; a route with no stored job is a one-line refusal.

use qbridge::ops::shadow_test;

use super::rig::{Options, Rig};

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_shadow_test_calls_the_handler_once_in_shadow_mode_and_records_nothing(
    pool: sqlx::PgPool,
) {
    let rig = Rig::new(&pool, Options::default()).await;
    let route = rig.route();
    match shadow_test::run(&pool, &rig.config, &route, None).await {
        Err(qbridge::error::Error::Refused(why)) => {
            assert!(why.contains("has no stored job yet"), "{why}")
        }
        other => panic!("nothing stored yet: {other:?}"),
    }
    rig.produce(&["first".to_string(), "newest".to_string()])
        .await;

    let t = shadow_test::run(&pool, &rig.config, &route, None)
        .await
        .expect("a shadow call");
    assert_eq!((t.key.as_str(), t.done), ("newest", true), "{t:?}");
    assert!(t.handler.ends_with("/run") && t.digest.is_some(), "{t:?}");
    assert_eq!(
        (rig.calls.shadow("newest"), rig.calls.live("newest")),
        (1, 0)
    );

    let t = shadow_test::run(&pool, &rig.config, &route, Some("first"))
        .await
        .expect("the job asked for");
    assert_eq!(t.key, "first");
    assert_eq!(rig.calls.shadow("first"), 1);
    // The handler's answer to a shadow call it refuses is shown as it is.
    rig.produce(&["flip1".to_string()]).await;
    let t = shadow_test::run(&pool, &rig.config, &route, Some("flip1"))
        .await
        .unwrap();
    assert!(!t.done && t.answer.starts_with("failed for good"), "{t:?}");

    let recorded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM qbridge.outcomes WHERE queue = $1")
            .bind(&route.queue)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(recorded, 0, "a self-test is not an outcome");
    match shadow_test::run(&pool, &rig.config, &route, Some("nope")).await {
        Err(qbridge::error::Error::Refused(why)) => {
            assert!(why.contains("no stored job \"nope\""), "{why}")
        }
        other => panic!("{other:?}"),
    }
}
