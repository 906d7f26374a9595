//! A push whose mirror copy is not yet in Postgres when the route flips: a
//! client's re-push of it through the proxy in `postgres_only` is judged by
//! `job_keys`, where the key is missing, so it was stored as a new live job
//! while Redis still held (and its side would run) the original.

use std::time::Duration;

use sqlx::PgPool;

use qbridge::redis::keys::RouteKeys;

use super::paused_link::PausedLink;
use super::{delete_keys, ProxySide, REDIS};

async fn redis() -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// An LPUSH through the proxy; its reply, an integer or an error's text.
async fn push_through(side: &ProxySide, list: &str, item: &[u8]) -> Result<i64, String> {
    push_to(side.url(), list.to_string(), item.to_vec()).await
}

/// A connection to `url` that waits up to 10 s for a reply (a push may
/// wait for every proxy to follow a flip).
async fn patient(url: String) -> ::redis::aio::MultiplexedConnection {
    let config =
        ::redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    ::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

/// An LPUSH through the proxy at `url`, waiting up to 10 s for its reply.
async fn push_to(url: String, list: String, item: Vec<u8>) -> Result<i64, String> {
    let mut conn = patient(url).await;
    ::redis::cmd("LPUSH")
        .arg(&list)
        .arg(&item)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())
}

/// Flips `route` to `postgres_only` in the store (no other process is
/// told) and waits until `side`'s view holds it.
async fn flip_and_wait(pool: &PgPool, route: &str, side: &ProxySide) {
    sqlx::query("UPDATE qbridge.route_phases SET phase = 'postgres_only' WHERE route = $1")
        .bind(route)
        .execute(pool)
        .await
        .unwrap();
    let routes = side.side_routes();
    crate::support::wait_for("the proxy holds the flip", Duration::from_secs(10), || {
        let phase = routes.phases().get(route);
        async move { phase == qbridge::model::Phase::PostgresOnly }
    })
    .await;
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// The original was pushed in `shadow` while Postgres was away, so its
/// mirror copy waits in the route's gap list (here as another process
/// parked it, with that process's gap repair holding the lock). Before the
/// fix the re-push after the flip ran live at once. Now the live store
/// first writes what the gap list holds: while it cannot (the lock is
/// taken) the push is refused with the reason and the client retries; once
/// it can, the original's mirror copy is there first and the re-push is
/// held as any re-push of a mirrored key.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_repush_of_a_push_parked_before_the_flip_does_not_run_as_a_new_job(pool: PgPool) {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (route, list) = (format!("p{id}"), format!("qbt:{id}:jobs"));
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"{list}\"\nqueue = \"q\"\n\
         format = \"json:/id\"\nphase = \"postgres_only\"\nredis_side = \"qbridge\"\n"
    );
    let keys = RouteKeys::named(&route);
    let item = br#"{"id":"k-parked"}"#;
    let mut conn = redis().await;
    let _: i64 = ::redis::cmd("LPUSH")
        .arg(&list)
        .arg(&item[..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let entry = qbridge::redis::gap_entry::encode("parked-write.0", item);
    let _: i64 = ::redis::cmd("RPUSH")
        .arg(keys.gap())
        .arg(entry)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = ::redis::cmd("SET")
        .arg(keys.gap_lock())
        .arg("another-process")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let side = ProxySide::start(&pool, &toml).await;

    let refused = push_through(&side, &list, item).await;
    let live = "SELECT count(*) FROM qbridge.jobs WHERE key = 'k-parked' AND copy = 'live'";
    assert_eq!(count(&pool, live).await, 0, "{refused:?}");
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("not stored yet") && e.contains("another process")),
        "{refused:?}"
    );

    let _: i64 = ::redis::cmd("DEL")
        .arg(keys.gap_lock())
        .query_async(&mut conn)
        .await
        .unwrap();
    let retried = push_through(&side, &list, item).await;
    assert_eq!(retried, Ok(1), "the retry is answered");
    assert_eq!(count(&pool, live).await, 0);
    let held = "SELECT count(*) FROM qbridge.held_repushes WHERE key = 'k-parked'";
    assert_eq!(count(&pool, held).await, 1);
    let mirror = "SELECT count(*) FROM qbridge.job_keys WHERE key = 'k-parked' AND copy = 'mirror'";
    assert_eq!(count(&pool, mirror).await, 1);
    side.stop().await;
    delete_keys(&[&list, &format!("qbridge:*:{route}*")]).await;
}

