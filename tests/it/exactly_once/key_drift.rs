//! Class 2: content-hash keys (Resque, raw) must not drift. The push side
//! numbers only items that reach Redis, the pop side numbers what Redis
//! hands out, so the n-th copy of some bytes has the same key on both sides
//! across rollbacks, failed trims of the gap list and retried numbering.

use std::time::{Duration, Instant};

use bytes::Bytes;
use sqlx::PgPool;

use qbridge::config::{Config, Overrides};
use qbridge::mirror::{repair_gaps_once, Mirror, MirrorOptions};
use qbridge::model::formats::decode_bytes;
use qbridge::model::Phase;
use qbridge::redis::consumer::numbering::{self, pop_key, PopKey};
use qbridge::redis::keys::RouteKeys;
use qbridge::redis::producer::Producer;
use qbridge::routes::Routes;

use super::{delete_keys, REDIS};

/// A raw route with its own list (and so its own gap list) per test.
fn routes() -> (Routes, String) {
    let name = format!("kd{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let toml = format!(
        "[[routes]]\nname = \"{name}\"\nredis_key = \"qbt:{name}\"\nqueue = \"q\"\n\
         format = \"raw\"\nphase = \"dual_write\"\n"
    );
    let cfg = Config::from_toml(&toml, &Overrides::default()).expect("route config");
    (Routes::from_config(&cfg.routes), name)
}

const BYTES: &[u8] = b"send the weekly digest";

async fn keys(pool: &PgPool) -> Vec<(String, String)> {
    sqlx::query_as("SELECT key, copy FROM qbridge.jobs WHERE queue = 'q' ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn redis() -> ::redis::aio::ConnectionManager {
    ::redis::Client::open(REDIS)
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap()
}

/// A live copy stored after the flip never reaches Redis, so it must not
/// take a number the Redis side will count: before the fix the next
/// mirrored push of the same bytes got `:2` while the consumer's first pop
/// of them got `:1` — two names for one job.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_live_copy_after_the_flip_takes_no_push_number(pool: PgPool) {
    let (routes, name) = routes();
    let producer = Producer::connect(pool.clone(), Some(REDIS), routes.clone(), 1 << 20)
        .await
        .unwrap();
    routes.phases().set(&name, Phase::PostgresOnly);
    producer
        .enqueue(&name, vec![Bytes::from_static(BYTES)])
        .await
        .unwrap();
    routes.phases().set(&name, Phase::DualWrite);
    let mirrored = producer
        .enqueue(&name, vec![Bytes::from_static(BYTES)])
        .await
        .unwrap();
    let mirror_key = mirrored.stored[0].key().to_string();
    let decoded = decode_bytes(
        &routes.by_name(&name).unwrap().format,
        Bytes::from_static(BYTES),
    );
    let popped = pop_key(&pool, "q", Phase::DualWrite, &decoded, "pop-1").await;
    assert_eq!(
        popped,
        PopKey::Numbered(mirror_key.clone()),
        "the first pop of the bytes names the only copy Redis got; jobs: {:?}",
        keys(&pool).await
    );
    let all = keys(&pool).await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert_ne!(all[0].0, all[1].0, "two jobs, two keys: {all:?}");
    delete_keys(&[&format!("qbt:{name}*"), &format!("qbridge:*:{name}*")]).await;
}

