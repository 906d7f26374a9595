//! Routes match a key in their own database only: the same list name under
//! another SELECT index is another application's list, forwarded untouched.
//! The database is Redis's answer (a refused SELECT changes nothing), RESET
//! returns to 0, and a SELECT queued in MULTI counts from EXEC on.

use qbridge::config::RouteConfig;
use qbridge::model::Phase;
use sqlx::PgPool;

use super::harness::{self, cmd, item, Raw, REDIS};

/// The values of `key` in database `db`, read directly from Redis.
async fn list(db: &str, key: &str) -> Vec<Vec<u8>> {
    let mut direct = Raw::connect(REDIS).await;
    assert_eq!(direct.call(&["SELECT", db]).await, b"+OK\r\n");
    direct.send(&cmd(&["LRANGE", key, "0", "-1"])).await;
    direct.frames(1).await
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn pushes_are_routed_only_in_the_routes_database(pool: PgPool) {
    let prefix = harness::prefix();
    let key = format!("{prefix}:q");
    let mirrored = format!("{prefix}:m");
    let proxy = harness::start(
        &pool,
        &prefix,
        vec![
            harness::route("live", &key, Phase::PostgresOnly),
            RouteConfig {
                db: 2,
                ..harness::route("mirrored", &mirrored, Phase::DualWrite)
            },
        ],
    )
    .await;
    let mut conn = proxy.conn().await;
    // Pipelined, so the pushes are read before SELECT's reply: in db 2 the
    // db-0 route's key is Redis's (":1" is the list's length there).
    let mut p = cmd(&["SELECT", "2"]);
    p.extend(cmd(&["LPUSH", &key, &item("a")]));
    // A refused SELECT leaves the connection in db 2.
    p.extend(cmd(&["SELECT", "-1"]));
    p.extend(cmd(&["LPUSH", &key, &item("b")]));
    // db 2 is the mirrored route's database.
    p.extend(cmd(&["LPUSH", &mirrored, &item("m1")]));
    // RESET returns to db 0: routed, answered locally.
    p.extend(cmd(&["RESET"]));
    p.extend(cmd(&["LPUSH", &key, &item("c")]));
    p.extend(cmd(&["LPUSH", &mirrored, &item("not-mirrored")]));
    conn.send(&p).await;
    let replies = conn.frames(8).await;
    assert_eq!(replies[..2], [b"+OK\r\n".to_vec(), b":1\r\n".to_vec()]);
    assert!(replies[2].starts_with(b"-ERR"), "{:?}", replies[2]);
    assert_eq!(
        replies[3..],
        [
            b":2\r\n".to_vec(),
            b":1\r\n".to_vec(),
            b"+RESET\r\n".to_vec(),
            b":1\r\n".to_vec(),
            b":1\r\n".to_vec(),
        ]
    );
    // A SELECT inside MULTI: the push queued after it runs in db 2, and the
    // connection stays there after EXEC.
    let mut tx = cmd(&["MULTI"]);
    tx.extend(cmd(&["SELECT", "2"]));
    tx.extend(cmd(&["LPUSH", &key, &item("d")]));
    tx.extend(cmd(&["EXEC"]));
    tx.extend(cmd(&["LPUSH", &key, &item("e")]));
    tx.extend(cmd(&["LPUSH", &mirrored, &item("m2")]));
    tx.extend(cmd(&["SELECT", "0"]));
    tx.extend(cmd(&["LPUSH", &key, &item("f")]));
    conn.send(&tx).await;
    assert_eq!(
        conn.frames(8).await,
        [
            b"+OK\r\n".to_vec(),
            b"+QUEUED\r\n".to_vec(),
            b"+QUEUED\r\n".to_vec(),
            b"*2\r\n+OK\r\n:3\r\n".to_vec(),
            b":4\r\n".to_vec(),
            b":2\r\n".to_vec(),
            b"+OK\r\n".to_vec(),
            b":1\r\n".to_vec(),
        ]
    );
    // Local replies come after their commit: the live copies are there.
    let live: Vec<String> = harness::jobs(&pool, "live")
        .await
        .into_iter()
        .map(|j| j.0)
        .collect();
    assert_eq!(live, ["c", "f"]);
    harness::wait_for_jobs(&pool, "mirrored", 2).await;
    let copies: Vec<String> = harness::jobs(&pool, "mirrored")
        .await
        .into_iter()
        .map(|j| j.0)
        .collect();
    assert_eq!(copies, ["m1", "m2"]);
    let in_db2 = [item("e"), item("d"), item("b"), item("a")];
    let mut want = format!("*{}\r\n", in_db2.len());
    for i in &in_db2 {
        want.push_str(&format!("${}\r\n{i}\r\n", i.len()));
    }
    assert_eq!(list("2", &key).await, [want.into_bytes()]);
    assert_eq!(list("0", &key).await, [b"*0\r\n".to_vec()]);
    let mut direct = Raw::connect(REDIS).await;
    direct.send(&cmd(&["SELECT", "2"])).await;
    direct.send(&cmd(&["DEL", &key, &mirrored])).await;
    direct.frames(2).await;
    proxy.stop().await;
}
