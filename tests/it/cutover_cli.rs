//! The operator's side of the cutover, through the real binary and the HTTP
//! router: `qbridge cutover status|advance|rollback` and `qbridge diff` with a
//! config file on the test's database and the shared Redis, and
//! `GET /v1/routes/{route}/diff`. Gates refuse with their failing numbers,
//! overrides and rollbacks need a reason and are audited, bad input is a
//! one-line error with a non-zero exit code (or a 4xx JSON error).

use std::process::Output;

use ::redis::AsyncCommands;
use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::PgPool;

use qbridge::config::{Config, Overrides};
use qbridge::cutover::store;
use qbridge::http::{router, AppState};
use qbridge::model::Phase;
use qbridge::redis::producer::Producer;
use qbridge::routes::Routes;

use crate::support;

const REDIS: &str = "redis://127.0.0.1:6379";

/// A route on a fresh Redis key, its config file, and the binary run on the
/// test's database.
struct Setup {
    _dir: tempfile::TempDir,
    config_path: String,
    toml: String,
    db_url: String,
    name: String,
    list: String,
}

impl Setup {
    /// A `dual_write` route (unless `phase` says otherwise) whose gates need
    /// 5 jobs in a 1 minute window.
    fn new(pool: &PgPool, phase: Phase) -> Setup {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("cli{}", &id[..12]);
        let list = format!("qbt:{id}:list");
        let toml = format!(
            r#"[[routes]]
name = "{name}"
redis_key = "{list}"
queue = "{name}"
format = "json:/id"
phase = "{phase}"
[routes.diff]
settle = "1s"
[routes.gates]
window = "1m"
min_jobs = 5
quiet_period = "1s"
"#
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qbridge.toml");
        std::fs::write(&path, &toml).unwrap();
        Setup {
            config_path: path.to_string_lossy().into_owned(),
            _dir: dir,
            toml,
            db_url: support::db_url(pool),
            name,
            list,
        }
    }

    /// Runs `qbridge --config … --database-url … --redis-url … <args>`, away
    /// from the caller's QBRIDGE_* settings.
    async fn run(&self, args: &[&str]) -> Output {
        let mut all = vec![
            "--config",
            &self.config_path,
            "--database-url",
            &self.db_url,
            "--redis-url",
            REDIS,
        ];
        all.extend_from_slice(args);
        tokio::process::Command::new(env!("CARGO_BIN_EXE_qbridge"))
            .args(&all)
            .env_remove("QBRIDGE_DATABASE_URL")
            .env_remove("QBRIDGE_CONFIG")
            .env_remove("QBRIDGE_HTTP_LISTEN")
            .env_remove("QBRIDGE_REDIS_URL")
            .env_remove("QBRIDGE_PROXY_LISTEN")
            .env_remove("QBRIDGE_OPERATOR")
            .env("QBRIDGE_LOG_FORMAT", "text")
            .output()
            .await
            .expect("qbridge runs")
    }

    /// The route table of the config, phases as configured.
    fn routes(&self) -> Routes {
        let cfg = Config::from_toml(&self.toml, &Overrides::default()).expect("config");
        Routes::from_config(&cfg.routes)
    }

    /// A producer of the route (it writes both sides in `dual_write`).
    async fn producer(&self, pool: &PgPool) -> Producer {
        Producer::connect(pool.clone(), Some(REDIS), self.routes(), 1 << 20)
            .await
            .expect("producer on the shared Redis")
    }

    /// Enqueues `{"id": key}` items through the producer API.
    async fn produce(&self, pool: &PgPool, keys: &[&str]) {
        let items = keys
            .iter()
            .map(|k| Bytes::from(format!(r#"{{"id":"{k}"}}"#)))
            .collect();
        let done = self
            .producer(pool)
            .await
            .enqueue(&self.name, items)
            .await
            .expect("enqueue");
        assert_eq!(done.pushed, keys.len());
    }

    /// LPUSHes an item behind qbridge's back: it is never mirrored.
    async fn push_behind_qbridge(&self, key: &str) {
        let _: i64 = redis()
            .await
            .lpush(&self.list, format!(r#"{{"id":"{key}"}}"#))
            .await
            .unwrap();
    }

    async fn stored_phase(&self, pool: &PgPool) -> Phase {
        store::current(pool, &self.name)
            .await
            .unwrap()
            .expect("the route is registered")
            .phase
    }

    /// Deletes the route's Redis keys.
    async fn cleanup(&self) {
        let mut conn = redis().await;
        let mut keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("qbridge:*:{}*", self.name))
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        keys.push(self.list.clone());
        let _: i64 = conn.del(&keys).await.unwrap_or(0);
    }
}

async fn redis() -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("shared Redis on 6379")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one error line of a failed run (log lines may come before it); panics
/// unless the run failed with exactly one `error:` line, last on stderr.
fn error_line(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line expected: {stderr}");
    let last = support::last_line(&stderr);
    assert_eq!(last, errors[0], "the error is the last line: {stderr}");
    last.to_string()
}

/// The one JSON error line of a failed `--json` run.
fn json_error(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = support::last_line(&stderr);
    let v: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("stderr does not end in one JSON line ({e}): {stderr}"));
    v["error"].as_str().expect("an error field").to_string()
}

fn json_stdout(out: &Output) -> Value {
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", stdout(out)))
}

/// (from, to, forced, reason, changed_by, gates) of every audit row after the
/// registration, in order.
type AuditRow = (
    Option<String>,
    String,
    bool,
    Option<String>,
    String,
    Option<Value>,
);

async fn audit(pool: &PgPool, route: &str) -> Vec<AuditRow> {
    sqlx::query_as(
        "SELECT from_phase, to_phase, forced, reason, changed_by, gates \
           FROM qbridge.phase_audit WHERE route = $1 AND from_phase IS NOT NULL ORDER BY id",
    )
    .bind(route)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn status_lists_each_route_with_its_phase_and_next_step(pool: PgPool) {
    let s = Setup::new(&pool, Phase::DualWrite);

    let out = s.run(&["cutover", "status"]).await;
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    for column in [
        "route",
        "phase",
        "since",
        "changed by",
        "also waiting in",
        "next",
    ] {
        assert!(header.contains(column), "no {column:?} column: {text}");
    }
    let row = lines
        .find(|l| l.starts_with(&s.name))
        .unwrap_or_else(|| panic!("no row for {}: {text}", s.name));
    assert!(row.contains("dual_write"), "{row}");
    // Nothing was pushed: the next step's gate refuses and says why.
    assert!(
        row.contains("dual_write → shadow: refuses") && row.contains("redis-side jobs in window 0"),
        "{row}"
    );
    // Status registered the route from the config.
    assert_eq!(s.stored_phase(&pool).await, Phase::DualWrite);

    let out = s.run(&["--json", "cutover", "status"]).await;
    let v = json_stdout(&out);
    let routes = v["routes"].as_array().expect("a routes array");
    assert_eq!(routes.len(), 1, "{v}");
    let state = &routes[0]["state"];
    assert_eq!(state["route"], s.name.as_str(), "{v}");
    assert_eq!(state["phase"], "dual_write", "{v}");
    let gate = &routes[0]["gate"];
    assert_eq!(
        (gate["from"].as_str(), gate["to"].as_str()),
        (Some("dual_write"), Some("shadow"))
    );
    let checks = gate["checks"].as_array().expect("the gate's checks");
    let jobs = checks
        .iter()
        .find(|c| c["name"] == "redis-side jobs in window")
        .unwrap_or_else(|| panic!("{gate}"));
    assert_eq!(
        (&jobs["passed"], &jobs["value"], &jobs["needs"]),
        (&Value::Bool(false), &Value::from("0"), &Value::from(">= 5"))
    );

    // A route at the last phase has no next step.
    for (from, to) in [
        (Phase::DualWrite, Phase::Shadow),
        (Phase::Shadow, Phase::PostgresOnly),
        (Phase::PostgresOnly, Phase::Decommissioned),
    ] {
        store::transition(
            &pool,
            &store::Change {
                route: &s.name,
                from,
                to,
                changed_by: "test",
                reason: "walk to the end",
                forced: true,
                gates: Value::Null,
            },
        )
        .await
        .unwrap();
    }
    let out = s.run(&["--json", "cutover", "status"]).await;
    let v = json_stdout(&out);
    assert_eq!(v["routes"][0]["state"]["phase"], "decommissioned", "{v}");
    // A decommissioned route's "gate" only says whether Redis is still empty.
    assert_eq!(v["routes"][0]["gate"]["to"], "decommissioned", "{v}");
    assert_eq!(
        v["routes"][0]["gate"]["checks"][0]["passed"],
        Value::Bool(true),
        "{v}"
    );
    let out = s.run(&["cutover", "status"]).await;
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let row = text.lines().find(|l| l.starts_with(&s.name)).unwrap();
    assert!(
        row.contains("decommissioned") && row.trim_end().ends_with("archived; Redis empty"),
        "{row}"
    );
    s.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_refused_advance_prints_the_failing_numbers_and_force_needs_a_reason(pool: PgPool) {
    let s = Setup::new(&pool, Phase::DualWrite);
    // Registers the route, so its window starts now.
    assert!(s.run(&["cutover", "status"]).await.status.success());
    // Two mirrored jobs and one that never reached Postgres: 3 Redis-side
    // jobs (the gate needs 5), completeness 2/3.
    s.produce(&pool, &["a1", "a2"]).await;
    s.push_behind_qbridge("lost").await;

    let out = s.run(&["cutover", "advance", &s.name]).await;
    let line = error_line(&out);
    assert!(
        line.contains("refused") && line.contains(&s.name) && line.contains("--force"),
        "{line}"
    );
    // The third check (no job ran live on both sides) passes.
    assert!(line.contains("2 of 3 checks failed"), "{line}");
    let text = stdout(&out);
    assert!(
        text.contains(&format!("{}: dual_write → shadow refused", s.name)),
        "{text}"
    );
    assert!(
        text.contains("redis-side jobs in window: 3 (needs >= 5)"),
        "{text}"
    );
    assert!(
        text.contains("mirror completeness: 66.6667% (1 of 3 Redis-side jobs have no Postgres copy: 1 waiting")
            && text.contains("(needs >= 99.9900%)"),
        "{text}"
    );
    assert_eq!(s.stored_phase(&pool).await, Phase::DualWrite);

    // The same under --json: the gate on stdout, one JSON error line.
    let out = s.run(&["--json", "cutover", "advance", &s.name]).await;
    let msg = json_error(&out);
    assert!(msg.contains("--force"), "{msg}");
    let gate: Value = serde_json::from_slice(&out.stdout).expect("the gate as JSON");
    let failed: Vec<&str> = gate["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["passed"] == false)
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(failed, ["redis-side jobs in window", "mirror completeness"]);
    assert_eq!(gate["diff"]["only_redis_waiting"], 1, "{gate}");

    // --force alone is refused: the override is audited with a reason.
    for args in [
        vec!["cutover", "advance", s.name.as_str(), "--force"],
        vec![
            "cutover",
            "advance",
            s.name.as_str(),
            "--force",
            "--reason",
            "  ",
        ],
    ] {
        let out = s.run(&args).await;
        let line = error_line(&out);
        assert!(line.contains("--force needs --reason"), "{args:?}: {line}");
    }
    assert_eq!(s.stored_phase(&pool).await, Phase::DualWrite);
    assert!(audit(&pool, &s.name).await.is_empty());

    let out = s
        .run(&[
            "cutover",
            "advance",
            &s.name,
            "--force",
            "--reason",
            "x",
            "--by",
            "tester@ops",
        ])
        .await;
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains(&format!("{}: dual_write → shadow (FORCED", s.name)),
        "{text}"
    );
    assert!(
        text.contains("FAIL redis-side jobs in window: 3 (needs >= 5)"),
        "{text}"
    );
    assert_eq!(s.stored_phase(&pool).await, Phase::Shadow);
    let rows = audit(&pool, &s.name).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (from, to, forced, reason, by, gates) = &rows[0];
    assert_eq!(
        (
            from.as_deref(),
            to.as_str(),
            *forced,
            reason.as_deref(),
            by.as_str()
        ),
        (Some("dual_write"), "shadow", true, Some("x"), "tester@ops")
    );
    // The audit row keeps the failing numbers of the moment.
    let gates = gates.as_ref().expect("gate numbers");
    assert_eq!(gates["passed"], false, "{gates}");
    let jobs = gates["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "redis-side jobs in window")
        .unwrap_or_else(|| panic!("{gates}"));
    assert_eq!(
        (&jobs["value"], &jobs["passed"]),
        (&Value::from("3"), &Value::Bool(false))
    );
    assert!(
        gates["verdict"]
            .as_str()
            .unwrap_or_default()
            .contains("DIFFERS"),
        "{gates}"
    );
    s.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_rollback_needs_a_reason_and_steps_back_one_phase(pool: PgPool) {
    let s = Setup::new(&pool, Phase::Shadow);
    for args in [
        vec!["cutover", "rollback", s.name.as_str()],
        vec!["cutover", "rollback", s.name.as_str(), "--reason", ""],
    ] {
        let out = s.run(&args).await;
        let line = error_line(&out);
        assert!(line.contains("rollback needs --reason"), "{args:?}: {line}");
    }
    // Refused before any change (the route is registered, still in shadow).
    assert_eq!(s.stored_phase(&pool).await, Phase::Shadow);
    assert!(audit(&pool, &s.name).await.is_empty());

    let out = s
        .run(&[
            "cutover",
            "rollback",
            &s.name,
            "--reason",
            "handler errors in shadow",
            "--by",
            "tester@ops",
        ])
        .await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains(&format!("{}: rolled back to dual_write", s.name)),
        "{}",
        stdout(&out)
    );
    assert_eq!(s.stored_phase(&pool).await, Phase::DualWrite);

    let out = s
        .run(&[
            "--json", "cutover", "rollback", &s.name, "--reason", "again",
        ])
        .await;
    let v = json_stdout(&out);
    assert_eq!(v["ok"], true, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or_default()
            .contains("redis_only"),
        "{v}"
    );
    assert_eq!(s.stored_phase(&pool).await, Phase::RedisOnly);

    // Nothing before redis_only.
    let out = s
        .run(&["cutover", "rollback", &s.name, "--reason", "once more"])
        .await;
    let line = error_line(&out);
    assert!(line.contains("no phase before it"), "{line}");

    let rows = audit(&pool, &s.name).await;
    let steps: Vec<(Option<&str>, &str, bool, Option<&str>)> = rows
        .iter()
        .map(|(from, to, forced, reason, _, _)| {
            (from.as_deref(), to.as_str(), *forced, reason.as_deref())
        })
        .collect();
    assert_eq!(
        steps,
        [
            (
                Some("shadow"),
                "dual_write",
                false,
                Some("handler errors in shadow")
            ),
            (Some("dual_write"), "redis_only", false, Some("again")),
        ]
    );
    assert_eq!(rows[0].4, "tester@ops");
    s.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn diff_prints_a_verdict_and_bad_arguments_are_one_line_errors(pool: PgPool) {
    let s = Setup::new(&pool, Phase::DualWrite);
    s.produce(&pool, &["d1", "d2"]).await;
    s.push_behind_qbridge("d3").await;

    let out = s.run(&["--json", "diff", "--route", &s.name]).await;
    let v = json_stdout(&out);
    let diff = &v["diff"];
    let verdict = diff["verdict"].as_str().expect("a verdict");
    assert!(
        verdict.starts_with(&format!("{}: DIFFERS (dual_write)", s.name)),
        "{verdict}"
    );
    assert_eq!(diff["route"], s.name.as_str());
    assert_eq!(diff["redis_waiting"], 3, "{diff}");
    assert_eq!(diff["redis_seen"], 3, "{diff}");
    assert_eq!(diff["postgres_mirrors"], 2, "{diff}");
    assert_eq!(diff["only_redis_waiting"], 1, "{diff}");
    assert_eq!(
        diff["sample_only_redis"],
        serde_json::json!(["d3"]),
        "{diff}"
    );
    assert_eq!(v["repair"], Value::Null, "{v}");

    // As a table, ending in the verdict; --since takes a duration or a time.
    let an_hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    for since in ["5m", an_hour_ago.as_str()] {
        let out = s.run(&["diff", "--route", &s.name, "--since", since]).await;
        assert!(out.status.success(), "{since}: {out:?}");
        let text = stdout(&out);
        let last = support::last_line(&text);
        assert!(
            last.starts_with(&format!("{}: DIFFERS", s.name)),
            "{since}: {text}"
        );
    }

    let out = s.run(&["diff", "--route", "nosuch"]).await;
    let line = error_line(&out);
    assert!(line.contains("no route named \"nosuch\""), "{line}");
    let out = s.run(&["--json", "diff", "--route", "nosuch"]).await;
    assert!(json_error(&out).contains("nosuch"));
    assert!(out.stdout.is_empty(), "{}", stdout(&out));

    let out = s
        .run(&["diff", "--route", &s.name, "--since", "garbage"])
        .await;
    let line = error_line(&out);
    assert!(
        line.contains("since \"garbage\"") && line.contains("RFC 3339"),
        "{line}"
    );
    assert!(out.stdout.is_empty(), "{}", stdout(&out));
    s.cleanup().await;
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_route_missing_from_the_config_is_a_clear_error(pool: PgPool) {
    let s = Setup::new(&pool, Phase::DualWrite);
    for args in [
        vec!["cutover", "advance", "nosuch"],
        vec!["cutover", "advance", "nosuch", "--force", "--reason", "x"],
        vec!["cutover", "rollback", "nosuch", "--reason", "x"],
    ] {
        let out = s.run(&args).await;
        let line = error_line(&out);
        assert!(
            line.contains("no route named \"nosuch\" in the config"),
            "{args:?}: {line}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {}", stdout(&out));
    }
    // Nothing was registered or changed for it.
    assert!(store::current(&pool, "nosuch").await.unwrap().is_none());
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.phase_audit WHERE from_phase IS NOT NULL"
        )
        .await,
        0
    );
    s.cleanup().await;
}

/// Serves the HTTP router with a producer of `s`'s route; returns its base URL.
async fn serve(pool: &PgPool, s: &Setup) -> String {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let mut state = AppState::new(pool.clone(), prometheus);
    state.producer = Some(s.producer(pool).await);
    state.admin_token = Some(qbridge::secret::Secret::new("test token", ADMIN_TOKEN).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router(state)).await;
    });
    format!("http://{addr}")
}

/// The admin token of [`serve`]: the diff names job keys, so it needs one.
const ADMIN_TOKEN: &str = "cutover-cli-admin-token-1";

async fn get(url: &str) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .get(url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_diff_over_http_is_json_and_bad_requests_are_4xx(pool: PgPool) {
    let s = Setup::new(&pool, Phase::DualWrite);
    let base = serve(&pool, &s).await;
    s.produce(&pool, &["h1", "h2"]).await;

    for query in ["?since=5m", ""] {
        let (status, body) = get(&format!("{base}/v1/routes/{}/diff{query}", s.name)).await;
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
        let verdict = body["verdict"].as_str().expect("a verdict");
        assert!(
            verdict.starts_with(&format!("{}: MATCH (dual_write)", s.name)),
            "{verdict}"
        );
        assert_eq!(
            (
                body["redis_seen"].as_i64(),
                body["postgres_mirrors"].as_i64()
            ),
            (Some(2), Some(2)),
            "{body}"
        );
    }

    let (status, body) = get(&format!("{base}/v1/routes/nosuch/diff?since=5m")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let error = body["error"].as_str().expect("an error field");
    assert!(error.contains("nosuch") && !error.contains('\n'), "{body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");

    let (status, body) = get(&format!("{base}/v1/routes/{}/diff?since=garbage", s.name)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let error = body["error"].as_str().expect("an error field");
    assert!(error.contains("garbage") && !error.contains('\n'), "{body}");
    s.cleanup().await;
}
