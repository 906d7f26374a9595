//! Bad input: every refusal is a clear one-line error, and nothing already
//! stored is lost or half-written.

use qbridge::config::{Config, Overrides};
use qbridge::queue::enqueue::{enqueue, enqueue_many};
use qbridge::queue::validate;
use qbridge::queue::NewJob;
use qbridge::Error;
use serde_json::json;
use sqlx::PgPool;

use crate::support::{self, LIMIT};

/// Snapshot of the hot table, to prove a refused call changed nothing.
async fn snapshot(pool: &PgPool) -> Vec<(i64, String, serde_json::Value)> {
    sqlx::query_as("SELECT id, queue, payload FROM qbridge.jobs ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn invalid_queue_names_are_refused_and_nothing_is_written(pool: PgPool) {
    support::enqueue_ids(&pool, &support::plain_jobs("existing", 3)).await;
    let before = snapshot(&pool).await;
    let long = "x".repeat(129);
    for bad in [
        "",
        "has space",
        "semi;colon",
        "drop'table",
        "ünï",
        "new\nline",
        long.as_str(),
    ] {
        // A bad name anywhere in the batch refuses the whole batch.
        let jobs = vec![
            NewJob::new("good", json!(1)),
            NewJob::new(bad, json!(2)),
            NewJob::new("good", json!(3)),
        ];
        let err = enqueue_many(&pool, &jobs, LIMIT).await.unwrap_err();
        assert!(matches!(err, Error::InvalidQueueName(_)), "{bad:?}: {err}");
        let text = err.to_string();
        assert!(text.contains("invalid queue name"), "{text}");
        assert!(!text.contains('\n'), "{text}");
        assert_eq!(snapshot(&pool).await, before, "{bad:?} wrote something");
    }
    // The limits themselves are accepted.
    let ok = "a.b:c-d_E9".to_string() + &"x".repeat(118);
    assert_eq!(ok.len(), 128);
    enqueue_many(&pool, &[NewJob::new(ok, json!(1))], LIMIT)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn bad_payloads_are_refused_and_nothing_is_written(pool: PgPool) {
    support::enqueue_ids(&pool, &support::plain_jobs("existing", 3)).await;
    let before = snapshot(&pool).await;

    for text in ["{not json", "", "{\"a\":1", "undefined", "{'single': 1}"] {
        let err = validate::payload_text(text, LIMIT).unwrap_err();
        assert!(matches!(err, Error::PayloadNotJson(_)), "{text:?}: {err}");
        assert!(err.to_string().contains("not valid JSON"), "{err}");
    }
    assert_eq!(
        validate::payload_text(" {\"a\": [1, 2]} ", LIMIT).unwrap(),
        json!({"a": [1, 2]})
    );

    // Over the limit, as text and as a value in an enqueue batch.
    let big = json!({ "blob": "x".repeat(2000) });
    let err = validate::payload_text(&big.to_string(), 1024).unwrap_err();
    assert!(
        matches!(err, Error::PayloadTooLarge { limit: 1024, .. }),
        "{err}"
    );
    let jobs = vec![
        NewJob::new("q", json!({"small": true})),
        NewJob::new("q", big),
    ];
    let err = enqueue_many(&pool, &jobs, 1024).await.unwrap_err();
    assert!(
        matches!(err, Error::PayloadTooLarge { limit: 1024, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("payload_limit"),
        "the error should say what to do: {err}"
    );

    // On the caller's transaction: the refusal writes nothing, and the
    // transaction is still usable.
    let mut tx = pool.begin().await.unwrap();
    let err = enqueue(
        &mut tx,
        &[NewJob::new("q", json!({"blob": "y".repeat(5000)}))],
        1024,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::PayloadTooLarge { .. }));
    enqueue(&mut tx, &[NewJob::new("q", json!(1))], 1024)
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    // A bad max_attempts is refused too.
    let err = enqueue_many(
        &pool,
        &[NewJob::new("q", json!(1)).with_max_attempts(0)],
        LIMIT,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("max_attempts"), "{err}");

    assert_eq!(snapshot(&pool).await, before);
}

/// jsonb refuses U+0000 and text columns refuse NUL; keys, lock keys and
/// kinds are capped. Each is refused before the insert, on one line that shows
/// neither the payload nor the value, and nothing is written.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn nul_characters_and_long_fields_are_refused_before_anything_is_written(pool: PgPool) {
    support::enqueue_ids(&pool, &support::plain_jobs("existing", 3)).await;
    let before = snapshot(&pool).await;
    let long = "k".repeat(validate::MAX_FIELD_LEN + 1);
    let cases: Vec<(NewJob, &str)> = vec![
        (NewJob::new("q", json!({"name": "pri\u{0}vate"})), "NUL"),
        (NewJob::new("q", json!({"pri\u{0}vate": 1})), "NUL"),
        (NewJob::new("q", json!([[{"a": ["pri\u{0}vate"]}]])), "NUL"),
        (NewJob::new("q", json!({})).with_key("pri\u{0}vate"), "NUL"),
        (NewJob::new("q", json!({})).with_key(long.clone()), "key"),
        (
            NewJob::new("q", json!({})).with_lock_key(long.clone()),
            "lock_key",
        ),
        (NewJob::new("q", json!({})).with_kind(long.clone()), "kind"),
    ];
    for (bad, what) in cases {
        let jobs = vec![NewJob::new("q", json!(1)), bad];
        let err = enqueue_many(&pool, &jobs, LIMIT).await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{what}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains(what), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        assert!(
            !msg.contains("pri") && !msg.contains("kkkk"),
            "a value leaked: {msg}"
        );
        assert_eq!(
            snapshot(&pool).await,
            before,
            "{what}: something was written"
        );
    }
    // At the limit is fine.
    let max = "k".repeat(validate::MAX_FIELD_LEN);
    support::enqueue_ids(
        &pool,
        &[NewJob::new("q", json!({}))
            .with_key(max.clone())
            .with_lock_key(max.clone())
            .with_kind(max)],
    )
    .await;
}

fn config_err(text: &str) -> String {
    let Err(err) = Config::from_toml(text, &Overrides::default()) else {
        panic!("{text:?} was accepted");
    };
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    let msg = err.to_string();
    assert!(!msg.contains('\n'), "config error spans lines: {msg}");
    msg
}

#[test]
fn bad_config_errors_name_the_key() {
    let pool = "[[pools]]\nqueues = [\"a\"]\nhandler = { type = \"noop\" }\n";
    let cases: Vec<(String, &str)> = vec![
        ("colour = \"blue\"".into(), "colour"),
        (format!("{pool}concurency = 3"), "concurency"),
        (format!("{pool}concurrency = \"ten\""), "concurrency"),
        (format!("{pool}lease = \"10 parsecs\""), "lease"),
        ("max_connections = \"many\"".into(), "max_connections"),
        ("[http]\nport = 1".into(), "port"),
        ("[history]\nretention_days = -1".into(), "retention_days"),
        (
            "[[pools]]\nqueues = [\"a\"]\nhandler = { type = \"http\", url = \"http://x/\", colour = 1 }".into(),
            "colour",
        ),
        (
            "[[pools]]\nqueues = [\"a\"]\nhandler = { type = \"command\", program = \"/bin/true\", timout = \"1s\" }"
                .into(),
            "timout",
        ),
        ("[[pools]]\nqueues = [\"a\"]\nhandler = { type = \"carrier-pigeon\" }".into(), "carrier-pigeon"),
        ("[[pools]]\nqueues = [\"bad name\"]\nhandler = { type = \"noop\" }".into(), "bad name"),
        (format!("{pool}concurrency = 0"), "concurrency"),
        ("[[schedules]]\nname = \"s\"\nqueue = \"a\"\ncron = \"every tuesday\"".into(), "cron"),
        ("[[schedules]]\nname = \"s\"\nqueue = \"a\"".into(), "every"),
        ("payload_limit = \"lots\"".into(), "payload_limit"),
    ];
    for (text, key) in cases {
        let msg = config_err(&text);
        assert!(
            msg.contains(key),
            "error for {text:?} does not name {key:?}: {msg}"
        );
    }
}

/// An unknown key next to `type = "noop"` must be refused like any other
/// unknown key (serde ignores them beside a unit variant's tag, which is why
/// `HandlerConfig::Noop` is a struct variant).
#[test]
fn unknown_key_beside_noop_handler_is_an_error() {
    let msg = config_err("[[pools]]\nqueues = [\"a\"]\nhandler = { type = \"noop\", url = \"x\" }");
    assert!(msg.contains("url"), "{msg}");
}

#[tokio::test]
async fn unreachable_database_error_hides_the_password() {
    let err = qbridge::db::connect("postgres://postgres:secret@127.0.0.1:1/x", 2)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(!msg.contains("secret"), "password leaked: {msg}");
    assert!(
        msg.contains("127.0.0.1:1"),
        "the error should name the server: {msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");
    let debug = format!("{err:?}");
    assert!(
        !debug.contains("secret"),
        "password leaked in Debug: {debug}"
    );
}

/// A URL that does not parse must not be echoed with its password either.
#[tokio::test]
async fn unparseable_database_url_error_hides_the_password() {
    let err = qbridge::db::connect("postgres://postgres:secret@127.0.0.1:notaport/x", 2)
        .await
        .unwrap_err();
    assert!(
        !err.to_string().contains("secret"),
        "password leaked: {err}"
    );
}

/// `qbridge enqueue` with a malformed `--run-at` or `--delay`, a file with a
/// bad line, or queue names with quotes, semicolons, unicode, spaces or `*`:
/// one line on stderr naming the flag or line, a failed exit, nothing stored.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_cli_refuses_bad_times_files_and_names_and_stores_nothing(pool: PgPool) {
    support::enqueue_ids(&pool, &support::plain_jobs("existing", 2)).await;
    let before = snapshot(&pool).await;
    let url = support::db_url(&pool);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "{\"a\":1}\n{\"a\":\n{\"a\":3}\n").unwrap();
    let path = file.path().to_string_lossy().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--run-at", "tomorrow", "{}"],
            "--run-at \"tomorrow\" is not an RFC 3339 time",
        ),
        (vec!["--run-at", "2026-13-01T00:00:00Z", "{}"], "--run-at"),
        (vec!["--run-at", "2026-11-21T18:00:00", "{}"], "--run-at"),
        (vec!["--run-at", "", "{}"], "--run-at"),
        (
            vec!["--delay", "5 parsecs", "{}"],
            "--delay \"5 parsecs\" is not a duration",
        ),
        (vec!["--delay=-5s", "{}"], "--delay"),
        (vec!["--delay", "99999999999999999999d", "{}"], "--delay"),
        (vec!["--file", &path], "line 2: "),
    ];
    for (extra, expected) in cases {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
            .args(["enqueue", "--database-url", &url, "--queue", "q"])
            .args(&extra)
            .env("QBRIDGE_LOG_FORMAT", "text")
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = support::last_line(&stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(last.contains(expected), "{extra:?}: {stderr}");
    }
    for queue in ["a\"b", "a;b", "émails", "a b", "a*"] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
            .args(["enqueue", "--database-url", &url, "--queue", queue, "{}"])
            .output()
            .await
            .unwrap();
        assert!(!out.status.success(), "queue {queue:?} was accepted");
    }
    assert_eq!(snapshot(&pool).await, before);
}
