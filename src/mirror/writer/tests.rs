//! The writer with Postgres down or silent: what it parks, and when, and
//! what the mirror buffer holds back.

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
            order: Default::default(),
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
        _routed: None,
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(tx);
    running.await.unwrap();
    let items: Vec<Bytes> = retained.take().into_iter().flat_map(|k| k.items).collect();
    assert_eq!(items.len(), 2, "parked: {items:?}");
}

/// The mirror buffer bounds what waits for the writers: with the writer
/// stuck in its first write (a Postgres that takes the connection and never
/// answers), pushes queue until their bytes fill the budget, and the next
/// one waits for room instead of growing the queue.
#[tokio::test]
async fn pushes_wait_for_room_once_the_buffer_is_full() {
    // Accepts connections and never answers: the first write hangs.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            open.push(conn);
        }
    });
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(60))
        .connect_lazy(&format!("postgres://qbridge@127.0.0.1:{port}/none"))
        .unwrap();
    let opts = MirrorOptions {
        // Four units: each one-item push below holds one.
        buffer_bytes: 4 * UNIT,
        batch_items: 1,
        writers: 1,
        linger: Duration::ZERO,
        payload_limit: 1 << 20,
    };
    let (mirror, writers) = Mirror::start(pool, None, opts);
    let route = route();
    let push = |n: usize| {
        let item = Bytes::from(format!(r#"{{"id":"{n}"}}"#));
        mirror.mirror(Arc::clone(&route), vec![item], Instant::now())
    };
    let wait = Duration::from_millis(500);
    for n in 0..4 {
        let queued = tokio::time::timeout(wait, push(n)).await;
        assert!(matches!(queued, Ok(Ok(()))), "push {n} did not queue");
    }
    let fifth = tokio::time::timeout(wait, push(4)).await;
    assert!(fifth.is_err(), "a fifth push queued past a full buffer");
    drop(writers);
    held.abort();
}
