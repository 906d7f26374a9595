//! The least-privilege setup of `sql/roles.sql`: the migration role creates
//! the schema; the runtime role enqueues, runs and inspects jobs (and a
//! route's phase flag) through the real binary, and can create or drop
//! nothing. Roles are cluster-wide, so this test names its own and drops
//! them with its own database.

use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::support::qbridge;

const ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres";

async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .expect("connects")
}

/// A database of the test's own with `sql/roles.sql` run on it, the roles
/// named apart (roles are cluster-wide) and dropped with it.
struct Roles {
    admin: PgPool,
    on_db: PgPool,
    db: String,
    migrator: String,
    runtime: String,
    reporter: String,
}

impl Roles {
    async fn create(prefix: &str) -> Roles {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
        let db = format!("{prefix}_{id}");
        let (migrator, runtime, reporter) = (
            format!("qbridge_migrator_{id}"),
            format!("qbridge_runtime_{id}"),
            format!("qbridge_reporter_{id}"),
        );
        let admin = pool(ADMIN).await;
        sqlx::query(&format!("CREATE DATABASE {db}"))
            .execute(&admin)
            .await
            .unwrap();
        let on_db = pool(&format!("postgres://postgres@127.0.0.1:5432/{db}")).await;
        let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/roles.sql"))
            .unwrap()
            .replace("qbridge_migrator", &migrator)
            .replace("qbridge_runtime", &runtime)
            .replace("qbridge_reporter", &reporter);
        sqlx::raw_sql(&script)
            .execute(&on_db)
            .await
            .expect("roles.sql");
        Roles {
            admin,
            on_db,
            db,
            migrator,
            runtime,
            reporter,
        }
    }

    async fn drop(self) {
        self.on_db.close().await;
        sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", self.db))
            .execute(&self.admin)
            .await
            .unwrap();
        for role in [&self.reporter, &self.runtime, &self.migrator] {
            sqlx::query(&format!("DROP ROLE {role}"))
                .execute(&self.admin)
                .await
                .unwrap();
        }
        self.admin.close().await;
    }
}

#[tokio::test]
async fn the_runtime_role_runs_jobs_and_can_change_no_schema() {
    let Roles {
        admin,
        on_db,
        db,
        migrator,
        runtime,
        reporter,
    } = Roles::create("qb_roles").await;
    let id = &db[db.len() - 10..];
    let as_migrator = format!("postgres://{migrator}@127.0.0.1:5432/{db}");
    let as_runtime = format!("postgres://{runtime}@127.0.0.1:5432/{db}");

    let out = qbridge(&["migrate", "--database-url", &as_migrator]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = qbridge(&[
        "enqueue",
        "--database-url",
        &as_runtime,
        "--queue",
        "q",
        r#"{"a":1}"#,
        r#"{"a":2}"#,
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // `qbridge run` as the runtime: a pool, and a route (its phase flag is
    // registered, read and watched).
    let cfg = tempfile::NamedTempFile::new().unwrap();
    let port = crate::servers::free_port();
    std::fs::write(
        cfg.path(),
        format!(
            "[http]\nlisten = \"127.0.0.1:{port}\"\n[[pools]]\nqueues = [\"q\"]\nhandler = {{ type = \"noop\" }}\npoll_interval = \"100ms\"\n\
             [[routes]]\nname = \"r{id}\"\nredis_key = \"qbt:{id}:roles\"\nqueue = \"r{id}\"\nformat = \"raw\"\nphase = \"postgres_only\"\n"
        ),
    )
    .unwrap();
    let mut run = crate::support::spawn_run(&as_runtime, cfg.path());
    let started = Instant::now();
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs")
            .fetch_one(&on_db)
            .await
            .unwrap();
        if left == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "jobs ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = crate::support::sigterm_and_wait(&mut run).await;
    assert!(status.success(), "qbridge run as the runtime role");
    for args in [
        vec!["stats"],
        vec!["dlq", "list"],
        vec!["cutover", "status"],
    ] {
        let mut full = args.clone();
        full.extend(["--database-url", &as_runtime, "--config"]);
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
            .args(&full)
            .arg(cfg.path())
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // No DDL for the runtime.
    let rt = pool(&as_runtime).await;
    for ddl in [
        "CREATE TABLE qbridge.intruder (i int)",
        "DROP TABLE qbridge.jobs",
        "ALTER TABLE qbridge.jobs ADD COLUMN x int",
        "TRUNCATE qbridge.jobs_dead",
    ] {
        let err = sqlx::query(ddl).execute(&rt).await.unwrap_err();
        assert!(
            err.to_string().contains("permission denied")
                || err.to_string().contains("must be owner"),
            "{ddl}: {err}"
        );
    }
    rt.close().await;
    Roles {
        admin,
        on_db,
        db,
        migrator,
        runtime,
        reporter,
    }
    .drop()
    .await;
}

/// `sql/roles.sql`'s reporter role: what a fleet's SQL reporting connects
/// as. It can report outcomes through `qbridge.report_outcome` and nothing
/// else: no table to read or write (the runtime role's full DML was what
/// SQL reporting needed before).
#[tokio::test]
async fn the_reporter_role_reports_outcomes_and_reads_or_writes_no_table() {
    let roles = Roles::create("qb_rep").await;
    let (on_db, db, migrator, reporter) =
        (&roles.on_db, &roles.db, &roles.migrator, &roles.reporter);
    let out = qbridge(&[
        "migrate",
        "--database-url",
        &format!("postgres://{migrator}@127.0.0.1:5432/{db}"),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let rep = pool(&format!("postgres://{reporter}@127.0.0.1:5432/{db}")).await;
    let id: i64 =
        sqlx::query_scalar("SELECT qbridge.report_outcome('emails', 'jid-1', 'ok', 'sent')")
            .fetch_one(&rep)
            .await
            .expect("the reporter reports");
    assert!(id > 0);
    let stored: (String, String, String) =
        sqlx::query_as("SELECT key, side, outcome FROM qbridge.outcomes WHERE id = $1")
            .bind(id)
            .fetch_one(on_db)
            .await
            .unwrap();
    assert_eq!(stored, ("jid-1".into(), "redis".into(), "ok".into()));
    for sql in [
        "SELECT count(*) FROM qbridge.outcomes",
        "SELECT count(*) FROM qbridge.jobs",
        "INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome) VALUES ('q', 'k', 'redis', 'live', 'ok')",
        "DELETE FROM qbridge.held_repushes",
        "UPDATE qbridge.route_phases SET phase = 'decommissioned'",
    ] {
        let err = sqlx::query(sql).execute(&rep).await.unwrap_err();
        assert!(err.to_string().contains("permission denied"), "{sql}: {err}");
    }
    // Bad input is still a one-line refusal, not a stored row.
    let err = sqlx::query("SELECT qbridge.report_outcome('emails', 'jid-2', 'maybe')")
        .execute(&rep)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("outcome must be ok, failed, dead or skipped"),
        "{err}"
    );
    rep.close().await;
    roles.drop().await;
}
