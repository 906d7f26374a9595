//! The `qbridge` binary as scripts see it: `--json` output is one JSON object
//! on stdout, and an error under `--json` is one JSON line on stderr with a
//! non-zero exit code.

use std::time::Duration;

use qbridge::queue::{fence, NewJob};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::support;
use crate::support::qbridge;

/// Runs the binary with `args`, away from the caller's QBRIDGE_* settings.

#[tokio::test]
async fn json_errors_are_one_json_line_on_stderr() {
    let out = qbridge(&["--json", "enqueue", "--queue", "bad name", "{}"]).await;
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    let line = support::last_stderr_line(&out);
    let v: Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("stderr is not one JSON line ({e}): {line}"));
    let msg = v["error"].as_str().expect("an error field");
    assert!(msg.contains("invalid queue name"), "{msg}");
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");

    // Without --json: plain text, same exit code.
    let out = qbridge(&["enqueue", "--queue", "bad name", "{}"]).await;
    assert!(!out.status.success());
    let line = support::last_stderr_line(&out);
    assert!(line.starts_with("error: invalid queue name"), "{line}");
}

/// A payload with U+0000 is refused before connecting, on one line, without
/// echoing the payload.
#[tokio::test]
async fn nul_in_a_payload_is_refused_on_one_line() {
    let out = qbridge(&[
        "--database-url",
        "postgres://postgres:s3cret@127.0.0.1:1/x",
        "enqueue",
        "--queue",
        "q",
        r#"{"name":"pri\u0000vate"}"#,
    ])
    .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("NUL"), "{stderr}");
    assert!(!stderr.contains("pri"), "the payload leaked: {stderr}");
    assert!(!stderr.contains("s3cret"), "the password leaked: {stderr}");
    assert!(
        !stderr.contains("cannot connect"),
        "refused after connecting: {stderr}"
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn dlq_list_json_is_an_object(pool: PgPool) {
    let id = support::enqueue_ids(&pool, &[NewJob::new("mail", json!({"to": "a"}))]).await[0];
    let claimed = support::claim(&pool, "mail", 1, Duration::from_secs(60)).await;
    fence::dead_letter(&pool, &[(claimed[0].job_ref(), "mailbox full".into())])
        .await
        .unwrap();
    let url = support::db_url(&pool);

    let out = qbridge(&["--json", "--database-url", &url, "dlq", "list"]).await;
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    let rows = v["dead_jobs"].as_array().expect("a dead_jobs array");
    assert_eq!(rows.len(), 1, "{v}");
    assert_eq!(rows[0]["id"], json!(id));
    assert_eq!(rows[0]["last_error"], json!("mailbox full"));

    // No match is an empty array, still inside the object.
    let out = qbridge(&[
        "--json",
        "--database-url",
        &url,
        "dlq",
        "list",
        "--queue",
        "other",
    ])
    .await;
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(v, json!({ "dead_jobs": [] }));
}

/// `qbridge proxy` and `qbridge run` with a Redis that does not answer: one
/// line naming Redis, with the password redacted, and a non-zero exit.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_unreachable_redis_is_a_one_line_startup_error(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("routes.toml");
    std::fs::write(
        &config,
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
         [[routes]]\nredis_key = \"k\"\nqueue = \"q\"\nformat = \"raw\"\nphase = \"dual_write\"\nhandler = { type = \"noop\" }\n",
    )
    .unwrap();
    let url = support::db_url(&pool);
    let redis = format!("redis://:hunter2@127.0.0.1:{}", crate::servers::free_port());
    let config = config.to_string_lossy().to_string();
    for command in ["proxy", "run"] {
        let mut args = vec![
            command,
            "--config",
            &config,
            "--database-url",
            &url,
            "--redis-url",
            &redis,
        ];
        if command == "run" {
            args.extend(["--http-listen", "127.0.0.1:0"]);
        }
        let out = qbridge(&args).await;
        assert!(!out.status.success(), "{command}: {out:?}");
        let line = support::last_stderr_line(&out);
        assert!(
            line.contains("cannot connect to Redis"),
            "{command}: {line}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("hunter2"), "{command}: {stderr}");
    }
}

/// `qbridge import`: what waited in the list before mirroring becomes mirror
/// copies once (a second run finds nothing new), as one JSON object; a
/// route in `redis_only` and an unknown route are one-line refusals.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn import_copies_the_backlog_once_and_refuses_on_one_line(pool: PgPool) {
    let list = format!("qbt:import:{}", uuid::Uuid::new_v4().simple());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("routes.toml");
    std::fs::write(
        &config,
        format!(
            "[[routes]]\nname = \"mail\"\nredis_key = \"{list}\"\nqueue = \"mail\"\n\
             format = \"json:/id\"\nphase = \"dual_write\"\n\
             [[routes]]\nname = \"later\"\nredis_key = \"{list}:later\"\nqueue = \"later\"\n\
             format = \"json:/id\"\nphase = \"redis_only\"\n"
        ),
    )
    .unwrap();
    let mut redis = qbridge::redis::connect::connect_redis(crate::exactly_once::REDIS)
        .await
        .unwrap();
    for n in 0..3 {
        let _: i64 = ::redis::cmd("LPUSH")
            .arg(&list)
            .arg(format!(r#"{{"id":"backlog-{n}"}}"#))
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let url = support::db_url(&pool);
    let config = config.to_string_lossy().to_string();
    let base = [
        "--config",
        config.as_str(),
        "--database-url",
        url.as_str(),
        "--redis-url",
        crate::exactly_once::REDIS,
    ];
    let import = |route: &'static str| {
        let mut args = vec!["--json"];
        args.extend(base);
        args.extend(["import", "--route", route]);
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        qbridge(&args).await
    };
    for expected_new in [3, 0] {
        let out = run(import("mail")).await;
        assert!(out.status.success(), "{out:?}");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["structures"][0]["found"], 3, "{report}");
        assert_eq!(report["structures"][0]["new"], expected_new, "{report}");
    }
    let copies: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.jobs WHERE queue = 'mail' AND copy = 'mirror'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(copies, 3);
    for (route, says) in [
        ("later", "advance to dual_write first"),
        ("nope", "no route named"),
    ] {
        let out = run(import(route)).await;
        assert!(!out.status.success(), "{route}: {out:?}");
        let line = support::last_stderr_line(&out);
        assert!(line.contains(says), "{route}: {line}");
    }
    let _: i64 = ::redis::cmd("DEL")
        .arg(&list)
        .query_async(&mut redis)
        .await
        .unwrap();
}
