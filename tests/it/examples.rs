//! The programs in `examples/` run for real against the shared Postgres and
//! Redis: the Python handler as a route's handler under `qbridge run` in
//! `shadow` (each job's side effect happens once, shadow calls leave none,
//! and the two sides' digests agree once `/processed_at` is ignored), the
//! Python producer through the RESP proxy, and the Rust producer example
//! enqueueing in a business transaction. python3 with redis-py is required
//! (`scripts/services.sh` installs redis-py).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use ::redis::AsyncCommands;
use bytes::Bytes;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use qbridge::app::RedisSide;
use qbridge::app::Runtime;
use qbridge::config::{Config, Overrides};
use qbridge::cutover::watch;
use qbridge::periodic::Services;
use qbridge::redis::producer::Producer;
use qbridge::routes::Routes;

use crate::support;

const REDIS: &str = "redis://127.0.0.1:6379";
const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");

/// Panics with what to install unless python3 (and, with `redis_py`,
/// redis-py) is there: these tests exist to run the examples.
fn require_python(redis_py: bool) {
    let check = if redis_py { "import redis" } else { "pass" };
    let ok = std::process::Command::new("python3")
        .args(["-c", check])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the examples tests need python3{}: install python3 and run ./scripts/services.sh (it installs redis-py)",
        if redis_py { " with redis-py" } else { "" }
    );
}

fn unique() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn overrides(pool: &PgPool) -> Overrides {
    Overrides {
        database_url: Some(support::db_url(pool)),
        redis_url: Some(REDIS.into()),
        ..Overrides::default()
    }
}

async fn redis() -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("redis")
}

/// Deletes `lists` and qbridge's own Redis keys of `routes`.
async fn delete_redis_keys(lists: &[&str], routes: &[&str]) {
    let mut conn = redis().await;
    let mut keys: Vec<String> = lists.iter().map(|s| s.to_string()).collect();
    for route in routes {
        let mine: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("qbridge:*:{route}*"))
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        keys.extend(mine);
    }
    let _: i64 = conn.del(&keys).await.unwrap_or(0);
}