/// The original's mirror copy is still being written by another proxy
/// process when the route flips: that process's Postgres path stalls, so
/// its write hangs and its view still says `shadow`. Before the fix the
/// re-push through a process that followed the flip was stored as a new
/// live job while Redis held the original (its side would run it too). Now
/// a live store waits until every proxy process has followed the change,
/// with every push it forwarded before written; the re-push then finds the
/// original's copy and is held as any re-push of a mirrored key.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_repush_while_another_process_still_writes_the_original_is_held(pool: PgPool) {
    repush_while_another_process_stalls(pool, Duration::from_millis(1500)).await;
}

/// The same, with a stall long enough for the other processes to take the
/// stalled proxy for gone: its write gave up first and parked the copy in
/// the gap list, which the live store writes before it judges the re-push.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_repush_while_another_process_stalls_past_its_expiry_is_held(pool: PgPool) {
    let stall = qbridge::cutover::follow::EXPIRY + Duration::from_millis(1500);
    repush_while_another_process_stalls(pool, stall).await;
}

async fn repush_while_another_process_stalls(pool: PgPool, stall: Duration) {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (route, list) = (format!("f{id}"), format!("qbt:{id}:jobs"));
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"{list}\"\nqueue = \"q\"\n\
         format = \"json:/id\"\nphase = \"shadow\"\nredis_side = \"qbridge\"\n"
    );
    let item = br#"{"id":"k-in-flight"}"#;
    let link = PausedLink::to_postgres().await;
    let lagging = ProxySide::start_with(&toml, REDIS, &link.url(&pool)).await;
    let following = ProxySide::start(&pool, &toml).await;

    link.pause();
    assert_eq!(push_through(&lagging, &list, item).await, Ok(1));
    flip_and_wait(&pool, &route, &following).await;
    let repush = tokio::spawn(push_to(following.url(), list.clone(), item.to_vec()));
    tokio::time::sleep(stall).await;
    link.resume();
    let mut answered = repush.await.unwrap();
    let retries_until = std::time::Instant::now() + Duration::from_secs(10);
    while answered.is_err() && std::time::Instant::now() < retries_until {
        // Refused while what the other process parked was being written:
        // the client retries, as it would.
        tokio::time::sleep(Duration::from_millis(200)).await;
        answered = push_through(&following, &list, item).await;
    }
    assert_eq!(answered, Ok(1), "the re-push is answered");
    // The lagging process writes the original's copy once its path
    // resumes (a duplicate, when the key was stored live first).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let live = "SELECT count(*) FROM qbridge.jobs WHERE key = 'k-in-flight' AND copy = 'live'";
    assert_eq!(
        count(&pool, live).await,
        0,
        "no live job beside Redis's original"
    );
    let held = "SELECT count(*) FROM qbridge.held_repushes WHERE key = 'k-in-flight'";
    assert_eq!(count(&pool, held).await, 1);
    let mirror =
        "SELECT count(*) FROM qbridge.job_keys WHERE key = 'k-in-flight' AND copy = 'mirror'";
    assert_eq!(count(&pool, mirror).await, 1);
    lagging.stop().await;
    following.stop().await;
    delete_keys(&[&list, &format!("qbridge:*:{route}*")]).await;
}

/// A route of its own in `shadow` behind a started proxy, with another
/// proxy process on record, alive, still following the revision before the
/// flip the test makes next. Returns (route, list, that process).
async fn with_a_proxy_behind(pool: &PgPool, id: &str) -> (ProxySide, String, String, uuid::Uuid) {
    let (route, list) = (format!("m{id}"), format!("qbt:{id}:jobs"));
    let toml = format!(
        "[[routes]]\nname = \"{route}\"\nredis_key = \"{list}\"\nqueue = \"q\"\n\
         format = \"json:/id\"\nphase = \"shadow\"\nredis_side = \"qbridge\"\n"
    );
    let side = ProxySide::start(pool, &toml).await;
    let behind = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO qbridge.phase_followers (process, route, followed) \
         SELECT $1, route, revision FROM qbridge.route_phases WHERE route = $2",
    )
    .bind(behind)
    .bind(&route)
    .execute(pool)
    .await
    .unwrap();
    (side, route, list, behind)
}

/// The proxy that was behind follows the flip.
async fn catches_up(pool: &PgPool, behind: uuid::Uuid) {
    sqlx::query(
        "UPDATE qbridge.phase_followers f SET followed = p.revision, beat = now() \
           FROM qbridge.route_phases p WHERE f.process = $1 AND p.route = f.route",
    )
    .bind(behind)
    .execute(pool)
    .await
    .unwrap();
}

