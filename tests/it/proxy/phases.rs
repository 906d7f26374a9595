//! Routed pushes through the proxy, by phase: mirrored in `dual_write`,
//! stored as live copies (and not forwarded) in `postgres_only`, settled by
//! EXEC inside MULTI, and nothing half-mirrored when a client dies.

use std::time::Duration;

use qbridge::model::Phase;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use super::harness::{self, cmd, item, Raw, REDIS};
use crate::support;

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn dual_write_pushes_become_exactly_n_mirror_copies(pool: PgPool) {
    let prefix = harness::prefix();
    let key = format!("{prefix}:jobs");
    let proxy = harness::start(
        &pool,
        &prefix,
        vec![harness::route("jobs", &key, Phase::DualWrite)],
    )
    .await;
    // 4 connections × 25 pipelined commands × 2 items, LPUSH and RPUSH.
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..4 {
        let (mut conn, key) = (proxy.conn().await, key.clone());
        clients.spawn(async move {
            let mut pipeline = Vec::new();
            for i in 0..25 {
                let verb = if i % 2 == 0 { "LPUSH" } else { "RPUSH" };
                pipeline.extend(cmd(&[
                    verb,
                    &key,
                    &item(&format!("c{c}-{i}-a")),
                    &item(&format!("c{c}-{i}-b")),
                ]));
            }
            conn.send(&pipeline).await;
            for reply in conn.frames(25).await {
                assert_eq!(reply[0], b':', "{}", String::from_utf8_lossy(&reply));
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.expect("client");
    }
    // LPUSHX on the existing list is mirrored like LPUSH.
    let mut conn = proxy.conn().await;
    assert_eq!(
        conn.call(&["LPUSHX", &key, &item("x-last")]).await,
        b":201\r\n"
    );
    harness::wait_for_jobs(&pool, "jobs", 201).await;

    let mut direct = Raw::connect(REDIS).await;
    assert_eq!(direct.call(&["LLEN", &key]).await, b":201\r\n");
    let jobs = harness::jobs(&pool, "jobs").await;
    assert!(jobs.iter().all(|(_, copy, _)| copy == "mirror"));
    let mut expected: Vec<(String, Vec<u8>)> = (0..4)
        .flat_map(|c| (0..25).flat_map(move |i| ["a", "b"].map(|s| format!("c{c}-{i}-{s}"))))
        .chain(["x-last".to_string()])
        .map(|id| (id.clone(), item(&id).into_bytes()))
        .collect();
    expected.sort();
    let got: Vec<(String, Vec<u8>)> = jobs.into_iter().map(|(k, _, o)| (k, o)).collect();
    assert_eq!(got, expected);
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn lpushx_on_a_missing_list_is_not_mirrored(pool: PgPool) {
    let prefix = harness::prefix();
    let key = format!("{prefix}:jobs");
    let proxy = harness::start(
        &pool,
        &prefix,
        vec![harness::route("jobs", &key, Phase::DualWrite)],
    )
    .await;
    let mut conn = proxy.conn().await;
    assert_eq!(
        conn.call(&["RPUSHX", &key, &item("nothing")]).await,
        b":0\r\n"
    );
    // A later push commits through the same single writer: a barrier.
    assert_eq!(conn.call(&["LPUSH", &key, &item("real")]).await, b":1\r\n");
    harness::wait_for_jobs(&pool, "jobs", 1).await;
    assert_eq!(harness::jobs(&pool, "jobs").await[0].0, "real");
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn multi_exec_mirrors_only_what_ran(pool: PgPool) {
    let prefix = harness::prefix();
    let key = format!("{prefix}:jobs");
    // A second route whose key holds a string: its push fails inside EXEC.
    let wrong = format!("{prefix}:wrongtype");
    let routes = vec![
        harness::route("jobs", &key, Phase::DualWrite),
        harness::route("other", &wrong, Phase::DualWrite),
    ];
    let proxy = harness::start(&pool, &prefix, routes).await;
    let watched = format!("{prefix}:watched");
    let mut direct = Raw::connect(REDIS).await;
    assert_eq!(direct.call(&["SET", &wrong, "a string"]).await, b"+OK\r\n");
    let mut conn = proxy.conn().await;

    // Aborted by WATCH: nil, nothing mirrored.
    assert_eq!(conn.call(&["WATCH", &watched]).await, b"+OK\r\n");
    assert_eq!(conn.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(
        conn.call(&["LPUSH", &key, &item("watched")]).await,
        b"+QUEUED\r\n"
    );
    assert_eq!(direct.call(&["SET", &watched, "changed"]).await, b"+OK\r\n");
    assert_eq!(conn.call(&["EXEC"]).await, b"*-1\r\n");
    // DISCARD: nothing.
    assert_eq!(conn.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(
        conn.call(&["LPUSH", &key, &item("discarded")]).await,
        b"+QUEUED\r\n"
    );
    assert_eq!(conn.call(&["DISCARD"]).await, b"+OK\r\n");
    // EXECABORT (a command refused while queuing): nothing.
    assert_eq!(conn.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(
        conn.call(&["LPUSH", &key, &item("execabort")]).await,
        b"+QUEUED\r\n"
    );
    assert!(conn
        .call(&["NOSUCHCOMMAND"])
        .await
        .starts_with(b"-ERR unknown command"));
    assert!(conn.call(&["EXEC"]).await.starts_with(b"-EXECABORT"));
    // A transaction that runs: only the push whose element is an integer.
    let mut tx = cmd(&["MULTI"]);
    tx.extend(cmd(&["LPUSH", &key, &item("ran")]));
    tx.extend(cmd(&["LPUSH", &wrong, &item("wrongtype")]));
    tx.extend(cmd(&["INCR", &watched]));
    tx.extend(cmd(&["EXEC"]));
    conn.send(&tx).await;
    let replies = conn.frames(5).await;
    assert_eq!(
        &replies[..4],
        [
            b"+OK\r\n".to_vec(),
            b"+QUEUED\r\n".to_vec(),
            b"+QUEUED\r\n".to_vec(),
            b"+QUEUED\r\n".to_vec()
        ]
    );
    let exec = String::from_utf8_lossy(&replies[4]).to_string();
    assert!(exec.starts_with("*3\r\n:1\r\n-WRONGTYPE"), "{exec}");
    assert!(
        exec.ends_with("-ERR value is not an integer or out of range\r\n"),
        "{exec}"
    );
    harness::wait_for_jobs(&pool, "jobs", 1).await;
    let jobs = harness::jobs(&pool, "jobs").await;
    assert_eq!(
        jobs,
        vec![(
            "ran".to_string(),
            "mirror".to_string(),
            item("ran").into_bytes()
        )]
    );
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.job_keys").await,
        1
    );
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn postgres_only_pushes_are_live_copies_not_in_redis(pool: PgPool) {
    let prefix = harness::prefix();
    let key = format!("{prefix}:jobs");
    let proxy = harness::start(
        &pool,
        &prefix,
        vec![harness::route("jobs", &key, Phase::PostgresOnly)],
    )
    .await;
    let mut conn = proxy.conn().await;
    let other = format!("{prefix}:plain");
    // Pipelined: local replies land in their place among Redis's.
    let mut pipeline = cmd(&["LPUSH", &key, &item("p1"), &item("p2")]);
    pipeline.extend(cmd(&["SET", &other, "v"]));
    pipeline.extend(cmd(&["RPUSHX", &key, &item("p3")]));
    pipeline.extend(cmd(&["GET", &other]));
    conn.send(&pipeline).await;
    assert_eq!(
        conn.frames(4).await,
        vec![
            b":2\r\n".to_vec(),
            b"+OK\r\n".to_vec(),
            b":1\r\n".to_vec(),
            b"$1\r\nv\r\n".to_vec()
        ]
    );
    // MULTI mixing Redis commands and local pushes: EXEC's array is spliced.
    let mut tx = cmd(&["MULTI"]);
    tx.extend(cmd(&["LPUSH", &key, &item("t1")]));
    tx.extend(cmd(&["INCR", &format!("{prefix}:n")]));
    tx.extend(cmd(&["RPUSH", &key, &item("t2"), &item("t3")]));
    tx.extend(cmd(&["EXEC"]));
    // Only local pushes: Redis answers *0, the proxy its own elements.
    tx.extend(cmd(&["MULTI"]));
    tx.extend(cmd(&["LPUSH", &key, &item("t4")]));
    tx.extend(cmd(&["EXEC"]));
    conn.send(&tx).await;
    let replies = conn.frames(8).await;
    let queued = b"+QUEUED\r\n".to_vec();
    assert_eq!(
        &replies[..4],
        [
            b"+OK\r\n".to_vec(),
            queued.clone(),
            queued.clone(),
            queued.clone()
        ]
    );
    assert_eq!(replies[4], b"*3\r\n:1\r\n:1\r\n:2\r\n");
    assert_eq!(
        replies[5..],
        [b"+OK\r\n".to_vec(), queued, b"*1\r\n:1\r\n".to_vec()]
    );
    // Aborted by WATCH: nothing stored.
    let watched = format!("{prefix}:watched");
    let mut direct = Raw::connect(REDIS).await;
    assert_eq!(conn.call(&["WATCH", &watched]).await, b"+OK\r\n");
    assert_eq!(conn.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(
        conn.call(&["LPUSH", &key, &item("aborted")]).await,
        b"+QUEUED\r\n"
    );
    assert_eq!(direct.call(&["SET", &watched, "x"]).await, b"+OK\r\n");
    assert_eq!(conn.call(&["EXEC"]).await, b"*-1\r\n");
    // Replies came after the commits, so the rows are there now.
    let jobs = harness::jobs(&pool, "jobs").await;
    let keys: Vec<&str> = jobs.iter().map(|j| j.0.as_str()).collect();
    assert_eq!(keys, ["p1", "p2", "p3", "t1", "t2", "t3", "t4"]);
    assert!(jobs
        .iter()
        .all(|(k, copy, original)| copy == "live" && *original == item(k).into_bytes()));
    assert_eq!(direct.call(&["EXISTS", &key]).await, b":0\r\n");
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn postgres_only_without_postgres_answers_an_error(pool: PgPool) {
    let prefix = harness::prefix();
    let key = format!("{prefix}:jobs");
    // A pool on a port nothing listens on: every store fails fast.
    let dead = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy("postgres://postgres@127.0.0.1:1/nothing")
        .expect("lazy pool");
    let proxy = harness::start(
        &dead,
        &prefix,
        vec![harness::route("jobs", &key, Phase::PostgresOnly)],
    )
    .await;
    let mut conn = proxy.conn().await;
    let reply =
        String::from_utf8_lossy(&conn.call(&["LPUSH", &key, &item("lost")]).await).to_string();
    assert!(reply.starts_with("-ERR qbridge: "), "{reply}");
    assert!(
        reply.ends_with("\r\n") && reply.matches('\n').count() == 1,
        "{reply}"
    );
    // The connection goes on, and nothing reached Redis.
    assert_eq!(conn.call(&["PING"]).await, b"+PONG\r\n");
    let mut direct = Raw::connect(REDIS).await;
    assert_eq!(direct.call(&["EXISTS", &key]).await, b":0\r\n");
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM qbridge.job_keys").await,
        0
    );
    proxy.stop().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_client_killed_mid_pipeline_leaves_no_half_mirrored_batch(pool: PgPool) {
    let prefix = harness::prefix();
    let key = format!("{prefix}:jobs");
    let proxy = harness::start(
        &pool,
        &prefix,
        vec![harness::route("jobs", &key, Phase::DualWrite)],
    )
    .await;
    let name = format!("{prefix}killed");
    let mut conn = proxy.conn().await;
    // Name the upstream connection and wait for the answer first: otherwise
    // the wait below could see "no such name" before the proxy had even
    // connected upstream (its AUTH probe comes first) and read Redis too early.
    assert_eq!(conn.call(&["CLIENT", "SETNAME", &name]).await, b"+OK\r\n");
    let mut pipeline = Vec::new();
    for i in 0..300 {
        pipeline.extend(cmd(&["LPUSH", &key, &item(&format!("k{i}"))]));
    }
    let partial = cmd(&["LPUSH", &key, &item("partial")]);
    pipeline.extend_from_slice(&partial[..partial.len() / 2]);
    conn.send(&pipeline).await;
    // Killed: a reset, without reading a single reply.
    conn.stream.set_zero_linger().expect("linger");
    drop(conn);
    // Wait until Redis has seen the upstream connection go.
    support::wait_for(
        "the upstream connection to close",
        Duration::from_secs(10),
        || async {
            !harness::client_list()
                .await
                .contains(&format!("name={name} "))
        },
    )
    .await;
    let mut direct = Raw::connect(REDIS).await;
    // Every item Redis took is mirrored; the half-sent one is nowhere.
    direct.send(&cmd(&["LRANGE", &key, "0", "-1"])).await;
    let in_redis = String::from_utf8_lossy(&direct.frames(1).await[0]).to_string();
    let mut redis_ids: Vec<String> = (0..300)
        .map(|i| format!("k{i}"))
        .filter(|id| in_redis.contains(&item(id)))
        .collect();
    assert!(!in_redis.contains("partial"));
    assert!(!redis_ids.is_empty(), "Redis ran none of the pipeline");
    harness::wait_for_jobs(&pool, "jobs", redis_ids.len() as i64).await;
    let mut mirrored: Vec<String> = harness::jobs(&pool, "jobs")
        .await
        .into_iter()
        .map(|j| j.0)
        .collect();
    redis_ids.sort();
    mirrored.sort();
    assert_eq!(mirrored, redis_ids);
    proxy.stop().await;
}

/// A push in dual_write on a route that records mirror copies in
/// the ledger (`[routes.shadow] dual_write = "ledger"`, the default) is
/// recorded there alone — key, copy and bytes, all the diff and repair read —
/// and gets no jobs row; a push the Postgres side will claim (`"skip"`:
/// drained without a call, proving claims; `"shadow"`; the shadow phase)
/// keeps its row.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn only_pushes_the_postgres_side_claims_get_a_jobs_row(pool: PgPool) {
    use qbridge::config::DualWriteMirrors;
    let prefix = harness::prefix();
    let route = |name: &str, phase, mirrors| {
        let mut r = harness::route(name, &format!("{prefix}:{name}"), phase);
        r.cutover.shadow.dual_write = mirrors;
        r
    };
    let routes = vec![
        harness::route("ledger", &format!("{prefix}:ledger"), Phase::DualWrite),
        route("drained", Phase::DualWrite, DualWriteMirrors::Skip),
        route("called", Phase::DualWrite, DualWriteMirrors::Shadow),
        harness::route("shadowed", &format!("{prefix}:shadowed"), Phase::Shadow),
    ];
    let proxy = harness::start(&pool, &prefix, routes).await;
    let mut conn = proxy.conn().await;
    for route in ["ledger", "drained", "called", "shadowed"] {
        let (a, b) = (item(&format!("{route}-a")), item(&format!("{route}-b")));
        let key = format!("{prefix}:{route}");
        assert_eq!(conn.call(&["LPUSH", &key, &a, &b]).await, b":2\r\n");
        harness::wait_for_jobs(&pool, route, 2).await;
        // Every push is in the ledger as a mirror copy with its bytes.
        let ledger = harness::jobs(&pool, route).await;
        let expected: Vec<(String, String, Vec<u8>)> =
            [(format!("{route}-a"), a), (format!("{route}-b"), b)]
                .into_iter()
                .map(|(k, bytes)| (k, "mirror".to_string(), bytes.into_bytes()))
                .collect();
        assert_eq!(ledger, expected, "{route}");
    }
    let rows = |route: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM qbridge.jobs WHERE queue = $1")
                .bind(route)
                .fetch_one(&pool)
                .await
                .expect("count")
        }
    };
    assert_eq!(rows("ledger").await, 0, "a ledger entry has no row");
    assert_eq!(
        rows("drained").await,
        2,
        "\"skip\" drains rows: claims are proven"
    );
    assert_eq!(
        rows("called").await,
        2,
        "shadow calls in dual_write need rows"
    );
    assert_eq!(rows("shadowed").await, 2, "shadow calls need rows");
    proxy.stop().await;
}
