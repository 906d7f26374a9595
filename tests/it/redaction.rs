//! Secrets and payloads never reach the binary's output: a password planted in
//! the database and Redis URLs, and a marker planted in job payloads and Redis
//! list items, are absent from everything `qbridge` prints (stdout and stderr,
//! text and JSON logs), while the logs show that work and failures happened.

use std::process::{Output, Stdio};
use std::time::Duration;

use ::redis::AsyncCommands;
use sqlx::PgPool;
use tokio::process::Command;

use crate::support;

const DB_PW: &str = "PlantedPw-7f3a";
const REDIS_PW: &str = "PlantedRedisPw-9c1";
const PAYLOAD: &str = "PlantedPayload-e41b";
/// What the failing command handler writes to its stderr (it goes to
/// `last_error` in the database, never to the log).
const HANDLER_STDERR: &str = "PlantedStderr-5d2c";
const REDIS: &str = "redis://127.0.0.1:6379";

/// The test database's URL with the planted password (trust auth ignores it).
fn db_url(pool: &PgPool) -> String {
    format!(
        "postgres://postgres:{DB_PW}@127.0.0.1:5432/{}",
        support::db_name(pool)
    )
}

/// The binary, away from the caller's QBRIDGE_* and RUST_LOG settings.
pub(crate) fn qbridge(log_format: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qbridge"));
    cmd.args(["--log-format", log_format])
        .args(args)
        .env_remove("QBRIDGE_DATABASE_URL")
        .env_remove("QBRIDGE_CONFIG")
        .env_remove("QBRIDGE_HTTP_LISTEN")
        .env_remove("QBRIDGE_REDIS_URL")
        .env_remove("QBRIDGE_PROXY_LISTEN")
        .env_remove("QBRIDGE_LOG_FORMAT")
        .env_remove("QBRIDGE_ADMIN_TOKEN")
        .env_remove("QBRIDGE_REPORT_TOKEN")
        .env_remove("QBRIDGE_ENQUEUE_TOKEN")
        .env_remove("QBRIDGE_PROXY_PASSWORD")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs a short command to completion (30 s at most).
async fn output(log_format: &str, args: &[&str]) -> Output {
    let run = qbridge(log_format, args).output();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap_or_else(|_| panic!("qbridge {args:?} did not finish"))
        .expect("qbridge runs")
}

/// stdout and stderr, labelled, as one text.
fn all_output(out: &Output) -> String {
    format!(
        "--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Panics if any secret in `secrets` appears in `text`.
fn assert_clean(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(
            !text.contains(secret),
            "{what}: {secret:?} leaked into the output:\n{text}"
        );
    }
}

/// `migrate`, `enqueue`, `stats` and `dlq list` with a password in the
/// database URL, in text and JSON; then the Redis error paths with a password
/// the shared Redis refuses, and a database that does not answer.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn planted_passwords_never_reach_the_output(pool: PgPool) {
    let url = db_url(&pool);
    let secrets = [DB_PW, REDIS_PW, PAYLOAD];
    let dir = tempfile::tempdir().unwrap();
    let route = format!(
        "redact-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let config = dir.path().join("qbridge.toml");
    std::fs::write(
        &config,
        format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n\
             [[routes]]\nredis_key = \"qbt:{route}:list\"\nqueue = \"{route}\"\nformat = \"raw\"\n\
             phase = \"dual_write\"\nhandler = {{ type = \"noop\" }}\n"
        ),
    )
    .unwrap();
    let config = config.to_string_lossy().to_string();
    let redis_pw = format!("redis://:{REDIS_PW}@127.0.0.1:6379");
    let payload = format!(r#"{{"secret":"{PAYLOAD}"}}"#);

    for fmt in ["text", "json"] {
        for json in [false, true] {
            let flag: &[&str] = if json { &["--json"] } else { &[] };
            let with = |rest: &[&str]| -> Vec<String> {
                let mut v: Vec<String> = flag.iter().map(|s| s.to_string()).collect();
                v.extend(["--database-url".to_string(), url.clone()]);
                v.extend(rest.iter().map(|s| s.to_string()));
                v
            };
            let what = format!("--log-format {fmt} json={json}");
            for args in [
                with(&["migrate"]),
                with(&["enqueue", "--queue", "redact", &payload]),
                with(&["stats"]),
                with(&["dlq", "list"]),
                // stats with routes and a Redis that refuses the password:
                // it still answers (Redis lengths are a bonus).
                with(&["--config", &config, "--redis-url", &redis_pw, "stats"]),
            ] {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let out = output(fmt, &args).await;
                let text = all_output(&out);
                assert!(out.status.success(), "{what} {args:?}: {text}");
                assert_clean(&format!("{what} {args:?}"), &text, &secrets);
            }
        }

        // Commands that need Redis: AUTH fails (the shared Redis has no
        // password), a one-line error names Redis, the password is redacted.
        for args in [
            vec![
                "--database-url",
                &url,
                "--config",
                &config,
                "--redis-url",
                &redis_pw,
                "run",
                "--http-listen",
                "127.0.0.1:0",
            ],
            vec![
                "--database-url",
                &url,
                "--config",
                &config,
                "--redis-url",
                &redis_pw,
                "diff",
                "--route",
                &route,
            ],
        ] {
            let what = format!("--log-format {fmt} {args:?}");
            let out = output(fmt, &args).await;
            let text = all_output(&out);
            assert!(!out.status.success(), "{what}: {text}");
            let line = support::last_stderr_line(&out);
            assert!(line.contains("cannot connect to Redis"), "{what}: {text}");
            assert!(line.contains("***"), "{what}: not redacted: {text}");
            assert_clean(&what, &text, &secrets);
        }

        // A database that does not answer: the error names the URL, redacted.
        let closed = crate::servers::free_port();
        let dead_db = format!("postgres://postgres:{DB_PW}@127.0.0.1:{closed}/x");
        for args in [
            vec!["--database-url", &dead_db, "stats"],
            vec!["--database-url", &dead_db, "migrate"],
            vec!["--json", "--database-url", &dead_db, "dlq", "list"],
        ] {
            let what = format!("--log-format {fmt} {args:?}");
            let out = output(fmt, &args).await;
            let text = all_output(&out);
            assert!(!out.status.success(), "{what}: {text}");
            assert_clean(&what, &text, &secrets);
        }
    }
}

/// One `qbridge run` with failing handlers of every kind (a command that
/// exits 3 after writing to stderr, an HTTP endpoint on a closed port, and a
/// route's Redis consumer running that command) on jobs and a Redis item that
/// carry the payload marker; stopped with SIGTERM once everything is
/// dead-lettered. Returns the run's whole output.
async fn failing_run(pool: &PgPool, log_format: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let tag = &id[..12];
    let (cmd_q, http_q, route) = (
        format!("rd-cmd-{tag}"),
        format!("rd-http-{tag}"),
        format!("rd-route-{tag}"),
    );
    let list = format!("qbt:{route}:list");
    let redis_dead = format!("qbridge:dead:{route}");
    let closed = crate::servers::free_port();
    let handler = format!(
        "{{ type = \"command\", program = \"/bin/sh\", args = [\"-c\", \"cat >/dev/null; echo {HANDLER_STDERR} >&2; exit 3\"], timeout = \"10s\" }}"
    );
    let pool_keys = "concurrency = 2\npoll_interval = \"50ms\"\nbackoff_base = \"10ms\"\nbackoff_cap = \"20ms\"\n";
    let toml = format!(
        "shutdown_deadline = \"2s\"\n\
         [http]\nlisten = \"127.0.0.1:0\"\n\
         [[pools]]\nname = \"cmd\"\nqueues = [\"{cmd_q}\"]\n{pool_keys}handler = {handler}\n\
         [[pools]]\nname = \"http\"\nqueues = [\"{http_q}\"]\n{pool_keys}\
         handler = {{ type = \"http\", url = \"http://127.0.0.1:{closed}/hook\", timeout = \"2s\" }}\n\
         [[routes]]\nredis_key = \"{list}\"\nqueue = \"{route}\"\nformat = \"raw\"\nphase = \"redis_only\"\n\
         handler = {handler}\n\
         [routes.redis_consumer]\nconcurrency = 1\nmax_attempts = 2\nretry_delay = \"10ms\"\nconsumer_name = \"c-{tag}\"\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("qbridge.toml");
    std::fs::write(&config, &toml).unwrap();
    let config = config.to_string_lossy().to_string();
    let url = db_url(pool);

    // Two jobs per pool through the CLI, the marker in each payload.
    let before = support::dead(pool).await;
    for q in [&cmd_q, &http_q] {
        let p1 = format!(r#"{{"secret":"{PAYLOAD}","n":1}}"#);
        let p2 = format!(r#"{{"nested":{{"deep":["{PAYLOAD}"]}},"n":2}}"#);
        let out = output(
            log_format,
            &[
                "--database-url",
                &url,
                "enqueue",
                "--queue",
                q,
                "--max-attempts",
                "2",
                &p1,
                &p2,
            ],
        )
        .await;
        let text = all_output(&out);
        assert!(out.status.success(), "enqueue: {text}");
        assert_clean("enqueue", &text, &[DB_PW, PAYLOAD]);
    }
    let mut redis = ::redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("the shared Redis answers");
    let _: () = redis.del(&[&list, &redis_dead]).await.unwrap();
    let item = format!("raw item {PAYLOAD} end");
    let _: i64 = redis.lpush(&list, &item).await.unwrap();

    let mut child = qbridge(
        log_format,
        &["--database-url", &url, "--config", &config, "run"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("qbridge run starts");

    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let dead = support::dead(pool).await - before;
            let redis_dead_len: i64 = redis.llen(&redis_dead).await.unwrap();
            if dead == 4 && redis_dead_len == 1 {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("qbridge run exited early: {status}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;

    let pid = child.id().expect("still running").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("qbridge run stops after SIGTERM")
        .expect("output");
    let text = all_output(&out);
    let _: () = redis.del(&[&list, &redis_dead]).await.unwrap();
    assert!(
        waited.is_ok(),
        "jobs were not dead-lettered in time; output:\n{text}"
    );
    assert!(out.status.success(), "run after SIGTERM: {text}");

    // The handler's stderr went to the database, so the failures were real.
    let errors: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT last_error FROM qbridge.jobs_dead WHERE queue = $1 OR queue = $2",
    )
    .bind(&cmd_q)
    .bind(&http_q)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(errors.len(), 4, "{errors:?}");
    assert!(
        errors.iter().flatten().any(|e| e.contains(HANDLER_STDERR)),
        "{errors:?}"
    );

    // `dlq list` shows last_error (the handler's own text) but never a payload.
    for json in [false, true] {
        let mut args = vec!["--database-url", url.as_str(), "dlq", "list"];
        if json {
            args.insert(0, "--json");
        }
        let out = output(log_format, &args).await;
        let listed = all_output(&out);
        assert!(out.status.success(), "dlq list: {listed}");
        assert!(listed.contains(&cmd_q), "dlq list: {listed}");
        assert_clean("dlq list", &listed, &[DB_PW, PAYLOAD]);
    }
    text
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn planted_payloads_never_reach_the_logs(pool: PgPool) {
    for fmt in ["text", "json"] {
        let text = failing_run(&pool, fmt).await;
        let what = format!("run --log-format {fmt}");
        assert_clean(&what, &text, &[DB_PW, PAYLOAD, HANDLER_STDERR]);
        for evidence in [
            "will retry",
            "moved to the dead-letter table",
            "redis consumer: item moved to the dead list",
        ] {
            assert!(
                text.contains(evidence),
                "{what}: no {evidence:?} in the output:\n{text}"
            );
        }
        if fmt == "json" {
            let lines: Vec<&str> = text.lines().filter(|l| l.starts_with('{')).collect();
            assert!(!lines.is_empty(), "{what}: no JSON log lines:\n{text}");
        }
    }
}
