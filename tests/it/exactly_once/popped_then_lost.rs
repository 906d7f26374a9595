//! An identical item (a content-hash key) that qbridge's consumer popped
//! and numbered just before Redis restarted without persistence, and never
//! ran: the item was in the consumer's processing list, which went with
//! Redis. Its number was taken by a pop, so it was judged by the time of
//! that pop; the pop was numbered less than a second before the restart,
//! inside the whole second Redis reports its uptime in, so nothing proved
//! the loss and repair left the copy unaccounted (the randomized oracle's
//! content-hash seeds lost it). The pop now names the server that handed
//! the item out: that server being gone is the evidence.

use std::path::Path;
use std::time::Duration;

use sqlx::PgPool;

use super::process_rig::{OneRoute, ProcessRig};
use crate::support;

const ROUTE: &str = "popped";
const LIST: &str = "qbt:popped:jobs";
const TEXT: &str = "the same text every time";

fn config(dir: &Path, redis_url: &str, proxy_port: u16) -> String {
    // The handler is slow: the process is killed while it runs, before any
    // outcome exists.
    OneRoute {
        name: ROUTE,
        list: LIST,
        format: "raw",
        script: "sleep 30",
        args: Vec::new(),
    }
    .config(dir, redis_url, proxy_port)
}

#[tokio::test]
async fn an_identical_item_popped_just_before_redis_restarted_is_pushed_back() {
    let mut rig = ProcessRig::start(config).await;
    rig.push(LIST, TEXT).await;
    // The mirror copy is written and the pop numbered (either may come
    // first: the mirror writer batches); the process and Redis die at once
    // after both, well inside Redis's uptime second.
    support::wait_for_count(
        &rig.db,
        "the mirror copy",
        "SELECT count(*) FROM qbridge.job_keys",
        1,
    )
    .await;
    let db = rig.db.clone();
    support::wait_for("the numbered pop", Duration::from_secs(20), || async {
        let pops: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM qbridge.numbered_writes WHERE queue = $1 AND side = 'pop'",
        )
        .bind(ROUTE)
        .fetch_one(&db)
        .await
        .unwrap_or(0);
        pops == 1
    })
    .await;
    rig.kill_process().await;
    rig.redis.kill();
    rig.redis.resume();

    let report = rig.repair(ROUTE).await;
    assert_eq!(
        report["repair"]["repushed"], 1,
        "the copy the restart took is pushed back: {report}"
    );
    assert_eq!(
        report["repair"]["unaccounted"], 0,
        "nothing is left unaccounted: {report}"
    );
    let waiting: Vec<String> = ::redis::cmd("LRANGE")
        .arg(LIST)
        .arg(0)
        .arg(-1)
        .query_async(&mut rig.direct().await)
        .await
        .unwrap();
    assert_eq!(waiting, vec![TEXT.to_string()], "the text waits to run");
}

/// The other side of the rule: a failover to a replica (or a restart with
/// persistence) changes the server's run id but keeps its data set, the
/// marker with it. A popped copy whose handler still runs is missing from
/// the lists and has no outcome; the pop's server being another one is no
/// evidence then, and repair must not push the copy back.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_pop_from_a_server_whose_data_set_lives_on_is_no_evidence(pool: PgPool) {
    let route = super::routes_in("raw", "dual_write")
        .by_name("r")
        .expect("route r")
        .clone();
    let key = format!("sha256:{}:1", "ab".repeat(32));
    sqlx::query(
        "INSERT INTO qbridge.job_keys (queue, key, copy, via, pushed_at) \
         VALUES ('q', $1, 'mirror', 'proxy', now() - interval '10 seconds')",
    )
    .bind(&key)
    .execute(&pool)
    .await
    .unwrap();
    // The old primary, last seen a moment before the pop was numbered; the
    // replica, up for an hour, now the primary with the same marker.
    sqlx::query(
        "INSERT INTO qbridge.redis_epochs (route, run_id, marker, started_at, first_seen, last_seen) VALUES \
         ('r', 'old-primary', 'm1', now() - interval '2 hours', now() - interval '2 hours', now() - interval '2 seconds'), \
         ('r', 'replica', 'm1', now() - interval '1 hour', now() - interval '1 second', now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO qbridge.numbered_writes (write_id, queue, key, side, server, at) \
         VALUES ('pop-1', 'q', $1, 'pop', 'old-primary', now() - interval '500 milliseconds')",
    )
    .bind(&key)
    .execute(&pool)
    .await
    .unwrap();
    let current = |marker: &str| qbridge::redis::epoch::Epoch {
        run_id: "replica".into(),
        marker: marker.into(),
        started_at: chrono::Utc::now() - chrono::Duration::hours(1),
    };
    let keys = [key.clone()];
    let evidence = qbridge::redis::epoch::loss_evidence(&pool, &route, &current("m1"), &keys)
        .await
        .unwrap();
    assert!(evidence.is_empty(), "{evidence:?}");
    // The same pop on a server whose data set is gone is evidence.
    sqlx::query(
        "INSERT INTO qbridge.redis_epochs (route, run_id, marker, started_at) \
         VALUES ('r', 'replica', 'm2', now() - interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let evidence = qbridge::redis::epoch::loss_evidence(&pool, &route, &current("m2"), &keys)
        .await
        .unwrap();
    assert_eq!(evidence.len(), 1, "{evidence:?}");
    assert!(evidence[0].1.contains("another marker"), "{evidence:?}");
}
