//! Identical copies lost in a Redis restart while producers and the
//! consumer go on. A content-hash key names a count, not a copy: the copies
//! repair calls missing are the oldest numbers no pop has taken, and those
//! move on with every pop. Found by the oracle campaign (seeds 3100, 3166,
//! 3194, 3208, 3568, 3672, 3766: one copy of a text lost each, the Redis
//! restart long before the end):
//!
//! - repair only considers what two readings a second apart both miss;
//!   under load they named different numbers of the same text (the pops in
//!   between took the first one's), so the lost copy was never judged;
//! - an operator's `--assume-lost-before T` looked at the push time of the
//!   key named missing — by then a copy pushed after T — not at how many
//!   copies of the text were pushed before T and not popped by then.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sqlx::PgPool;

use qbridge::model::Phase;
use qbridge::ops::{gates, repair};
use qbridge::redis::connect::connect_redis;
use qbridge::redis::producer::Producer;
use qbridge::routes::{Route, Routes};

use super::restart_evidence::pop_and_number;
use crate::servers::ThrowawayRedis;

const TEXT: &[u8] = b"renew the certificates";

struct Rig {
    server: ThrowawayRedis,
    routes: Routes,
    route: Arc<Route>,
    producer: Producer,
    since: chrono::DateTime<chrono::Utc>,
    /// Pops so far (each pop has an id of its own).
    pops: usize,
}

impl Rig {
    async fn start(pool: &PgPool) -> Rig {
        let server = ThrowawayRedis::start();
        let cfg = super::restart_route_config("raw");
        let routes = Routes::from_config(&cfg.routes);
        let route = Arc::clone(routes.by_name("r").unwrap());
        let producer =
            Producer::connect(pool.clone(), Some(&server.url()), routes.clone(), 1 << 20)
                .await
                .expect("producer");
        Rig {
            server,
            routes,
            route,
            producer,
            since: chrono::Utc::now() - chrono::Duration::minutes(5),
            pops: 0,
        }
    }

    async fn push(&self, pool: &PgPool, n: usize) {
        push(pool, &self.producer, &self.routes, &self.server.url(), n).await;
    }

    async fn observe(&self, pool: &PgPool) {
        let mut conn = connect_redis(&self.server.url()).await.unwrap();
        gates::diff_since(pool, &mut conn, &self.route, Phase::DualWrite, self.since)
            .await
            .unwrap();
    }

    /// Three copies pushed, two popped and run, then Redis dies with the
    /// third waiting; one more copy pushed and popped after the restart.
    /// `observed_after_pushes`: qbridge saw the old server after the pushes
    /// (the evidence), or only before them (the restart fell inside one
    /// observation period: no evidence). Returns when Redis came back.
    async fn lose_one_copy(
        &mut self,
        pool: &PgPool,
        observed_after_pushes: bool,
    ) -> chrono::DateTime<chrono::Utc> {
        self.observe(pool).await;
        self.push(pool, 3).await;
        self.pop(pool, 2).await;
        if observed_after_pushes {
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.observe(pool).await;
        }
        self.server.kill();
        self.server.resume();
        let back = chrono::Utc::now();
        self.observe(pool).await;
        self.push(pool, 1).await;
        self.pop(pool, 1).await;
        back
    }

    /// Pops and runs `n` items as the consumer does.
    async fn pop(&mut self, pool: &PgPool, n: usize) {
        let mut conn = connect_redis(&self.server.url()).await.unwrap();
        pop_and_number(pool, &mut conn, &self.route, self.pops..self.pops + n, true).await;
        self.pops += n;
    }

    /// One repair while, between its two readings, another copy is pushed
    /// and popped (producers and the consumer go on).
    async fn repair_under_load(
        &mut self,
        pool: &PgPool,
        assume: Option<&repair::Assumption>,
    ) -> repair::RepairReport {
        let mut conn = connect_redis(&self.server.url()).await.unwrap();
        let (_, held) =
            gates::diff_since(pool, &mut conn, &self.route, Phase::DualWrite, self.since)
                .await
                .unwrap();
        let pop = self.pops;
        self.pops += 1;
        let load = {
            let (pool, url, route) = (pool.clone(), self.server.url(), Arc::clone(&self.route));
            let (producer, routes) = (self.producer.clone(), self.routes.clone());
            tokio::spawn(async move {
                // Inside repair's second between its readings.
                tokio::time::sleep(Duration::from_millis(400)).await;
                push(&pool, &producer, &routes, &url, 1).await;
                let mut conn = connect_redis(&url).await.unwrap();
                pop_and_number(&pool, &mut conn, &route, pop..pop + 1, true).await;
            })
        };
        let input = repair::RepairInput {
            route: &self.route,
            phase: Phase::DualWrite,
            since: self.since,
            held: &held,
            payload_limit: 1 << 20,
            assume,
        };
        let report = repair::repair_with(pool, &mut conn, input).await.unwrap();
        load.await.unwrap();
        report
    }
}