/// Runs a program to completion (at most `limit`), panicking with its output
/// unless it succeeds; returns its stdout.
async fn run_ok(cmd: &mut Command, what: &str, limit: Duration) -> String {
    cmd.kill_on_drop(true).stdin(Stdio::null());
    let out: Output = tokio::time::timeout(limit, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
        .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

// --- examples/python/handler.py ----------------------------------------------

/// handler.py on a port of its own choosing (PORT=0); killed when dropped.
struct PythonHandler {
    child: Child,
    url: String,
}

impl PythonHandler {
    async fn start(ledger: &Path) -> PythonHandler {
        let mut child = Command::new("python3")
            .arg(format!("{EXAMPLES}/python/handler.py"))
            .env("PORT", "0")
            .env("LEDGER", ledger)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs handler.py");
        // Its one start-up line names the address, once it listens.
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("handler.py prints its start-up line within 10s")
            .unwrap()
            .expect("handler.py exited before listening");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {line:?}"))
            .to_string();
        PythonHandler { child, url }
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// One route in `shadow` served by `url`, with both consumers.
fn shadow_route(name: &str, list: &str, url: &str, ignore_processed_at: bool) -> String {
    let ignore = if ignore_processed_at {
        r#"["/processed_at"]"#
    } else {
        "[]"
    };
    format!(
        r#"
[[routes]]
name = "{name}"
redis_key = "{list}"
queue = "{name}"
format = "json:/id"
phase = "shadow"
max_attempts = 3
handler = {{ type = "http", url = "{url}" }}
pool = {{ poll_interval = "50ms", concurrency = 4 }}
redis_consumer = {{ concurrency = 2, max_attempts = 3, consumer_name = "c{name}", retry_delay = "20ms" }}
shadow = {{ noise_sample = 0.0 }}
diff = {{ ignore_fields = {ignore} }}
"#
    )
}

/// Digests of `queue`'s ok outcomes: key → (Redis live, Postgres shadow).
async fn digests(pool: &PgPool, queue: &str) -> HashMap<String, (String, String)> {
    let rows: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT key, side, mode, digest FROM qbridge.outcomes WHERE queue = $1 AND outcome = 'ok'",
    )
    .bind(queue)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut by_key: HashMap<String, (String, String)> = HashMap::new();
    for (key, side, mode, digest) in rows {
        let digest = digest.unwrap_or_else(|| panic!("no digest for {key} ({side}/{mode})"));
        let entry = by_key.entry(key).or_default();
        match (side.as_str(), mode.as_str()) {
            ("redis", "live") => entry.0 = digest,
            ("postgres", "shadow") => entry.1 = digest,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    by_key
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn python_handler_runs_each_job_live_once_and_shadow_calls_leave_no_trace(pool: PgPool) {
    require_python(false);
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.txt");
    let handler = PythonHandler::start(&ledger).await;

    // Two routes on the same handler: one ignores /processed_at in its
    // digests (as examples/README.md says to), one does not.
    let id = &unique()[..12];
    let (route, raw) = (format!("exh{id}"), format!("exr{id}"));
    let (list, raw_list) = (format!("qbt:{id}:handler"), format!("qbt:{id}:raw"));
    let toml = format!(
        "max_connections = 8\nshutdown_deadline = \"5s\"\n{}{}",
        shadow_route(&route, &list, &handler.url, true),
        shadow_route(&raw, &raw_list, &handler.url, false)
    );
    let config = Config::from_toml(&toml, &overrides(&pool)).expect("config");

    let watch_stop = CancellationToken::new();
    let (view, _) = watch::attach(
        &pool,
        Some(&crate::support::db_url(&pool)),
        &config.routes,
        "test",
        &watch_stop,
    )
    .await
    .expect("phases registered");
    let producer = Producer::connect(
        pool.clone(),
        Some(REDIS),
        Routes::new(&config.routes, view),
        1 << 20,
    )
    .await
    .expect("producer");

    let mut rt = Runtime::build(config.clone()).await.expect("runtime");
    rt.serve_http = false;
    rt.gauge_interval = Duration::from_secs(3600);
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { rt.run_until_stopped(stop).await.expect("runtime runs") }
    });

    // shadow: each item goes to the Redis list (live run by the Redis
    // consumer) and becomes a mirror copy in Postgres (shadow call).
    let mut all_keys = Vec::new();
    for name in [&route, &raw] {
        let keys: Vec<String> = (0..5).map(|i| format!("{name}-{i}")).collect();
        let items = keys
            .iter()
            .map(|k| Bytes::from(format!(r#"{{"id":"{k}","amount":{}}}"#, k.len())))
            .collect();
        producer.enqueue(name, items).await.expect("enqueue");
        all_keys.extend(keys);
    }
    let queues = vec![route.clone(), raw.clone()];
    support::wait_for(
        "a Redis live and a Postgres shadow outcome per job",
        Duration::from_secs(30),
        || {
            let (pool, queues) = (pool.clone(), queues.clone());
            async move {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(DISTINCT (key, side, mode)) FROM qbridge.outcomes \
                      WHERE queue = ANY($1) AND outcome = 'ok' \
                        AND ((side = 'redis' AND mode = 'live') OR (side = 'postgres' AND mode = 'shadow'))",
                )
                .bind(&queues)
                .fetch_one(&pool)
                .await
                .unwrap();
                n == 20
            }
        },
    )
    .await;
    stop.cancel();
    run.await.unwrap();
    watch_stop.cancel();

    // Every attempt succeeded on its first try, and Postgres ran nothing live.
    let (others, attempts): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE outcome <> 'ok' OR (side = 'postgres' AND mode = 'live')), \
                count(*) FROM qbridge.outcomes",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (others, attempts),
        (0, 20),
        "one ok outcome per job and side"
    );

    // The side effect happened once per job: live calls only.
    let text = std::fs::read_to_string(&ledger).expect("the ledger was written");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    let mut expected: Vec<&str> = all_keys.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(lines, expected, "each job key once in the ledger");

    // With /processed_at ignored the two sides' answers digest the same...
    let ignored = digests(&pool, &route).await;
    assert_eq!(ignored.len(), 5);
    for (key, (live, shadow)) in &ignored {
        assert_eq!(
            live, shadow,
            "{key}: digests differ with /processed_at ignored"
        );
    }
    // ...and without it they never do: the field the README says to ignore.
    let raw_digests = digests(&pool, &raw).await;
    assert_eq!(raw_digests.len(), 5);
    for (key, (live, shadow)) in &raw_digests {
        assert!(
            !live.is_empty() && !shadow.is_empty(),
            "{key}: a side is missing"
        );
        assert_ne!(
            live, shadow,
            "{key}: processed_at should make the raw digests differ"
        );
    }

    handler.stop().await;
    delete_redis_keys(&[&list, &raw_list], &[&route, &raw]).await;
    // Give the watch's LISTEN connection back before the database is dropped.
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// The config the README runs the Python pair with stays valid, and keeps
/// `/processed_at` out of the digests.
#[test]
fn the_python_example_config_parses() {
    let text = std::fs::read_to_string(format!("{EXAMPLES}/python/qbridge.toml")).unwrap();
    let config = Config::from_toml(&text, &Overrides::default()).expect("qbridge.toml");
    let route = &config.routes[0];
    assert_eq!(route.cutover.diff.ignore_fields, ["/processed_at"]);
    assert!(route.handler.is_some() && route.redis_consumer.is_some());
}

// --- examples/python/producer.py ---------------------------------------------

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn python_producer_through_the_proxy_reaches_redis_and_postgres(pool: PgPool) {
    require_python(true);
    let id = &unique()[..12];
    let (route, list, prefix) = (
        format!("exp{id}"),
        format!("qbt:{id}:py"),
        format!("py{id}"),
    );
    let toml = format!(
        "[proxy]\nenabled = true\n\
         [[routes]]\nname = \"{route}\"\nredis_key = \"{list}\"\nqueue = \"{route}\"\n\
         format = \"json:/id\"\nphase = \"dual_write\"\n"
    );
    let cfg = Config::from_toml(&toml, &overrides(&pool)).expect("config");
    // The Redis side gets its own pool (the test's is capped at 5).
    let db = support::extra_pool(&pool, 8).await;
    let mut maintenance = Services::new();
    let intake = CancellationToken::new();
    let mut side = RedisSide::start(&cfg, &db, true, &mut maintenance)
        .await
        .expect("redis side");
    let addr = side
        .start_proxy(&cfg, Some("127.0.0.1:0"), intake.clone())
        .await
        .expect("proxy");

    let stdout = run_ok(
        Command::new("python3")
            .arg(format!("{EXAMPLES}/python/producer.py"))
            .env("REDIS_URL", format!("redis://{addr}/0"))
            .env("QUEUE_KEY", &list)
            .env("COUNT", "5")
            .env("ID_PREFIX", &prefix),
        "producer.py",
        Duration::from_secs(30),
    )
    .await;
    assert!(
        stdout.contains(&format!("pushed 5 jobs to {list}")),
        "{stdout}"
    );
    let mut expected: Vec<String> = (0..5).map(|n| format!("{prefix}-{n}")).collect();
    expected.sort();

    // dual_write: Redis has every item, as the producer wrote it...
    let mut conn = redis().await;
    let items: Vec<String> = conn.lrange(&list, 0, -1).await.unwrap();
    let mut ids: Vec<String> = items
        .iter()
        .map(|i| {
            let v: serde_json::Value = serde_json::from_str(i).expect("a JSON job");
            v["id"].as_str().expect("an id").to_string()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, expected);
    // ...and Postgres a mirror copy of each, keyed by its id.
    support::wait_for("the mirror copies", Duration::from_secs(10), || {
        let (db, route, expected) = (db.clone(), route.clone(), expected.clone());
        async move {
            let keys: Vec<String> = sqlx::query_scalar(
                // The ledger: a proxied push in dual_write has no jobs row.
                "SELECT key FROM qbridge.job_keys WHERE queue = $1 AND copy = 'mirror' ORDER BY key",
            )
            .bind(&route)
            .fetch_all(&db)
            .await
            .unwrap();
            keys == expected
        }
    })
    .await;
    let via_proxy = support::count(
        &db,
        &format!("SELECT count(*) FROM qbridge.job_keys WHERE queue = '{route}' AND via = 'proxy'"),
    )
    .await;
    assert_eq!(via_proxy, 5);

    intake.cancel();
    side.finish(Duration::from_secs(10)).await;
    maintenance.stop(Duration::from_secs(5)).await;
    db.close().await;
    delete_redis_keys(&[&list], &[&route]).await;
}

// --- examples/rust_producer.rs -----------------------------------------------

/// Builds `cargo run --example <name>`'s binary into this test binary's
/// target directory and profile (`cargo test --test it` does not build
/// examples) and returns its path, as cargo reports it.
async fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // <target dir>[/<triple>]/<profile>/deps/it-<hash>
    let profile_dir = exe.parent().and_then(Path::parent).expect("a target dir");
    let mut target_dir = profile_dir.parent().expect("a target dir");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
        "build",
        "--example",
        name,
        "--message-format=json-render-diagnostics",
    ]);
    // Without the variables cargo set for this test run: build scripts watch
    // some of them (ring: CARGO_MANIFEST_DIR), and a difference would rebuild
    // half the dependency tree here, and again in the next `cargo test`.
    for (var, _) in std::env::vars() {
        let set_for_tests = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_BIN_",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
            "OUT_DIR",
        ];
        if set_for_tests.iter().any(|p| var.starts_with(p)) {
            cmd.env_remove(var);
        }
    }
    if !target_dir.join(".rustc_info.json").exists() {
        // A cross build: the directory above the profile is the triple.
        cmd.arg("--target").arg(target_dir.file_name().unwrap());
        target_dir = target_dir.parent().unwrap();
    }
    cmd.arg("--target-dir").arg(target_dir);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
        None => {}
    }
    let stdout = run_ok(
        &mut cmd,
        &format!("cargo build --example {name}"),
        Duration::from_secs(900),
    )
    .await;
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo reported no executable for example {name}"))
}

/// Runs the Rust producer example on the test's database; returns its output
/// and the order id it printed.
async fn rust_producer(
    exe: &Path,
    pool: &PgPool,
    route: &str,
    list: &str,
    phase: &str,
) -> (String, String) {
    let stdout = run_ok(
        Command::new(exe)
            .env("QBRIDGE_DATABASE_URL", support::db_url(pool))
            .env("QBRIDGE_REDIS_URL", REDIS)
            .env("ROUTE", route)
            .env("QUEUE_KEY", list)
            .env("PHASE", phase)
            .env_remove("QUEUE"),
        "rust_producer",
        Duration::from_secs(60),
    )
    .await;
    let order = stdout
        .lines()
        .find_map(|l| l.strip_prefix("order ")?.strip_suffix(" committed"))
        .unwrap_or_else(|| panic!("no order line in {stdout:?}"))
        .to_string();
    (stdout, order)
}

/// The copies Postgres holds of job `key` on `queue`.
async fn copies(pool: &PgPool, queue: &str, key: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT copy FROM qbridge.jobs WHERE queue = $1 AND key = $2")
        .bind(queue)
        .bind(key)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn has_order(pool: &PgPool, order: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM demo_orders WHERE id::text = $1)")
        .bind(order)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn rust_producer_commits_the_order_and_its_job_together(pool: PgPool) {
    let exe = example_binary("rust_producer").await;
    let id = &unique()[..12];
    let (dual, dual_list) = (format!("exd{id}"), format!("qbt:{id}:orders-dw"));
    let (pg, pg_list) = (format!("exo{id}"), format!("qbt:{id}:orders-pg"));
    let mut conn = redis().await;

    // dual_write: the order, a mirror copy in Postgres, the item in Redis.
    let (out, order) = rust_producer(&exe, &pool, &dual, &dual_list, "dual_write").await;
    assert!(out.contains("is in phase dual_write"), "{out}");
    assert!(out.contains("redis: pushed 1, deferred 0"), "{out}");
    let key = format!("order-{order}");
    assert!(has_order(&pool, &order).await, "the order row: {out}");
    assert_eq!(copies(&pool, &dual, &key).await, ["mirror"]);
    let items: Vec<String> = conn.lrange(&dual_list, 0, -1).await.unwrap();
    assert_eq!(items.len(), 1, "{items:?}");
    let item: serde_json::Value = serde_json::from_str(&items[0]).unwrap();
    assert_eq!(item["id"], key.as_str());
    let owed = support::count(&pool, "SELECT count(*) FROM qbridge.redis_outbox").await;
    assert_eq!(owed, 0, "the push was paid, nothing left in the outbox");

    // postgres_only (a second route, first registered there): the order and
    // the live copy; Redis gets nothing.
    let (out, order) = rust_producer(&exe, &pool, &pg, &pg_list, "postgres_only").await;
    assert!(out.contains("is in phase postgres_only"), "{out}");
    assert!(out.contains("redis: pushed 0, deferred 0"), "{out}");
    assert!(has_order(&pool, &order).await, "the order row: {out}");
    assert_eq!(
        copies(&pool, &pg, &format!("order-{order}")).await,
        ["live"]
    );
    assert_eq!(conn.exists::<_, i64>(&pg_list).await.unwrap(), 0);

    // The stored phase wins over PHASE: the first route is still dual_write.
    let (out, order) = rust_producer(&exe, &pool, &dual, &dual_list, "postgres_only").await;
    assert!(out.contains("is in phase dual_write"), "{out}");
    assert_eq!(
        copies(&pool, &dual, &format!("order-{order}")).await,
        ["mirror"]
    );
    assert_eq!(conn.llen::<_, i64>(&dual_list).await.unwrap(), 2);
    assert_eq!(
        support::count(&pool, "SELECT count(*) FROM demo_orders").await,
        3
    );

    delete_redis_keys(&[&dual_list, &pg_list], &[&dual, &pg]).await;
}