/// While another proxy has not followed the flip, a push waits, inside
/// MULTI too (Sidekiq, kombu and RQ push once per MULTI), and is stored
/// once every proxy follows; the rest of its transaction runs with it.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_push_waits_until_every_proxy_follows_the_flip(pool: PgPool) {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (side, route, list, behind) = with_a_proxy_behind(&pool, id).await;
    let other = format!("qbt:{id}:other");
    flip_and_wait(&pool, &route, &side).await;
    let waiting = tokio::spawn(push_to(
        side.url(),
        list.clone(),
        br#"{"id":"k-waits"}"#.to_vec(),
    ));
    let in_multi = {
        let (url, list, other) = (side.url(), list.clone(), other.clone());
        tokio::spawn(async move {
            let mut conn = patient(url).await;
            ::redis::pipe()
                .atomic()
                .cmd("SET")
                .arg(&other)
                .arg("1")
                .cmd("LPUSH")
                .arg(&list)
                .arg(&br#"{"id":"k-multi"}"#[..])
                .query_async::<(String, i64)>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished() && !in_multi.is_finished(),
        "both wait for the other proxy"
    );
    let stored = "SELECT count(*) FROM qbridge.job_keys WHERE key IN ('k-multi', 'k-waits')";
    assert_eq!(count(&pool, stored).await, 0);
    catches_up(&pool, behind).await;
    assert_eq!(
        waiting.await.unwrap(),
        Ok(1),
        "stored once every proxy follows"
    );
    assert_eq!(in_multi.await.unwrap(), Ok(("OK".to_string(), 1)));
    let live =
        "SELECT count(*) FROM qbridge.jobs WHERE key IN ('k-multi', 'k-waits') AND copy = 'live'";
    assert_eq!(count(&pool, live).await, 2);
    side.stop().await;
    delete_keys(&[&list, &other, &format!("qbridge:*:{route}*")]).await;
}

/// A second push inside a MULTI whose first push was routed before the
/// flip cannot wait: the first push's count, held until EXEC, is what this
/// proxy's own following of the flip waits for. It is not answered alone
/// either (EXEC would run the rest: RQ's scheduler removes a job from a
/// registry and pushes it in one MULTI): Redis discards the whole
/// transaction.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_second_push_of_a_multi_across_the_flip_aborts_the_transaction(pool: PgPool) {
    let metrics = qbridge::telemetry::prometheus();
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (side, route, list, behind) = with_a_proxy_behind(&pool, id).await;
    let mut conn = ::redis::Client::open(side.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = ::redis::cmd("MULTI").query_async(&mut conn).await.unwrap();
    let queued: String = ::redis::cmd("LPUSH")
        .arg(&list)
        .arg(&br#"{"id":"k-first"}"#[..])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(queued, "QUEUED");
    flip_and_wait(&pool, &route, &side).await;
    let second: Result<String, _> = ::redis::cmd("LPUSH")
        .arg(&list)
        .arg(&br#"{"id":"k-second"}"#[..])
        .query_async(&mut conn)
        .await;
    let error = second.expect_err("refused at once").to_string();
    assert!(error.contains("QBRIDGE.TRYAGAIN"), "{error}");
    let exec: Result<Vec<i64>, _> = ::redis::cmd("EXEC").query_async(&mut conn).await;
    let error = exec.expect_err("EXEC discards the transaction").to_string();
    assert!(error.to_uppercase().contains("EXECABORT"), "{error}");
    let refused = format!("qbridge_pushes_not_followed_total{{route=\"{route}\"}} 1");
    assert!(metrics.render().contains(&refused), "{refused}");
    let held: i64 = ::redis::cmd("LLEN")
        .arg(&list)
        .query_async(&mut redis().await)
        .await
        .unwrap();
    assert_eq!(held, 0, "none of the transaction ran");
    let stored = "SELECT count(*) FROM qbridge.job_keys WHERE key IN ('k-first', 'k-second')";
    assert_eq!(count(&pool, stored).await, 0);
    catches_up(&pool, behind).await;
    assert_eq!(
        push_through(&side, &list, br#"{"id":"k-second"}"#).await,
        Ok(1),
        "the client's retry is stored"
    );
    side.stop().await;
    delete_keys(&[&list, &format!("qbridge:*:{route}*")]).await;
}
