//! The faults, one per scenario. Each runs while the load does, for about
//! `span`, and returns a note for the table (what it did, what it saw).

use std::time::Duration;

use sqlx::{Connection, Executor, PgConnection};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::load::lpush;
use super::rig::{Rig, LIST};
use crate::error::{Error, Result};
use crate::model::Phase;
use crate::ops::operate::{self, Refusal, Request};
use crate::routes::Route;

/// Backends of qbridge's own processes (the harness marks its own).
const QBRIDGE_BACKENDS: &str = "datname = current_database() AND pid <> pg_backend_pid() \
     AND backend_type = 'client backend' AND application_name <> 'qbridge-chaos'";

/// 1: SIGKILL of a worker mid-batch, five times in a row.
pub async fn kill_worker(rig: &mut Rig, span: Duration) -> Result<String> {
    for _ in 0..5 {
        tokio::time::sleep(span / 6).await;
        rig.workers[0].kill();
        tokio::time::sleep(Duration::from_millis(200)).await;
        rig.restart_worker(0)?;
    }
    Ok("w1 SIGKILLed 5× with batches in flight, restarted at once".into())
}

/// 10: many processes on one database (three `qbridge run`, two proxies):
/// w1 SIGKILLed and left down, w2 stopped gracefully and started again.
pub async fn kill_one_restart_another(rig: &mut Rig, span: Duration) -> Result<String> {
    tokio::time::sleep(span / 3).await;
    rig.workers[0].kill();
    tokio::time::sleep(span / 3).await;
    rig.workers[1].stop();
    rig.restart_worker(1)?;
    tokio::time::sleep(span / 3).await;
    Ok("3 run + 2 proxy processes; w1 SIGKILLed (left down), w2 restarted".into())
}

/// 2: `pg_terminate_backend` on every qbridge connection, LISTEN included.
pub async fn terminate_backends(rig: &mut Rig, span: Duration) -> Result<String> {
    let (mut cut, mut listeners) = (0i64, 0i64);
    for _ in 0..3 {
        tokio::time::sleep(span / 4).await;
        let (n, l): (i64, i64) = sqlx::query_as(&format!(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)), \
                    count(*) FILTER (WHERE query ILIKE 'LISTEN%') \
               FROM pg_stat_activity WHERE {QBRIDGE_BACKENDS}"
        ))
        .fetch_one(&rig.db)
        .await?;
        cut += n;
        listeners += l;
    }
    Ok(format!(
        "3 rounds: {cut} connections terminated ({listeners} of them LISTEN)"
    ))
}

/// 3: `pg_ctl stop -m immediate` and start, mid-run.
pub async fn restart_postgres(rig: &mut Rig, span: Duration) -> Result<String> {
    tokio::time::sleep(span / 3).await;
    rig.pg.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.pg.try_resume().map_err(Error::Config)?;
    tokio::time::sleep(span / 2).await;
    Ok("Postgres crashed (immediate stop), down 1 s, restarted".into())
}

/// 4: Redis restarted in dual_write: every item it held is gone. The diff
/// must show them; the repair (run by the scenario afterwards) re-pushes
/// those it has evidence for, and the operator's decision the rest.
pub async fn restart_redis(rig: &mut Rig, span: Duration) -> Result<String> {
    tokio::time::sleep(span / 3).await;
    let lost_len = redis_len(rig).await;
    rig.redis.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    rig.redis.try_resume().map_err(Error::Config)?;
    rig.redis_back_at = Some(chrono::Utc::now());
    tokio::time::sleep(span / 2).await;
    Ok(format!(
        "Redis killed (no persistence) with {lost_len} items waiting, restarted after 0.5 s"
    ))
}

async fn redis_len(rig: &Rig) -> i64 {
    let Ok(mut conn) = crate::redis::connect::connect_redis(&rig.redis.url()).await else {
        return -1;
    };
    redis::cmd("LLEN")
        .arg(LIST)
        .query_async(&mut conn)
        .await
        .unwrap_or(-1)
}