/// Gap repair writes parked items, then trims them; when the trim fails the
/// next pass writes them again. Before the fix the second write numbered
/// the same items again: a second job for the same push.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_gap_entry_written_twice_is_one_job(pool: PgPool) {
    let (routes, name) = routes();
    let route = routes.by_name(&name).unwrap().clone();
    let shared = route.clone();
    let gap = RouteKeys::of(&route).gap();
    // A writer whose Postgres is unreachable parks what it is given.
    let dead = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:1/none")
        .unwrap();
    let opts = MirrorOptions {
        buffer_bytes: 1 << 20,
        batch_items: 100,
        writers: 1,
        linger: qbridge::config::DEFAULT_MIRROR_LINGER,
        payload_limit: 1 << 20,
    };
    let (mirror, writers) = Mirror::start(dead, Some(redis().await), opts);
    let two = vec![Bytes::from_static(BYTES), Bytes::from_static(BYTES)];
    mirror.mirror(shared, two, Instant::now()).await.unwrap();
    drop(mirror);
    writers.join_all().await;
    let mut conn = redis().await;
    let parked: Vec<Vec<u8>> = ::redis::AsyncCommands::lrange(&mut conn, &gap, 0, -1)
        .await
        .unwrap();
    assert_eq!(parked.len(), 2, "both items parked");

    assert_eq!(
        repair_gaps_once(&pool, &mut conn, &routes, 1 << 20)
            .await
            .unwrap(),
        2
    );
    // The trim "failed": the same entries are still there for the next pass.
    let _: () = ::redis::AsyncCommands::rpush(&mut conn, &gap, parked)
        .await
        .unwrap();
    repair_gaps_once(&pool, &mut conn, &routes, 1 << 20)
        .await
        .unwrap();

    let all = keys(&pool).await;
    assert_eq!(
        all.len(),
        2,
        "two pushes, two jobs, however often they were written: {all:?}"
    );
    let decoded = decode_bytes(&route.format, Bytes::from_static(BYTES));
    let next = pop_key(&pool, "q", Phase::DualWrite, &decoded, "p1").await;
    let after = pop_key(&pool, "q", Phase::DualWrite, &decoded, "p2").await;
    let names: Vec<String> = all.into_iter().map(|(k, _)| k).collect();
    for popped in [next, after] {
        match popped {
            PopKey::Numbered(k) => assert!(names.contains(&k), "{k} not in {names:?}"),
            other => panic!("numbered pop expected, got {other:?}"),
        }
    }
    delete_keys(&[&gap, &format!("qbt:{name}*")]).await;
}

/// A pop's number is taken once per pop, not per attempt: numbering it again
/// (its reply was lost, the consumer restarted) gives the same key.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn numbering_a_pop_again_gives_the_same_key(pool: PgPool) {
    let (routes, name) = routes();
    let decoded = decode_bytes(
        &routes.by_name(&name).unwrap().format,
        Bytes::from_static(BYTES),
    );
    let first = pop_key(&pool, "q", Phase::DualWrite, &decoded, "pop-a").await;
    let again = pop_key(&pool, "q", Phase::DualWrite, &decoded, "pop-a").await;
    let other = pop_key(&pool, "q", Phase::DualWrite, &decoded, "pop-b").await;
    assert_eq!(first, again);
    assert_ne!(first, other);
}

/// When Postgres cannot number a pop the item is not run under a made-up
/// key (before the fix: `:0`, which every such pop shared): the consumer
/// is told to retry and keeps the item in its processing list.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_pop_postgres_cannot_number_is_retried_not_zero(pool: PgPool) {
    let (routes, name) = routes();
    let decoded = decode_bytes(
        &routes.by_name(&name).unwrap().format,
        Bytes::from_static(BYTES),
    );
    let dead = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:1/none")
        .unwrap();
    let popped = pop_key(&dead, "q", Phase::DualWrite, &decoded, "pop-x").await;
    assert!(matches!(popped, PopKey::Retry(_)), "{popped:?}");
    drop(pool);
}

/// In `redis_only` nothing is mirrored, so a pop there takes a number only
/// while mirrored copies of the bytes are still owed one; the rest get a key
/// no push can have. Before the fix every such pop was `:0` and the mirrored
/// copies waiting across a rollback were never matched.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn pops_in_redis_only_number_only_what_was_mirrored(pool: PgPool) {
    let (routes, name) = routes();
    let producer = Producer::connect(pool.clone(), Some(REDIS), routes.clone(), 1 << 20)
        .await
        .unwrap();
    let mirrored = producer
        .enqueue(&name, vec![Bytes::from_static(BYTES)])
        .await
        .unwrap();
    let decoded = decode_bytes(
        &routes.by_name(&name).unwrap().format,
        Bytes::from_static(BYTES),
    );
    let first = pop_key(&pool, "q", Phase::RedisOnly, &decoded, "r1").await;
    assert_eq!(
        first,
        PopKey::Numbered(mirrored.stored[0].key().to_string())
    );
    let second = pop_key(&pool, "q", Phase::RedisOnly, &decoded, "r2").await;
    match second {
        PopKey::Unmirrored(k) => {
            assert!(!k.ends_with(":0") && !k.ends_with(":2"), "{k}");
        }
        other => panic!("an unmirrored pop expected, got {other:?}"),
    }
    // Back in dual_write, the next mirrored push and its pop agree.
    let next = producer
        .enqueue(&name, vec![Bytes::from_static(BYTES)])
        .await
        .unwrap();
    let third = pop_key(&pool, "q", Phase::DualWrite, &decoded, "d1").await;
    assert_eq!(third, PopKey::Numbered(next.stored[0].key().to_string()));
    delete_keys(&[&format!("qbt:{name}*")]).await;
}

