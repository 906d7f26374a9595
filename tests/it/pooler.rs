//! Behind PgBouncer in transaction mode: a throwaway pgbouncer (4 server
//! connections, `qbridge::demo::pgbouncer`) in front of the test's
//! database. Clients outnumber server connections, so statements of
//! different clients meet on one server connection, as behind a managed
//! pooler. (The fault suite runs worker kills and terminated backends
//! through one too: `tests/chaos.rs`.)

use std::time::{Duration, Instant};

use qbridge::config::Pooler;
use qbridge::demo::pgbouncer::ThrowawayPgBouncer;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::support::{db_name, last_stderr_line, qbridge};

fn bouncer_for(pool: &PgPool) -> (ThrowawayPgBouncer, String) {
    let bouncer = ThrowawayPgBouncer::start(pool.connect_options().get_port());
    let url = bouncer.url(&db_name(pool));
    (bouncer, url)
}

/// 12 clients × 40 statements, each text distinct per iteration so every
/// client prepares many; returns the errors and the wrong answers (a
/// statement run under another client's name answers for another query).
async fn hammer(pool: &PgPool) -> (Vec<String>, usize) {
    let mut tasks = Vec::new();
    for client in 0..12i64 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let (mut errors, mut wrong) = (Vec::new(), 0);
            for i in 0..40i64 {
                let sql = format!("SELECT $1::bigint + {}", i % 7);
                match sqlx::query_scalar::<_, i64>(&sql)
                    .bind(client * 1000)
                    .fetch_one(&pool)
                    .await
                {
                    Ok(v) if v == client * 1000 + i % 7 => {}
                    Ok(_) => wrong += 1,
                    Err(e) => errors.push(e.to_string()),
                }
            }
            (errors, wrong)
        }));
    }
    let (mut errors, mut wrong) = (Vec::new(), 0);
    for t in tasks {
        let (e, w) = t.await.unwrap();
        errors.extend(e);
        wrong += w;
    }
    (errors, wrong)
}

/// The bug first: sqlx's named statements behind a transaction-mode pooler
/// fail ("prepared statement "sqlx_s_1" already exists" or "does not
/// exist"); with the pooler declared, the same load runs clean and every
/// answer is the one asked for.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn named_statements_break_behind_pgbouncer_and_the_pooler_mode_does_not(pool: PgPool) {
    let (_bouncer, url) = bouncer_for(&pool);
    let named: PgConnectOptions = url
        .parse::<PgConnectOptions>()
        .unwrap()
        .extra_float_digits(None);
    let named = PgPoolOptions::new()
        .max_connections(12)
        .connect_with(named)
        .await
        .unwrap();
    let (errors, wrong) = hammer(&named).await;
    assert!(
        errors.iter().any(|e| e.contains("prepared statement")) || wrong > 0,
        "named statements went through a transaction-mode pooler unharmed: the test cannot tell"
    );
    named.close().await;

    let declared = qbridge::db::connect_via(&url, Pooler::PgbouncerTransaction, 12)
        .await
        .unwrap();
    let (errors, wrong) = hammer(&declared).await;
    assert_eq!(errors, Vec::<String>::new());
    assert_eq!(wrong, 0);
    qbridge::db::check_schema(&declared).await.unwrap();
}