/// 5: clients that vanish mid-pipeline (after complete commands and half of
/// one) and mid-MULTI (before EXEC). The MULTI keys go to `chaos.aborted`:
/// none may ever exist.
pub async fn disconnect_clients(rig: &mut Rig, span: Duration) -> Result<String> {
    let rounds = 20;
    let mut aborted = Vec::new();
    for round in 0..rounds {
        tokio::time::sleep(span / rounds).await;
        let mut pipeline = Vec::new();
        for n in 0..10 {
            pipeline.extend(lpush(
                LIST,
                format!(r#"{{"id":"pipe-{round}-{n}"}}"#).as_bytes(),
            ));
        }
        let half = lpush(LIST, format!(r#"{{"id":"pipe-{round}-half"}}"#).as_bytes());
        pipeline.extend_from_slice(&half[..half.len() / 2]);
        send_and_vanish(rig.proxy_port, &pipeline).await;

        let mut multi = b"*1\r\n$5\r\nMULTI\r\n".to_vec();
        for n in 0..3 {
            let key = format!("multi-{round}-{n}");
            multi.extend(lpush(LIST, format!(r#"{{"id":"{key}"}}"#).as_bytes()));
            aborted.push(key);
        }
        // Half an EXEC: never a complete command, so never run.
        multi.extend_from_slice(b"*1\r\n$4\r\nEX");
        send_and_vanish(rig.proxy_port, &multi).await;
    }
    sqlx::query("INSERT INTO chaos.aborted SELECT unnest($1::text[]) ON CONFLICT DO NOTHING")
        .bind(&aborted)
        .execute(&rig.db)
        .await?;
    Ok(format!(
        "{rounds} clients cut mid-pipeline (10 pushes + half a command), {rounds} cut mid-MULTI (3 pushes, half an EXEC)"
    ))
}

async fn send_and_vanish(port: u16, bytes: &[u8]) {
    if let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)).await {
        let _ = conn.write_all(bytes).await;
        // Dropped without reading a reply: a reset, as a crashed client.
    }
}

/// 6: a session idle in a transaction that holds the xmin horizon for the
/// whole span. The oldest-transaction gauge must show it.
pub async fn idle_in_transaction(rig: &mut Rig, span: Duration) -> Result<String> {
    let mut conn = PgConnection::connect(&super::rig::harness_url(&rig.database_url())).await?;
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await?;
    conn.execute("SELECT count(*) FROM qbridge.jobs").await?;
    let started = std::time::Instant::now();
    let mut seen = 0f64;
    // Long enough for the gauges (read every few seconds) to see it twice.
    let hold = span.max(Duration::from_secs(12));
    while started.elapsed() < hold {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for w in &rig.workers {
            seen = seen.max(gauge(&w.metrics().await, crate::metrics::OLDEST_XACT));
        }
    }
    conn.execute("ROLLBACK").await?;
    let held = started.elapsed().as_secs_f64();
    // The gauges are read every 5 s by each worker, later on a loaded
    // machine: the transaction must show, with at least 3 s of age.
    if seen < 3.0 {
        return Err(Error::CheckFailed(format!(
            "{} peaked at {seen:.0}s while a transaction was held for {held:.0}s",
            crate::metrics::OLDEST_XACT
        )));
    }
    Ok(format!(
        "xmin held {held:.0} s; {} peaked at {seen:.0} s",
        crate::metrics::OLDEST_XACT
    ))
}

/// A gauge's value in Prometheus text (the first series), or 0.
fn gauge(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max)
}

/// 7: a listener stuck in an open transaction pins the NOTIFY queue while
/// it fills. Past `qbridge.notify_max_usage` (lowered for the reduced run)
/// wake-ups are skipped instead of failing commits; pickup polls.
pub async fn notify_queue_full(rig: &mut Rig, span: Duration, fill_mb: u64) -> Result<String> {
    let url = super::rig::harness_url(&rig.database_url());
    let mut stuck = PgConnection::connect(&url).await?;
    // LISTEN must commit on its own (in one multi-statement string with
    // BEGIN it would join the transaction and not listen yet). Nothing
    // notifies chaos_flood before the flood, and once the transaction is
    // open nothing is delivered: sqlx never sees a notification it would
    // refuse mid-statement.
    stuck.execute("LISTEN chaos_flood").await?;
    stuck.execute("BEGIN").await?;
    stuck.execute("SELECT 1").await?;
    let mut flood = PgConnection::connect(&url).await?;
    let started = std::time::Instant::now();
    // 1,000 notifications of ~8 KB per transaction (the payload differs, or
    // Postgres folds duplicates).
    let rounds = (fill_mb * 1024 / 8 / 1000).max(1);
    for round in 0..rounds {
        flood
            .execute(
                format!(
                    "SELECT pg_notify('chaos_flood', repeat('x', 7900) || '{round}-' || g) \
                       FROM generate_series(1, 1000) g"
                )
                .as_str(),
            )
            .await?;
    }
    let (usage, skipping): (f64, bool) = sqlx::query_as(
        "SELECT pg_notification_queue_usage(), pg_notification_queue_usage() >= \
                coalesce(nullif(current_setting('qbridge.notify_max_usage', true), '')::float8, 0.5)",
    )
    .fetch_one(&mut flood)
    .await?;
    if !skipping {
        return Err(Error::CheckFailed(format!(
            "the queue reached only {:.3}%: below the skip threshold, the fallback was not exercised",
            usage * 100.0
        )));
    }
    let rest = span.saturating_sub(started.elapsed());
    tokio::time::sleep(rest.max(span / 2)).await;
    // Closing ends the transaction without reading what queued up for it.
    drop(stuck);
    Ok(format!(
        "{fill_mb} MB of notifications pinned by a stuck listener: queue {:.2}% full, past the threshold: wake-ups skipped, pickup by polling",
        usage * 100.0
    ))
}

/// 8: every connection slot of the server taken, then qbridge's own
/// connections cut, so they cannot come back until the slots free up.
pub async fn exhaust_connections(rig: &mut Rig, span: Duration) -> Result<String> {
    tokio::time::sleep(span / 4).await;
    let url = super::rig::harness_url(&rig.database_url());
    let mut held = Vec::new();
    while let Ok(Ok(conn)) =
        tokio::time::timeout(Duration::from_secs(2), PgConnection::connect(&url)).await
    {
        held.push(conn);
        if held.len() > 500 {
            break;
        }
    }
    let Some(first) = held.first_mut() else {
        return Err(Error::CheckFailed(
            "the server refused every connection: nothing to exhaust".into(),
        ));
    };
    let cut: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE {QBRIDGE_BACKENDS}"
    ))
    .fetch_one(first)
    .await?;
    tokio::time::sleep(span / 2).await;
    let n = held.len();
    drop(held);
    Ok(format!(
        "all {n} free connection slots taken for {:.0} s; {cut} qbridge connections cut",
        (span / 2).as_secs_f64()
    ))
}

/// 9: the route flipped forward and rolled back under load.
pub async fn flip_phases(rig: &mut Rig, span: Duration, route: &Route) -> Result<String> {
    let steps: [(Phase, bool); 4] = [
        (Phase::Shadow, true),
        (Phase::PostgresOnly, true),
        (Phase::Shadow, false),
        (Phase::PostgresOnly, true),
    ];
    let mut redis = crate::redis::connect::connect_redis(&rig.redis.url()).await?;
    let mut walked = vec![Phase::DualWrite.as_str()];
    for (to, forward) in steps {
        tokio::time::sleep(span / 5).await;
        let req = Request {
            by: "qbridge-chaos",
            reason: Some("fault suite: flip under load"),
            force: true,
            percent: None,
        };
        let reached = match forward {
            true => operate::advance(&rig.db, Some(&mut redis), route, &req, 1 << 20)
                .await
                .map(|a| a.state.phase)
                .map_err(|r| match r {
                    Refusal::Gate(_) => Error::CheckFailed("a forced advance was refused".into()),
                    Refusal::Error(e) => e,
                })?,
            false => {
                operate::rollback(&rig.db, Some(&mut redis), route, &req)
                    .await?
                    .phase
            }
        };
        if reached != to {
            return Err(Error::CheckFailed(format!(
                "expected {to}, the route is in {reached}"
            )));
        }
        walked.push(to.as_str());
    }
    tokio::time::sleep(span / 5).await;
    Ok(walked.join(" → "))
}
