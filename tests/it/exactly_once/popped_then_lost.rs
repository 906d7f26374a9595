//! An identical item (a content-hash key) that qbridge's consumer popped
//! and numbered just before Redis restarted without persistence, and never
//! ran: the item was in the consumer's processing list, which went with
//! Redis. Its number was taken by a pop, so it was judged by the time of
//! that pop; the pop was numbered less than a second before the restart,
//! inside the whole second Redis reports its uptime in, so nothing proved
//! the loss and repair left the copy unaccounted (the randomized oracle's
//! content-hash seeds lost it). The pop now names the server that handed
//! the item out: that server being gone is the evidence.

use std::path::Path;
use std::time::Duration;

use super::process_rig::ProcessRig;
use crate::support;

const ROUTE: &str = "popped";
const LIST: &str = "qbt:popped:jobs";
const TEXT: &str = "the same text every time";

fn config(dir: &Path, redis_url: &str, proxy_port: u16) -> String {
    // The handler is slow: the process is killed while it runs, before any
    // outcome exists.
    format!(
        r#"redis_url = "{redis_url}"
state_dir = {state:?}
shutdown_deadline = "1s"
[proxy]
enabled = true
listen = "127.0.0.1:{proxy_port}"
[[routes]]
name = "{ROUTE}"
redis_key = "{LIST}"
queue = "{ROUTE}"
format = "raw"
phase = "dual_write"
handler = {{ type = "command", program = "/bin/sh", args = ["-c", "sleep 30"] }}
redis_consumer = {{ concurrency = 1, consumer_name = "popped-c1" }}
diff = {{ settle = "0s" }}
"#,
        state = dir.join("state"),
    )
}

#[tokio::test]
async fn an_identical_item_popped_just_before_redis_restarted_is_pushed_back() {
    let mut rig = ProcessRig::start(config).await;
    rig.push(LIST, TEXT).await;
    // The pop is numbered once the mirror copy is written; the process and
    // Redis die at once after it, well inside Redis's uptime second.
    let db = rig.db.clone();
    support::wait_for("the numbered pop", Duration::from_secs(20), || async {
        let pops: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM qbridge.numbered_writes WHERE queue = $1 AND side = 'pop'",
        )
        .bind(ROUTE)
        .fetch_one(&db)
        .await
        .unwrap_or(0);
        pops == 1
    })
    .await;
    rig.kill_process().await;
    rig.redis.kill();
    rig.redis.resume();

    let report = rig.repair(ROUTE).await;
    assert_eq!(
        report["repair"]["repushed"], 1,
        "the copy the restart took is pushed back: {report}"
    );
    assert_eq!(
        report["repair"]["unaccounted"], 0,
        "nothing is left unaccounted: {report}"
    );
    let waiting: Vec<String> = ::redis::cmd("LRANGE")
        .arg(LIST)
        .arg(0)
        .arg(-1)
        .query_async(&mut rig.direct().await)
        .await
        .unwrap();
    assert_eq!(waiting, vec![TEXT.to_string()], "the text waits to run");
}