/// Pushes `n` copies through the producer; a push its connection finds
/// broken (Redis restarted) waits in the outbox, which is paid at once.
async fn push(pool: &PgPool, producer: &Producer, routes: &Routes, url: &str, n: usize) {
    let pushed = producer
        .enqueue("r", vec![Bytes::from_static(TEXT); n])
        .await
        .unwrap()
        .pushed;
    let mut conn = connect_redis(url).await.unwrap();
    let paid = qbridge::redis::outbox::repair_once(pool, &mut conn, routes, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(pushed + paid as usize, n);
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_copy_lost_while_pops_go_on_is_judged_by_count_across_the_readings(pool: PgPool) {
    let mut rig = Rig::start(&pool).await;
    rig.lose_one_copy(&pool, true).await;
    let report = rig.repair_under_load(&pool, None).await;
    assert_eq!(
        (report.repushed, report.unaccounted),
        (1, 0),
        "the copy Redis lost is pushed back: {report:?}"
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn an_assumed_restart_covers_identical_copies_by_count(pool: PgPool) {
    let mut rig = Rig::start(&pool).await;
    let back = rig.lose_one_copy(&pool, false).await;
    // Pushes whose server qbridge could not learn (an ACL user denied INFO):
    // in the blind second before a quick restart they have no evidence.
    sqlx::query("DELETE FROM qbridge.redis_run_acks")
        .execute(&pool)
        .await
        .unwrap();
    let report = rig.repair_under_load(&pool, None).await;
    assert_eq!(
        (report.repushed, report.unaccounted),
        (0, 1),
        "without evidence the lost copy is unaccounted, not lost: {report:?}"
    );
    let assume = repair::Assumption {
        before: Some(back),
        by: "test@ops".into(),
        reason: "Redis was killed without persistence".into(),
        ..repair::Assumption::default()
    };
    let report = rig.repair_under_load(&pool, Some(&assume)).await;
    assert_eq!(
        (report.repushed, report.unaccounted),
        (1, 0),
        "a copy of the text pushed before the restart and never popped is covered: {report:?}"
    );
}

/// A popped number is judged by when the pop took it, not by when the push
/// of that number was written: identical copies are numbered apart on the
/// two sides, so the copy a pop took may be one pushed long before the
/// push its number names (a proxy push whose mirror write lagged behind a
/// producer's). Here the pop took number 1 from a copy Redis had before
/// its restart and lost with the consumer's processing list, while push 1
/// is a copy written after the restart: judged by that push's time, the
/// lost job was unaccounted and never ran (found by the oracle campaign,
/// seed 4820, three restarts under load).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_popped_copy_is_judged_by_its_pop_not_by_the_push_its_number_names(pool: PgPool) {
    use qbridge::mirror::{Mirror, MirrorOptions};
    use qbridge::model::formats::decode_bytes;
    use qbridge::redis::consumer::numbering::{pop_key, PopKey};

    let mut rig = Rig::start(&pool).await;
    rig.observe(&pool).await;
    // The proxy forwarded a push; its mirror write is behind.
    let mut conn = connect_redis(&rig.server.url()).await.unwrap();
    let _: i64 = ::redis::cmd("LPUSH")
        .arg("jobs")
        .arg(TEXT)
        .query_async(&mut conn)
        .await
        .unwrap();
    let acked = std::time::Instant::now();
    // The consumer pops it (number 1) and is still running it when Redis
    // dies with its processing list.
    let item: Vec<u8> = ::redis::cmd("RPOP")
        .arg("jobs")
        .query_async(&mut conn)
        .await
        .unwrap();
    let decoded = decode_bytes(&rig.route.format, Bytes::from(item));
    let key = pop_key(&pool, "q", Phase::DualWrite, &decoded, "lost-pop").await;
    assert!(
        matches!(key, PopKey::Numbered(ref k) if k.ends_with(":1")),
        "{key:?}"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    rig.observe(&pool).await;
    drop(conn);
    rig.server.kill();
    rig.server.resume();
    rig.observe(&pool).await;
    // After the restart a producer's push is numbered 1 on the push side,
    // then the lagging mirror write numbers the proxy's copy 2.
    rig.push(&pool, 1).await;
    let opts = MirrorOptions {
        buffer_bytes: 1 << 20,
        batch_items: 100,
        writers: 1,
        linger: qbridge::config::DEFAULT_MIRROR_LINGER,
        payload_limit: 1 << 20,
    };
    let (mirror, _writers) = Mirror::start(pool.clone(), None, opts);
    mirror
        .mirror(
            Arc::clone(&rig.route),
            vec![Bytes::from_static(TEXT)],
            acked,
        )
        .await
        .unwrap();
    crate::support::wait_for_count(
        &pool,
        "the lagging mirror copy",
        "SELECT count(*) FROM qbridge.job_keys WHERE queue = 'q'",
        2,
    )
    .await;
    // The producer's copy is popped (number 2) and runs.
    rig.pop(&pool, 1).await;
    let report = rig.repair_under_load(&pool, None).await;
    assert_eq!(
        (report.repushed, report.unaccounted),
        (1, 0),
        "the copy the restart took from the processing list is pushed back: {report:?}"
    );
}