/// Repair pushes back the bytes of copies Redis lost: one that had been
/// popped (its number passed) and one still waiting. Their pops must take
/// their own numbers, or every later pop of the bytes is one ahead of its
/// push (found by the randomized oracle, seed 2: at decommission an archived
/// item then took the key of a job already done and was dropped).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn pushed_back_copies_are_popped_under_their_own_numbers(pool: PgPool) {
    let (routes, name) = routes();
    let producer = Producer::connect(pool.clone(), Some(REDIS), routes.clone(), 1 << 20)
        .await
        .unwrap();
    let two = producer
        .enqueue(
            &name,
            vec![Bytes::from_static(BYTES), Bytes::from_static(BYTES)],
        )
        .await
        .unwrap();
    let (k1, k2) = (
        two.stored[0].key().to_string(),
        two.stored[1].key().to_string(),
    );
    let decoded = decode_bytes(
        &routes.by_name(&name).unwrap().format,
        Bytes::from_static(BYTES),
    );
    // The first was popped, then Redis restarted and lost both.
    assert_eq!(
        pop_key(&pool, "q", Phase::DualWrite, &decoded, "before").await,
        PopKey::Numbered(k1.clone())
    );
    for key in [&k1, &k2] {
        numbering::expect_again(&pool, "q", key).await.unwrap();
    }
    let mut again = vec![];
    for pop in ["after-1", "after-2"] {
        match pop_key(&pool, "q", Phase::DualWrite, &decoded, pop).await {
            PopKey::Numbered(k) => again.push(k),
            other => panic!("{other:?}"),
        }
    }
    again.sort();
    assert_eq!(again, vec![k1, k2]);
    let next = producer
        .enqueue(&name, vec![Bytes::from_static(BYTES)])
        .await
        .unwrap();
    assert_eq!(
        pop_key(&pool, "q", Phase::DualWrite, &decoded, "later").await,
        PopKey::Numbered(next.stored[0].key().to_string()),
        "later pops still match their pushes"
    );
    delete_keys(&[&format!("qbt:{name}*")]).await;
}

/// Repair mirrors items Redis holds that Postgres does not know. For a
/// content hash it named such an item by a prediction (the pops so far plus
/// its place in line), and that name is the number the next push of the same
/// bytes takes: the next producer push became a "duplicate" of it and was
/// never pushed to Redis — an acknowledged job lost (found by the oracle
/// campaign, seed 270: a proxy push whose mirror write was still in flight
/// was seen waiting). Identical bytes cannot be matched to their pushes one
/// by one, so repair leaves content-hash items to the numbering.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn repair_does_not_name_identical_items_ahead_of_their_pushes(pool: PgPool) {
    use qbridge::ops::{redis_view, repair};
    let (routes, name) = routes();
    let route = routes.by_name(&name).unwrap().clone();
    let producer = Producer::connect(pool.clone(), Some(REDIS), routes.clone(), 1 << 20)
        .await
        .unwrap();
    // A copy Redis took whose mirror write has not committed yet.
    let mut conn = redis().await;
    let _: i64 = ::redis::AsyncCommands::lpush(&mut conn, &route.redis_key[..], BYTES)
        .await
        .unwrap();
    let held = redis_view::read(&mut conn, &pool, &route).await.unwrap();
    let since = chrono::Utc::now() - chrono::Duration::minutes(5);
    repair::repair(
        &pool,
        &mut conn,
        &route,
        Phase::DualWrite,
        since,
        &held,
        1 << 20,
    )
    .await
    .unwrap();
    // The next push of the same bytes is a new job, and reaches Redis.
    let next = producer
        .enqueue(&name, vec![Bytes::from_static(BYTES)])
        .await
        .unwrap();
    assert!(
        matches!(next.stored[0], qbridge::ingest::Stored::New { .. }),
        "{:?}",
        next.stored
    );
    assert_eq!(next.pushed, 1);
    delete_keys(&[&format!("qbt:{name}*")]).await;
}

