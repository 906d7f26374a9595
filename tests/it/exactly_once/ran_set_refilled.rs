//! A client's retry of a job that ran on Redis, reaching Redis after it
//! lost its data (and with it the ran set) at a moment Postgres does not
//! answer. The live-key guard had been written again once Redis came back
//! (Postgres answered then), so the consumer, asking Postgres in vain,
//! took the guard's "not live" as the answer and ran the job a second time:
//! the guard knows live keys, not runs. Now every process with a Redis side
//! writes the ran set again from the outcomes in Postgres when Redis lost
//! it, and the consumer trusts a ran set only once that is done.

use std::path::Path;
use std::time::Duration;

use super::process_rig::{OneRoute, ProcessRig};
use crate::support;

const ROUTE: &str = "refilled";
const LIST: &str = "qbt:refilled:jobs";

fn config(dir: &Path, redis_url: &str, proxy_port: u16) -> String {
    OneRoute {
        name: ROUTE,
        list: LIST,
        format: "json:/id",
        script: "echo run >> \"$1\"",
        args: vec![dir.join("ran")],
    }
    .config(dir, redis_url, proxy_port)
}

#[tokio::test]
async fn a_retry_after_redis_lost_its_ran_set_does_not_run_while_postgres_is_silent() {
    retry_with_postgres_silent(false).await;
}

/// The same with the ran set and its marker gone again after the refill
/// (as a second loss before the next pass would leave them), the live-key
/// guard still current: the consumer may not take the guard's "not live"
/// for "not run", and the retry waits.
#[tokio::test]
async fn without_a_whole_ran_set_the_retry_waits_for_postgres() {
    retry_with_postgres_silent(true).await;
}

async fn retry_with_postgres_silent(ran_set_gone: bool) {
    let mut rig = ProcessRig::start(config).await;
    rig.push(LIST, r#"{"id":"k1"}"#).await;
    support::wait_for_count(
        &rig.db,
        "the run on record",
        "SELECT count(*) FROM qbridge.outcomes WHERE key = 'k1' AND outcome = 'ok'",
        1,
    )
    .await;
    rig.redis.kill();
    rig.redis.resume();
    // Postgres answers while the process writes the live-key guard into the
    // new server, and the ran set again, marked for this server; then it
    // goes away.
    let live = format!("qbridge:live-through:{ROUTE}");
    rig.wait_for_key("the live-key guard", &live).await;
    let ran = format!("qbridge:ran-through:{ROUTE}");
    rig.wait_for_key("the ran set written again", &ran).await;
    let direct = rig.direct().await;
    rig.pg.kill();
    if ran_set_gone {
        let _: i64 = ::redis::cmd("DEL")
            .arg(format!("qbridge:ran:{ROUTE}"))
            .arg(format!("qbridge:ran-through:{ROUTE}"))
            .query_async(&mut direct.clone())
            .await
            .unwrap();
    }
    // The client's retry goes straight to Redis.
    let _: i64 = ::redis::cmd("LPUSH")
        .arg(LIST)
        .arg(r#"{"id":"k1"}"#)
        .query_async(&mut direct.clone())
        .await
        .unwrap();
    support::wait_for("the retry to be popped", Duration::from_secs(20), || {
        let mut direct = direct.clone();
        async move {
            let waiting: i64 = ::redis::cmd("LLEN")
                .arg(LIST)
                .query_async(&mut direct)
                .await
                .unwrap_or(1);
            waiting == 0
        }
    })
    .await;
    if !ran_set_gone {
        // The set written again answers alone: the retry is dropped as run,
        // with Postgres still away.
        rig.wait_until_lists_empty(LIST).await;
    }
    // Longer than the consumer's question to Postgres (2 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let runs = std::fs::read_to_string(rig.dir.path().join("ran")).unwrap_or_default();
    assert_eq!(
        runs.lines().count(),
        1,
        "the retry ran while Postgres was silent"
    );
    rig.pg.resume();
    if ran_set_gone {
        // Postgres back: the retry is judged by its record and dropped.
        rig.wait_until_lists_empty(LIST).await;
        let runs = std::fs::read_to_string(rig.dir.path().join("ran")).unwrap_or_default();
        assert_eq!(
            runs.lines().count(),
            1,
            "the retry ran once Postgres answered"
        );
    }
}
