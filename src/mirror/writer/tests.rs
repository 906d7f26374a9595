//! The writer's loop with Postgres down: what it parks, and when.

use std::time::Duration;

use super::*;
use crate::config::{Config, Overrides};
use crate::routes::Routes;

fn route() -> Arc<Route> {
    let toml =
        "[[routes]]\nname = \"w\"\nredis_key = \"w\"\nqueue = \"w\"\nformat = \"json:/id\"\n";
    let routes = Routes::from_config(
        &Config::from_toml(toml, &Overrides::default())
            .unwrap()
            .routes,
    );
    Arc::clone(routes.by_name("w").unwrap())
}

fn kept(route: &Arc<Route>) -> Kept {
    Kept {
        route: Arc::clone(route),
        items: vec![Bytes::from_static(br#"{"id":"parked"}"#)],
        copy: JobCopy::Mirror,
        via: Via::Proxy,
        ledger_only: true,
        writes: uuid::Uuid::new_v4(),
        acked_at: Instant::now(),
        acked_by: None,
    }
}

/// A push that arrives just before the writer's once-a-second retry of
/// parked items was dropped with the batch it was gathering when the
/// retry's timer fired: neither written, nor parked, nor counted.
#[tokio::test(start_paused = true)]
async fn a_push_gathered_as_parked_items_are_retried_is_kept() {
    let route = route();
    let (tx, rx) = async_channel::bounded(16);
    // Postgres is down: every write parks its items for the next try.
    let breaker = Breaker::new();
    breaker.open();
    let retained = Retained::new(1 << 20);
    retained.keep(kept(&route));
    let writer = Writer {
        pool: sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://qbridge@127.0.0.1:1/none")
            .unwrap(),
        spool: None,
        gather: Arc::new(Gatherer {
            rx,
            urgent: Arc::new(Notify::new()),
            turns: Arc::new(Turns::default()),
            linger: Duration::from_millis(2),
            batch_items: 100,
        }),
        opts: MirrorOptions {
            buffer_bytes: 1 << 20,
            batch_items: 100,
            writers: 1,
            linger: Duration::from_millis(2),
            payload_limit: 1 << 20,
        },
        probe: None,
        breaker,
        retained: retained.clone(),
    };
    let running = tokio::spawn(writer.run());
    // One millisecond before the retry is due: the retry's timer fires
    // while this push lingers for company.
    tokio::time::sleep(RETRY_KEPT_EVERY - Duration::from_millis(1)).await;
    let permit = Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap();
    let k = kept(&route);
    tx.send(Request {
        route: k.route,
        items: vec![Bytes::from_static(br#"{"id":"new"}"#)],
        copy: k.copy,
        via: k.via,
        acked_at: k.acked_at,
        acked_by: None,
        ledger_only: true,
        writes: k.writes,
        reply: None,
        _permit: permit,
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(tx);
    running.await.unwrap();
    let items: Vec<Bytes> = retained.take().into_iter().flat_map(|k| k.items).collect();
    assert_eq!(items.len(), 2, "parked: {items:?}");
}
