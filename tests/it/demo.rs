//! `qbridge demo` end to end through the binary, on the machine's servers
//! (it makes its own database and Redis keys): every phase, the planted
//! discrepancy caught and repaired, nothing lost, nothing run twice; and
//! `--framework sidekiq|celery|rq`, with the framework's own fleet on the
//! Redis side.

use std::time::Duration;

#[tokio::test]
async fn the_demo_walks_every_phase_and_loses_nothing() {
    let out = tokio::time::timeout(
        Duration::from_secs(240),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
            .args(["demo", "--json", "--step", "2s"])
            .args([
                "--database-url",
                "postgres://postgres@127.0.0.1:5432/postgres",
            ])
            .args(["--redis-url", "redis://127.0.0.1:6379"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the demo finishes")
    .expect("the demo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    let s = &report["summary"];
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(s["lost"], 0, "{report}");
    assert_eq!(s["duplicates"], 0, "{report}");
    assert_eq!(s["planted_caught"], true, "{report}");
    assert_eq!(s["planted_repaired"], true, "{report}");
    assert_eq!(s["run_live"], s["produced"], "{report}");
    assert!(s["shadow_calls"].as_u64().unwrap() > 0, "{report}");
    let phases: Vec<&str> = s["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(
        phases,
        [
            "redis_only",
            "dual_write",
            "shadow",
            "postgres_only",
            "shadow",
            "postgres_only",
            "decommissioned"
        ]
    );
    // The people's lines went to stderr; every phase is named there.
    for line in ["== dual_write", "== shadow", "== decommissioned", "diff:"] {
        assert!(stderr.contains(line), "{line}: {stderr}");
    }
}

/// One fleet drill at a time: each runs a fleet, a runner, producers and a
/// qbridge process on the machine's two cores, and its gates judge timing
/// (Postgres lag, quiet periods); four at once left some gate short of its
/// numbers under the rest of the suite's load, and the drill forced it.
static ONE_DRILL_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `qbridge demo --framework F --json` through the binary: the framework's
/// own client and worker (Sidekiq 6.4 from Debian or 7.3.10 from
/// `vendor/ruby` with `extra` = `--ruby-lib vendor/ruby`, Celery and RQ from
/// the test virtualenv; `extra` also takes `--key-prefix`, ...) on the Redis side, scheduled jobs included; returns
/// the summary after checking what holds for every framework.
async fn fleet_demo(framework: &str, extra: &[&str]) -> serde_json::Value {
    let _turn = ONE_DRILL_AT_A_TIME.lock().await;
    let python = crate::support::python();
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["demo", "--json", "--step", "3s", "--framework", framework])
            .args(extra)
            .arg("--python")
            .arg(&python)
            .args([
                "--database-url",
                "postgres://postgres@127.0.0.1:5432/postgres",
            ])
            .args(["--redis-url", "redis://127.0.0.1:6379"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the demo finishes")
    .expect("the demo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{framework}: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    let s = report["summary"].clone();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(s["framework"], framework, "{report}");
    assert_eq!(s["lost"], 0, "{report}");
    assert_eq!(s["duplicates"], 0, "{report}");
    assert_eq!(s["run_live"], s["produced"], "{report}");
    assert_eq!(s["scheduled"], 15, "{report}");
    // Both sides ran jobs live: the fleet before the flip, Postgres after.
    assert!(s["ran_on_redis"].as_u64().unwrap() > 0, "{report}");
    assert!(s["ran_on_postgres"].as_u64().unwrap() > 0, "{report}");
    assert!(s["shadow_calls"].as_u64().unwrap() > 0, "{report}");
    // Every fifth job's task failed its first attempt, on either side, and
    // was retried by the framework or by qbridge through the runner.
    assert!(s["failed_first_attempts"].as_u64().unwrap() > 0, "{report}");
    // Every gate passed on its measured numbers.
    assert_eq!(s["forced_advances"], 0, "{report}");
    let phases: Vec<&str> = s["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(
        phases,
        [
            "redis_only",
            "dual_write",
            "shadow",
            "postgres_only",
            "shadow",
            "postgres_only",
            "decommissioned"
        ]
    );
    s
}

#[tokio::test]
async fn the_sidekiq_6_fleet_demo_walks_every_phase_and_loses_nothing() {
    let s = fleet_demo("sidekiq", &[]).await;
    assert!(
        s["framework_version"].as_str().unwrap().starts_with("6.4."),
        "{s}"
    );
}

#[tokio::test]
async fn the_sidekiq_7_fleet_demo_walks_every_phase_and_loses_nothing() {
    let s = fleet_demo("sidekiq", &["--ruby-lib", "vendor/ruby"]).await;
    assert_eq!(s["framework_version"], "7.3.10", "{s}");
}

#[tokio::test]
async fn the_celery_fleet_demo_walks_every_phase_and_loses_nothing() {
    fleet_demo("celery", &[]).await;
}

#[tokio::test]
async fn the_rq_fleet_demo_walks_every_phase_and_loses_nothing() {
    fleet_demo("rq", &[]).await;
}

/// A Sidekiq the drill was not run on (here a library that says it is 8.0)
/// and a `--ruby-lib` without Sidekiq are refused in one line naming what
/// to install or give.
#[tokio::test]
async fn the_sidekiq_demo_refuses_a_sidekiq_it_was_not_run_on() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("sidekiq-8.0.8/lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(dir.path().join("sidekiq-8.0.8/bin")).unwrap();
    std::fs::write(
        lib.join("sidekiq.rb"),
        "module Sidekiq; VERSION = \"8.0.8\"; end\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("sidekiq-8.0.8/bin/sidekiq"), "").unwrap();
    let cases = [
        (
            dir.path().to_string_lossy().into_owned(),
            "needs Ruby with Sidekiq 6 or 7",
        ),
        (
            format!("{}/adapters/ruby/lib", env!("CARGO_MANIFEST_DIR")),
            "holds no sidekiq.rb",
        ),
    ];
    for (ruby_lib, says) in cases {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
            .args(["demo", "--framework", "sidekiq", "--ruby-lib", &ruby_lib])
            .args([
                "--database-url",
                "postgres://postgres@127.0.0.1:5432/postgres",
            ])
            .args(["--redis-url", "redis://127.0.0.1:6379"])
            .output()
            .await
            .expect("the demo runs");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{says}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }
}

/// kombu's `global_keyprefix` and `priority_steps` changed on the fleet,
/// and stated on the route (`key_prefix`, `priority_steps`): the route finds
/// the prefixed lists and `unacked` hash (the decommission gate waits for
/// the countdown tasks a worker holds there), nothing lost or run twice.
#[tokio::test]
async fn the_celery_fleet_demo_with_a_key_prefix_and_priority_steps_loses_nothing() {
    fleet_demo(
        "celery",
        &["--key-prefix", "app1:", "--priority-steps", "0,5,9"],
    )
    .await;
}

/// RQ 3's `RQ_KEY_PREFIX` on the fleet and the route's `key_prefix`: the
/// mirror reads the prefixed job hashes (the runner runs them), the gate the
/// prefixed scheduled registry.
#[tokio::test]
async fn the_rq_fleet_demo_with_a_key_prefix_loses_nothing() {
    fleet_demo("rq", &["--key-prefix", "app1"]).await;
}

#[tokio::test]
async fn the_fleet_demo_says_what_to_install_when_the_framework_is_missing() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
        .args([
            "demo",
            "--framework",
            "celery",
            "--python",
            "/nonexistent/python",
        ])
        .args([
            "--database-url",
            "postgres://postgres@127.0.0.1:5432/postgres",
        ])
        .args(["--redis-url", "redis://127.0.0.1:6379"])
        .output()
        .await
        .expect("the demo runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("needs /nonexistent/python with Celery 5")
            && stderr.contains("pip install"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}
