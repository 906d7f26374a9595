//! The schema check behind `/readyz`, `qbridge stats` and friends: only a
//! schema that is missing or old says "run qbridge migrate"; a database that
//! cannot be reached says so instead.

use std::time::Duration;

use qbridge::Error;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// A database that was never migrated: no `_sqlx_migrations` table (42P01).
#[sqlx::test(migrations = false)]
async fn unmigrated_database_is_schema_not_current(pool: PgPool) {
    let err = qbridge::db::check_schema(&pool).await.unwrap_err();
    assert!(matches!(err, Error::SchemaNotCurrent), "{err:?}");
    assert!(err.to_string().contains("qbridge migrate"), "{err}");
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn migrated_database_passes(pool: PgPool) {
    qbridge::db::check_schema(&pool).await.unwrap();
}

/// Migrations recorded, but the `qbridge` schema dropped since.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn dropped_schema_is_schema_not_current(pool: PgPool) {
    sqlx::query("DROP SCHEMA qbridge CASCADE")
        .execute(&pool)
        .await
        .unwrap();
    let err = qbridge::db::check_schema(&pool).await.unwrap_err();
    assert!(matches!(err, Error::SchemaNotCurrent), "{err:?}");
}

/// Nothing listens on port 1: the advice must not be "run qbridge migrate".
#[tokio::test]
async fn unreachable_database_is_a_database_error() {
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://postgres:s3cret@127.0.0.1:1/x")
        .unwrap();
    let err = qbridge::db::check_schema(&pool).await.unwrap_err();
    assert!(matches!(err, Error::Db(_)), "{err:?}");
    let msg = err.to_string();
    assert!(!msg.contains("migrate"), "{msg}");
    assert!(!msg.contains("s3cret"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
}

/// The same through `/readyz`.
#[tokio::test]
async fn readyz_does_not_blame_the_schema_when_postgres_is_down() {
    let db = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://postgres@127.0.0.1:1/x")
        .unwrap();
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let app = qbridge::http::router(qbridge::http::AppState::new(db, prometheus));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let resp = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let body = resp.text().await.unwrap();
    assert!(body.starts_with("not ready\npostgres: database"), "{body}");
    assert!(!body.contains("migrate"), "{body}");
}

/// A newer qbridge migrated ahead of this one (a rolling deploy half-way):
/// the old binary refuses to start, in one line, instead of running against
/// tables it does not know.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_schema_newer_than_the_binary_is_refused_in_one_line(pool: PgPool) {
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99990101, 'from a newer qbridge', true, '\\x00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let err = qbridge::db::check_schema(&pool).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::SchemaNewer {
                applied: 99990101,
                ..
            }
        ),
        "{err:?}"
    );
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        cfg.path(),
        "[http]\nlisten = \"127.0.0.1:0\"\n[[pools]]\nqueues = [\"q\"]\nhandler = { type = \"noop\" }\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
        .args([
            "run",
            "--database-url",
            &crate::support::db_url(&pool),
            "--config",
        ])
        .arg(cfg.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let line = crate::support::last_stderr_line(&out);
    assert!(line.contains("newer than this qbridge"), "{line}");
    assert!(line.contains("99990101"), "{line}");
}
