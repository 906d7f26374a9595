//! Enqueue a job in the same transaction as a business write, through a
//! qbridge route, with the producer API.
//!
//!     qbridge migrate
//!     cargo run --example rust_producer
//!
//! Environment (all optional): `QBRIDGE_DATABASE_URL`, `QBRIDGE_REDIS_URL`,
//! `ROUTE` (default `orders`), `QUEUE_KEY` (the Redis list, default
//! `queue:orders`), `QUEUE` (the Postgres queue, default the route's name),
//! `PHASE` (the route's first phase, default `dual_write`; once a route is
//! registered its stored phase wins, see docs/src/runbook/README.md).

use bytes::Bytes;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use qbridge::config::{Config, Overrides};
use qbridge::cutover::watch;
use qbridge::ingest::Stored;
use qbridge::redis::producer::Producer;
use qbridge::routes::Routes;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Library warnings (a Redis push that failed after commit) go to stderr.
    qbridge::telemetry::init_logging(qbridge::telemetry::LogFormat::Text, "warn");

    let route = env_or("ROUTE", "orders");
    let key = env_or("QUEUE_KEY", "queue:orders");
    let queue = env_or("QUEUE", &route);
    let phase = env_or("PHASE", "dual_write");
    // The same [[routes]] entry `qbridge run` and the proxy read: every
    // process that produces or consumes the list must agree on it.
    let toml = format!(
        r#"
[[routes]]
name = "{route}"
redis_key = "{key}"
queue = "{queue}"
format = "json:/id"   # the job key is the item's "id"
phase = "{phase}"
"#
    );
    let overrides = Overrides {
        database_url: Some(env_or(
            "QBRIDGE_DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/postgres",
        )),
        redis_url: Some(env_or("QBRIDGE_REDIS_URL", "redis://127.0.0.1:6379")),
        ..Overrides::default()
    };
    let config = Config::from_toml(&toml, &overrides)?;

    // Through [database] pooler when one is declared.
    let pool = config.open_db(5).await?;
    // Fail with "run qbridge migrate" rather than a missing-table error.
    qbridge::db::check_schema(&pool).await?;

    // Follow the stored phase flag, not the config: an operator's
    // `qbridge cutover advance` must reach this producer within a second.
    let stop = CancellationToken::new();
    // LISTEN makes a change arrive sooner; behind a transaction-mode pooler
    // without [database] direct_url the poll alone carries it.
    let listen = config.database.listen_url(&config.database_url);
    let (phases, watcher) =
        watch::attach(&pool, listen, &config.routes, "rust_producer", &stop).await?;
    let routes = Routes::new(&config.routes, phases);
    let producer = Producer::connect(
        pool.clone(),
        Some(&config.redis_url),
        routes,
        config.payload_limit,
    )
    .await?;

    let order_id = uuid::Uuid::new_v4();
    let item = json!({ "id": format!("order-{order_id}"), "order": order_id, "sku": "demo-1" });

    // One transaction: the order and its job commit together or not at all.
    let mut tx = pool.begin().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS demo_orders (
             id uuid PRIMARY KEY,
             sku text NOT NULL,
             created_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO demo_orders (id, sku) VALUES ($1, $2)")
        .bind(order_id)
        .bind("demo-1")
        .execute(&mut *tx)
        .await?;
    // Writes the Postgres copy (and, when Redis gets one, an outbox row) on
    // our transaction; nothing reaches Redis yet.
    let pending = producer
        .enqueue_in(&mut tx, &route, vec![Bytes::from(item.to_string())])
        .await?;
    tx.commit().await?;
    // Only after commit: Redis never sees a job whose order rolled back. If
    // this push fails the job is owed in the outbox, and `qbridge run` pushes it.
    let done = pending.push(&producer).await?;

    println!(
        "route {route} ({key} -> queue {queue}) is in phase {}",
        done.phase
    );
    println!("order {order_id} committed");
    for stored in &done.stored {
        match stored {
            Stored::New { id, key } => println!("postgres: new job {id}, key {key}"),
            Stored::Duplicate { key } => println!("postgres: key {key} already known"),
            Stored::Recorded { key } => println!("postgres: mirror copy {key} recorded"),
        }
    }
    if done.stored.is_empty() {
        println!("postgres: nothing stored (redis_only)");
    }
    println!("redis: pushed {}, deferred {}", done.pushed, done.deferred);
    if let Some(e) = done.push_error {
        println!("redis: push failed, owed in qbridge.redis_outbox: {e}");
    }

    stop.cancel();
    if let Some(watcher) = watcher {
        watcher.await?;
    }
    pool.close().await;
    Ok(())
}
