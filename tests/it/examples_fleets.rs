//! `examples/fleets/`: the Sidekiq, Celery and RQ applications of the
//! the book's framework guide (docs/src/guides/frameworks.md), with the one `qbridge.toml` that routes all
//! three. Each application's producer writes real messages with its own
//! framework's client; each is read as qbridge reads it (its route's format,
//! an RQ job's hash beside it), and the runner the example's header starts
//! answers it live and in shadow with the same response — the task code
//! unchanged on the Postgres side, its dry run in shadow.

use std::time::Duration;

use qbridge::config::{Config, Overrides};
use qbridge::model::formats;

use crate::servers::{free_port, ThrowawayRedis};
use crate::sidekiq_versions::Sidekiq;
use crate::support;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_fleets_example_config_routes_all_three_to_their_runners() {
    let text = std::fs::read_to_string(format!("{REPO}/examples/fleets/qbridge.toml")).unwrap();
    let config = Config::from_toml(&text, &Overrides::default()).expect("qbridge.toml");
    let routes: Vec<(&str, &str)> = config
        .routes
        .iter()
        .map(|r| (r.name.as_str(), r.format.name()))
        .collect();
    assert_eq!(
        routes,
        [
            ("emails", "sidekiq"),
            ("reports", "celery"),
            ("thumbnails", "rq")
        ]
    );
    assert!(config
        .routes
        .iter()
        .all(|r| r.handler.is_some() && r.redis_side == qbridge::config::RedisSideKind::Fleet));
}

/// Runs `cmd` (an example's producer) and returns what it printed.
async fn produce(mut cmd: tokio::process::Command, redis: &str) {
    let out = cmd
        .current_dir(REPO)
        .env("REDIS_URL", redis)
        .env(
            "PYTHONPATH",
            format!("{REPO}/adapters/python:{REPO}/examples/fleets"),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The route's items as qbridge stores them: (job key, payload).
async fn read_as_qbridge(
    redis: &str,
    list: &str,
    format: &str,
) -> Vec<(String, serde_json::Value)> {
    let format: formats::Format = format.parse().unwrap();
    let mut conn = qbridge::redis::connect::connect_redis(redis).await.unwrap();
    let items: Vec<Vec<u8>> = ::redis::cmd("LRANGE")
        .arg(list)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut out = Vec::new();
    for item in items {
        let mut decoded = formats::decode(&format, &item);
        assert_eq!(decoded.flagged, None);
        let key = match &decoded.key {
            formats::KeySource::Id(id) => id.clone(),
            other => panic!("expected an id key, got {other:?}"),
        };
        if format == formats::Format::Rq {
            let fields: Vec<(String, Vec<u8>)> = ::redis::cmd("HGETALL")
                .arg(format!("rq:job:{key}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            formats::rq::with_job(&mut decoded.payload, &fields);
        }
        out.push((key, decoded.payload));
    }
    out
}

/// Starts the example's runner and waits for its port.
async fn runner(mut cmd: tokio::process::Command, port: u16) -> tokio::process::Child {
    let child = cmd
        .current_dir(REPO)
        .env(
            "PYTHONPATH",
            format!("{REPO}/adapters/python:{REPO}/examples/fleets"),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the runner starts");
    support::wait_for(
        "the runner listens",
        Duration::from_secs(30),
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        },
    )
    .await;
    child
}

/// Posts each job as qbridge's http handler does, live and in shadow:
/// both answer 200 with the same body.
async fn live_and_shadow_agree(port: u16, jobs: &[(String, serde_json::Value)]) {
    assert_eq!(jobs.len(), 3);
    let client = reqwest::Client::new();
    for (key, payload) in jobs {
        let mut bodies = Vec::new();
        for mode in ["live", "shadow"] {
            let resp = client
                .post(format!("http://127.0.0.1:{port}/"))
                .header("Qbridge-Mode", mode)
                .header("Qbridge-Attempt", "1")
                .header("Qbridge-Job-Key", key)
                .json(payload)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{mode} {key}");
            bodies.push(resp.text().await.unwrap());
        }
        assert_eq!(bodies[0], bodies[1], "{key}");
    }
}

/// On Sidekiq 6.4 and 7.3.10 (the adapter's lib on `RUBYLIB`, as the
/// example's header says).
async fn the_sidekiq_example_runs_on(sidekiq: Sidekiq) {
    let redis = ThrowawayRedis::start();
    let mut cmd = sidekiq.ruby();
    cmd.args(["examples/fleets/sidekiq_app.rb", "produce", "3"]);
    produce(cmd, &redis.url()).await;
    let jobs = read_as_qbridge(&redis.url(), "queue:emails", "sidekiq").await;
    let port = free_port();
    let mut cmd = sidekiq.ruby();
    cmd.arg("adapters/ruby/bin/qbridge-sidekiq-runner")
        .args(["-r", "./examples/fleets/sidekiq_app.rb"])
        .args(["--listen", &format!("127.0.0.1:{port}")]);
    let _runner = runner(cmd, port).await;
    live_and_shadow_agree(port, &jobs).await;
}

#[tokio::test]
async fn the_sidekiq_example_runs_on_both_sides_on_sidekiq_6() {
    the_sidekiq_example_runs_on(Sidekiq::V6).await;
}

#[tokio::test]
async fn the_sidekiq_example_runs_on_both_sides_on_sidekiq_7() {
    the_sidekiq_example_runs_on(Sidekiq::V7).await;
}

#[tokio::test]
async fn the_celery_example_runs_on_both_sides() {
    let redis = ThrowawayRedis::start();
    let mut cmd = tokio::process::Command::new(support::python());
    cmd.args(["examples/fleets/celery_app.py", "3"]);
    produce(cmd, &redis.url()).await;
    let jobs = read_as_qbridge(&redis.url(), "reports", "celery").await;
    let port = free_port();
    let mut cmd = tokio::process::Command::new(support::python());
    cmd.args(["-m", "qbridge_adapters.runner", "celery"])
        .args(["--app", "celery_app:app"])
        .args(["--listen", &format!("127.0.0.1:{port}")]);
    let _runner = runner(cmd, port).await;
    live_and_shadow_agree(port, &jobs).await;
}

#[tokio::test]
async fn the_rq_example_runs_on_both_sides() {
    let redis = ThrowawayRedis::start();
    let mut cmd = tokio::process::Command::new(support::python());
    cmd.args(["examples/fleets/rq_app.py", "3"]);
    produce(cmd, &redis.url()).await;
    let jobs = read_as_qbridge(&redis.url(), "rq:queue:thumbnails", "rq").await;
    let port = free_port();
    let mut cmd = tokio::process::Command::new(support::python());
    cmd.args(["-m", "qbridge_adapters.runner", "rq"])
        .args(["--import", "rq_app", "--redis-url", &redis.url()])
        .args(["--listen", &format!("127.0.0.1:{port}")]);
    let _runner = runner(cmd, port).await;
    live_and_shadow_agree(port, &jobs).await;
}
