//! Real client programs pushing through the proxy: `redis-cli` and redis-py
//! (`tests/clients/redis_py_push.py`). Every job must reach Postgres with
//! the key from its payload.

use std::process::Command;

use qbridge::model::Phase;
use sqlx::PgPool;

use super::harness;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn redis_cli_pushes_are_mirrored(pool: PgPool) {
    let prefix = harness::prefix();
    let key = format!("{prefix}:jobs");
    let proxy = harness::start(
        &pool,
        &prefix,
        vec![harness::route("jobs", &key, Phase::DualWrite)],
    )
    .await;
    let port = proxy.addr.port().to_string();
    let output = tokio::task::spawn_blocking({
        let key = key.clone();
        move || {
            Command::new("redis-cli")
                .args([
                    "-p",
                    &port,
                    "LPUSH",
                    &key,
                    r#"{"id":"cli-1"}"#,
                    r#"{"id":"cli-2"}"#,
                ])
                .output()
        }
    })
    .await
    .expect("join")
    .expect("redis-cli runs");
    assert!(output.status.success(), "{output:?}");
    // Without a terminal redis-cli prints the bare integer reply.
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "2");
    harness::wait_for_jobs(&pool, "jobs", 2).await;
    let keys: Vec<String> = harness::jobs(&pool, "jobs")
        .await
        .into_iter()
        .map(|j| j.0)
        .collect();
    assert_eq!(keys, ["cli-1", "cli-2"]);
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn redis_py_pushes_are_mirrored(pool: PgPool) {
    // redis-py comes pinned in .venv (scripts/test-deps.sh, which .ci/run
    // runs); a missing .venv fails here with that script's name.
    let python = crate::support::python();
    let prefix = harness::prefix();
    let key = format!("{prefix}:jobs");
    let proxy = harness::start(
        &pool,
        &prefix,
        vec![harness::route("jobs", &key, Phase::DualWrite)],
    )
    .await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/redis_py_push.py"
    );
    let port = proxy.addr.port().to_string();
    let output = tokio::task::spawn_blocking({
        let key = key.clone();
        move || {
            Command::new(&python)
                .args([script, &port, &key, "py", "90"])
                .output()
        }
    })
    .await
    .expect("join")
    .expect("the .venv python runs");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "pushed 90");
    harness::wait_for_jobs(&pool, "jobs", 90).await;
    let jobs = harness::jobs(&pool, "jobs").await;
    let mut keys: Vec<String> = jobs.iter().map(|j| j.0.clone()).collect();
    let mut expected: Vec<String> = (0..90).map(|i| format!("py-{i}")).collect();
    keys.sort();
    expected.sort();
    assert_eq!(keys, expected);
    assert!(jobs.iter().all(|(_, copy, _)| copy == "mirror"));
    proxy.stop().await;
}