/// Not declared, the pooler's first refusal names the setting, in one line;
/// `migrate` behind it asks for the direct URL instead of taking a session
/// lock it could not release.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_undeclared_pooler_and_a_pooled_migrate_are_one_line_errors(pool: PgPool) {
    let (_bouncer, url) = bouncer_for(&pool);
    let out = qbridge(&["stats", "--database-url", &url]).await;
    assert!(!out.status.success());
    let line = last_stderr_line(&out);
    assert!(
        line.contains("pooler = \"pgbouncer-transaction\""),
        "{line}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim().lines().count(),
        1
    );

    let out = qbridge(&[
        "migrate",
        "--pooler",
        "pgbouncer-transaction",
        "--database-url",
        &url,
    ])
    .await;
    assert!(!out.status.success());
    let line = last_stderr_line(&out);
    assert!(line.contains("[database] direct_url"), "{line}");

    let out = qbridge(&[
        "stats",
        "--pooler",
        "pgbouncer-transaction",
        "--database-url",
        &url,
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `qbridge enqueue` and `qbridge run` through the pooler with no direct
/// URL: no LISTEN, so workers find jobs by polling; failures retry with
/// backoff, a job that always fails is dead-lettered after its attempts,
/// and `/readyz` says how workers are woken.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_worker_behind_pgbouncer_retries_and_dead_letters_by_polling(pool: PgPool) {
    let (_bouncer, url) = bouncer_for(&pool);
    let mut payloads: Vec<String> = (0..20).map(|i| format!(r#"{{"n":{i}}}"#)).collect();
    payloads.push(r#"{"fail":"always"}"#.into());
    let mut args = vec![
        "enqueue",
        "--pooler",
        "pgbouncer-transaction",
        "--database-url",
        &url,
        "--queue",
        "pooled",
        "--max-attempts",
        "3",
    ];
    args.extend(payloads.iter().map(String::as_str));
    let out = qbridge(&args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let port = crate::servers::free_port();
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        cfg.path(),
        format!(
            "max_connections = 8\n[history]\nretention_days = 1\n[database]\npooler = \"pgbouncer-transaction\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\
             [[pools]]\nqueues = [\"pooled\"]\nconcurrency = 4\npoll_interval = \"100ms\"\n\
             backoff_base = \"10ms\"\nbackoff_cap = \"50ms\"\n\
             handler = {{ type = \"command\", program = \"/bin/sh\", args = [\"-c\", \"! grep -q always\"] }}\n"
        ),
    )
    .unwrap();
    let mut run = crate::support::spawn_run(&url, cfg.path());
    let started = Instant::now();
    loop {
        let left = crate::support::jobs(&pool).await;
        if left == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{left} jobs left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(ready.starts_with("ready\n"), "{ready}");
    assert!(
        ready.contains("pooler pgbouncer-transaction; wake-ups polling only"),
        "{ready}"
    );
    let status = crate::support::sigterm_and_wait(&mut run).await;
    assert!(status.success());
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM qbridge.jobs_done WHERE queue = 'pooled'")
            .fetch_one(&pool)
            .await
            .unwrap();
    let dead: Vec<(serde_json::Value, i32)> =
        sqlx::query_as("SELECT payload, attempts FROM qbridge.jobs_dead WHERE queue = 'pooled'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(done, 20);
    assert_eq!(dead, vec![(serde_json::json!({"fail": "always"}), 3)]);
}

/// The diff gauges' leader lock through the pooler: transaction-scoped, so
/// it is released on the server connection that took it. (A session lock
/// taken on one server connection and "released" on another would leave
/// the pass leaderless for good.) Three passes in a row each lead; while
/// another transaction holds the lock, a pass does not.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_diff_gauges_leader_lock_holds_and_releases_behind_pgbouncer(pool: PgPool) {
    let (_bouncer, url) = bouncer_for(&pool);
    let pooled = qbridge::db::connect_via(&url, Pooler::PgbouncerTransaction, 8)
        .await
        .unwrap();
    let config = qbridge::config::Config::from_toml(
        "[[routes]]\nname = \"gauged\"\nredis_key = \"qbt:pooler:gauged\"\nqueue = \"gauged\"\n\
         format = \"raw\"\nphase = \"dual_write\"\n",
        &Default::default(),
    )
    .unwrap();
    let routes = qbridge::routes::Routes::from_config(&config.routes);
    let mut redis = qbridge::redis::connect::connect_redis("redis://127.0.0.1:6379")
        .await
        .unwrap();
    for pass in 0..3 {
        let led = qbridge::ops::diff_metrics::publish_once(&pooled, &mut redis, &routes)
            .await
            .unwrap();
        assert!(led, "pass {pass} found the lock taken");
    }
    let mut holder = pooled.begin().await.unwrap();
    let held = qbridge::queue::leader::try_lead(&mut holder, qbridge::queue::leader::DIFF_GAUGES)
        .await
        .unwrap()
        .expect("free");
    let led = qbridge::ops::diff_metrics::publish_once(&pooled, &mut redis, &routes)
        .await
        .unwrap();
    assert!(!led, "two leaders at once");
    held.done();
    holder.rollback().await.unwrap();
    let led = qbridge::ops::diff_metrics::publish_once(&pooled, &mut redis, &routes)
        .await
        .unwrap();
    assert!(led, "the lock was not released");
}