/// A consumer's inflight hash names the key of the one item its pop took.
/// A pop whose reply was lost can land a second item in the same
/// processing list; the diff's view must not give that item the hash's key
/// too (before the fix every item of the list got it: the other text was
/// named as a second copy of the first, and its own mirrored key looked
/// missing from Redis).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_diff_gives_an_inflight_key_only_to_an_item_of_its_text(pool: PgPool) {
    use qbridge::ops::redis_view;
    const OTHER: &[u8] = b"rebuild the search index";
    let (routes, name) = routes();
    let route = routes.by_name(&name).unwrap().clone();
    let producer = Producer::connect(pool.clone(), Some(REDIS), routes.clone(), 1 << 20)
        .await
        .unwrap();
    let pushed = producer
        .enqueue(
            &name,
            vec![Bytes::from_static(BYTES), Bytes::from_static(OTHER)],
        )
        .await
        .unwrap();
    let (bytes_key, other_key) = (
        pushed.stored[0].key().to_string(),
        pushed.stored[1].key().to_string(),
    );
    // The consumer's pop of BYTES was numbered and recorded in its inflight
    // hash; a lost-reply pop put OTHER in the same processing list.
    let decoded = decode_bytes(&route.format, Bytes::from_static(BYTES));
    assert_eq!(
        pop_key(&pool, "q", Phase::DualWrite, &decoded, "p1").await,
        PopKey::Numbered(bytes_key.clone())
    );
    let consumer = RouteKeys::of(&route).consumer("c1");
    let mut conn = redis().await;
    let _: () = ::redis::cmd("DEL")
        .arg(&route.redis_key[..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = ::redis::cmd("RPUSH")
        .arg(consumer.processing(0))
        .arg(OTHER)
        .arg(BYTES)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = ::redis::cmd("HSET")
        .arg(consumer.inflight(0))
        .arg("key")
        .arg(&bytes_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let view = redis_view::read(&mut conn, &pool, &route).await.unwrap();
    let mut held: Vec<(String, Vec<u8>)> = view
        .processing
        .iter()
        .map(|h| (h.key.clone(), h.original.to_vec()))
        .collect();
    held.sort();
    let mut expected = vec![(bytes_key, BYTES.to_vec()), (other_key, OTHER.to_vec())];
    expected.sort();
    assert_eq!(held, expected);
    delete_keys(&[&format!("qbt:{name}*"), &format!("qbridge:*:{name}:*")]).await;
}

/// The same parked writes stored by two writers at once — gap repair and
/// the proxy's writer keeping what it parked — are one numbering: the later
/// store waits for the earlier one's commit and finds the keys it recorded.
/// Before the fix it read the write ids before that commit, found none,
/// numbered the items again and silently dropped its write records: five
/// copies gained five phantom numbers, which a later Redis restart made
/// "lost" and repair pushed back (oracle seed 100558: texts ran under more
/// keys than they were pushed).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn writes_stored_by_two_writers_at_once_are_numbered_once(pool: PgPool) {
    use qbridge::ingest::{self, Item, Via};
    use qbridge::queue::JobCopy;
    let (routes, name) = routes();
    // The spawned store needs the route for the task's life.
    let route: &'static qbridge::routes::Route = Box::leak(Box::new(std::sync::Arc::clone(
        routes.by_name(&name).unwrap(),
    )));
    let items = move |via: Via| -> Vec<Item<'static>> {
        (0..5)
            .map(|i| {
                let decoded = decode_bytes(&route.format, Bytes::from_static(BYTES));
                let mut item = Item::new(route, decoded, JobCopy::Mirror, via);
                item.write = Some(format!("w-both.{i}"));
                item
            })
            .collect()
    };
    let mut first = pool.begin().await.unwrap();
    let a = ingest::store(&mut first, items(Via::Repair), 1 << 20)
        .await
        .unwrap();
    let second = {
        let (pool, proxied) = (pool.clone(), items(Via::Proxy));
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let stored = ingest::store(&mut tx, proxied, 1 << 20).await;
            tx.commit().await.unwrap();
            stored.unwrap()
        })
    };
    // The second store is under way (waiting on the first) before this commit.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.commit().await.unwrap();
    let b = second.await.unwrap();
    let names = |s: &[ingest::Stored]| s.iter().map(|s| s.key().to_string()).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b), "the same writes got other keys");
    let all = keys(&pool).await;
    assert_eq!(all.len(), 5, "five pushes, five jobs: {all:?}");
}
