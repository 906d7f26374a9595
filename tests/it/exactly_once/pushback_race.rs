//! Repair pushes lost copies of a text back while the Redis consumer keeps
//! popping: each pop must still take a number no other pop holds.
//!
//! A pushed-back copy is popped under its own number only when the copy was
//! popped before and then lost (its number became a hole). Before the fix,
//! repair decided that at push time, by comparing the number with the pop
//! count *then*: pops running meanwhile (the copies waiting in Redis, the
//! copies pushed back a moment before) had counted past numbers no pop had
//! taken when repair judged them, which then became holes too — two pops ran
//! under one key and a number was never run (found by the oracle campaign,
//! seeds 3000, 3220, 3458, 3496: "55 pushed, 54 ran", the last key run
//! twice right after the final repair).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use sqlx::PgPool;

use qbridge::model::formats::decode_bytes;
use qbridge::model::Phase;
use qbridge::ops::gates;
use qbridge::redis::connect::connect_redis;
use qbridge::redis::consumer::numbering::{pop_key, PopKey};
use qbridge::redis::producer::Producer;
use qbridge::routes::{Route, Routes};

use crate::servers::ThrowawayRedis;

/// Copies of the text Redis lost in the restart, and copies pushed after it
/// that wait in Redis when repair reads.
const LOST: usize = 40;
const WAITING: usize = 40;
/// Poppers running beside repair: together they pop faster than repair
/// pushes back, as a consumer with a backlog does.
const POPPERS: usize = 4;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn pops_during_a_push_back_never_share_a_number(pool: PgPool) {
    let mut server = ThrowawayRedis::start();
    let cfg = super::restart_route_config("raw");
    let routes = Routes::from_config(&cfg.routes);
    let route = routes.by_name("r").unwrap().clone();
    let text = Bytes::from_static(b"rebuild the search index");
    let producer = Producer::connect(pool.clone(), Some(&server.url()), routes.clone(), 1 << 20)
        .await
        .expect("producer");
    producer
        .enqueue("r", vec![text.clone(); LOST])
        .await
        .unwrap();
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    let mut conn = connect_redis(&server.url()).await.unwrap();
    // qbridge observes this Redis, then it dies without persistence.
    gates::diff_since(&pool, &mut conn, &route, Phase::DualWrite, since)
        .await
        .unwrap();
    drop(conn);
    server.kill();
    server.resume();
    let mut conn = connect_redis(&server.url()).await.unwrap();
    let pushed = producer
        .enqueue("r", vec![text.clone(); WAITING])
        .await
        .unwrap()
        .pushed;
    let paid =
        qbridge::redis::outbox::repair_once(&pool, &mut conn, &routes, std::time::Duration::ZERO)
            .await
            .unwrap();
    assert_eq!(pushed + paid as usize, WAITING);

    // The consumer starts popping as soon as the first copy is pushed back.
    let repaired = Arc::new(AtomicBool::new(false));
    let poppers: Vec<_> = (0..POPPERS)
        .map(|p| {
            let (pool, url, route) = (pool.clone(), server.url(), route.clone());
            let repaired = Arc::clone(&repaired);
            tokio::spawn(async move { pop_all(&pool, &url, &route, p, &repaired).await })
        })
        .collect();
    let (_, report) = super::diff_and_repair(&pool, &mut conn, &route, since).await;
    repaired.store(true, Ordering::SeqCst);
    assert_eq!(
        (report.repushed, report.unaccounted),
        (LOST, 0),
        "{report:?}"
    );
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    for popper in poppers {
        for key in popper.await.unwrap() {
            *taken.entry(key).or_default() += 1;
        }
    }
    let shared: Vec<(&String, &usize)> = taken.iter().filter(|(_, n)| **n > 1).collect();
    assert!(shared.is_empty(), "pops sharing a number: {shared:?}");
    let hash = decode_bytes(&route.format, text).key;
    let expected: Vec<String> = (1..=(LOST + WAITING) as u64)
        .map(|n| hash.with_occurrence(n))
        .collect();
    let mut got: Vec<String> = taken.into_keys().collect();
    got.sort_by_key(|k| k.rsplit(':').next().unwrap().parse::<u64>().unwrap());
    assert_eq!(
        got, expected,
        "every pushed copy popped under its own number"
    );
}

/// Pops as the consumer does (the oldest first, each numbered with a pop id
/// of its own) once Redis holds more than the waiting copies, until repair
/// is done and the list is empty. Returns the keys its pops took.
async fn pop_all(
    pool: &PgPool,
    url: &str,
    route: &Route,
    popper: usize,
    repaired: &AtomicBool,
) -> Vec<String> {
    let mut conn = connect_redis(url).await.unwrap();
    loop {
        let len: usize = ::redis::cmd("LLEN")
            .arg("jobs")
            .query_async(&mut conn)
            .await
            .unwrap();
        if len > WAITING || repaired.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let mut keys = Vec::new();
    loop {
        let item: Option<Vec<u8>> = ::redis::cmd("RPOP")
            .arg("jobs")
            .query_async(&mut conn)
            .await
            .unwrap();
        let Some(item) = item else {
            if repaired.load(Ordering::SeqCst) {
                return keys;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            continue;
        };
        let decoded = decode_bytes(&route.format, Bytes::from(item));
        let pop = format!("popper-{popper}-{}", keys.len());
        match pop_key(pool, "q", Phase::DualWrite, &decoded, &pop).await {
            PopKey::Numbered(key) => keys.push(key),
            other => panic!("{other:?}"),
        }
    }
}
