//! The observability stack, checked without Docker: docker-compose.yml, the
//! Prometheus and Grafana files under deploy/, and examples/compose.toml.
//!
//! - the services exist and say what they must (images, commands, no Redis
//!   persistence, loopback-only ports), every build context and bind mount
//!   exists in the repository, and the config `qbridge run` reads is in the
//!   image;
//! - examples/compose.toml parses with [`Config::from_toml`] and agrees with
//!   the compose file (the producer's Redis URL is the proxy, the handler URL
//!   is the handler service, Prometheus scrapes the HTTP listener);
//! - every metric a dashboard query names is exported by qbridge: it is in
//!   [`qbridge::metrics::ALL`], and the series the query selects (`_bucket`
//!   of a histogram, `_sum`/`_count` of a summary, …) appears in what the
//!   real Prometheus recorder ([`qbridge::telemetry::prometheus`]) renders.
//!   Renaming a metric, or changing how it is exported, breaks this test;
//! - the dashboard shows every topic the runbook relies on.
//!
//! Needs no Postgres, Redis or network.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use qbridge::config::{Config, HandlerConfig, Overrides};
use regex::Regex;
use serde_json::Value as Json;
use serde_yaml::Value as Yaml;

const COMPOSE: &str = "docker-compose.yml";
const PROMETHEUS: &str = "deploy/prometheus/prometheus.yml";
const DATASOURCES: &str = "deploy/grafana/provisioning/datasources";
const DASHBOARD_PROVIDERS: &str = "deploy/grafana/provisioning/dashboards";
const DASHBOARD: &str = "deploy/grafana/dashboards/qbridge.json";
const COMPOSE_CONFIG: &str = "examples/compose.toml";

// ---------------------------------------------------------------- helpers

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

fn yaml(rel: &str) -> Yaml {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not valid YAML: {e}"))
}

fn compose() -> Yaml {
    yaml(COMPOSE)
}

fn services(compose: &Yaml) -> &serde_yaml::Mapping {
    compose["services"]
        .as_mapping()
        .expect("docker-compose.yml has a services mapping")
}

fn service<'a>(compose: &'a Yaml, name: &str) -> &'a Yaml {
    compose["services"]
        .get(name)
        .unwrap_or_else(|| panic!("docker-compose.yml has no service {name:?}"))
}

fn str_of<'a>(v: &'a Yaml, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
}

/// A `command`/`test` as one string, whether written as a list or a string.
fn command(v: &Yaml) -> String {
    match v {
        Yaml::String(s) => s.clone(),
        Yaml::Sequence(items) => items
            .iter()
            .map(|i| match i {
                Yaml::String(s) => s.clone(),
                other => serde_yaml::to_string(other).unwrap().trim().to_string(),
            })
            .collect::<Vec<_>>()
            .join(" "),
        Yaml::Null => String::new(),
        other => panic!("a command is a string or a list, got {other:?}"),
    }
}

/// A `command` as its list of arguments (a string command is one argument).
fn args(v: &Yaml) -> Vec<String> {
    match v {
        Yaml::Sequence(items) => items
            .iter()
            .map(|i| str_of(i, "a command argument").to_string())
            .collect(),
        Yaml::String(s) => vec![s.clone()],
        other => panic!("a command is a string or a list, got {other:?}"),
    }
}

/// A service's `environment`, written as a mapping or as `KEY=value` items.
fn environment(svc: &Yaml) -> BTreeMap<String, String> {
    match &svc["environment"] {
        Yaml::Mapping(m) => m
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    Yaml::String(s) => s.clone(),
                    Yaml::Null => String::new(),
                    other => serde_yaml::to_string(other).unwrap().trim().to_string(),
                };
                (str_of(k, "an environment key").to_string(), value)
            })
            .collect(),
        Yaml::Sequence(items) => items
            .iter()
            .map(|i| {
                let s = str_of(i, "an environment item");
                let (k, v) = s.split_once('=').unwrap_or((s, ""));
                (k.to_string(), v.to_string())
            })
            .collect(),
        Yaml::Null => BTreeMap::new(),
        other => panic!("environment is a mapping or a list, got {other:?}"),
    }
}

/// A bind mount or named volume of a service.
#[derive(Debug)]
struct Mount {
    /// As written: `./deploy/...`, `/abs/path` or a volume name.
    source: String,
    target: String,
    read_only: bool,
}

impl Mount {
    fn is_bind(&self) -> bool {
        self.source.starts_with('.') || self.source.starts_with('/')
    }

    /// The repository path of a bind mount's source.
    fn host_path(&self) -> PathBuf {
        repo().join(&self.source)
    }
}

fn mounts(svc: &Yaml) -> Vec<Mount> {
    let Some(volumes) = svc["volumes"].as_sequence() else {
        return Vec::new();
    };
    volumes
        .iter()
        .map(|v| match v {
            Yaml::String(s) => {
                let parts: Vec<&str> = s.split(':').collect();
                assert!(
                    (2..=3).contains(&parts.len()),
                    "volume {s:?} is not source:target[:mode]"
                );
                Mount {
                    source: parts[0].to_string(),
                    target: parts[1].to_string(),
                    read_only: parts
                        .get(2)
                        .is_some_and(|m| m.split(',').any(|o| o == "ro")),
                }
            }
            Yaml::Mapping(_) => Mount {
                source: str_of(&v["source"], "a volume's source").to_string(),
                target: str_of(&v["target"], "a volume's target").to_string(),
                read_only: v["read_only"].as_bool().unwrap_or(false),
            },
            other => panic!("a volume is a string or a mapping, got {other:?}"),
        })
        .collect()
}

/// Where a path inside a container comes from in the repository, through the
/// service's bind mounts (the longest matching target wins).
fn through_mounts(svc: &Yaml, container_path: &str) -> Option<PathBuf> {
    mounts(svc)
        .into_iter()
        .filter(|m| m.is_bind())
        .filter_map(|m| {
            let rest = container_path.strip_prefix(m.target.trim_end_matches('/'))?;
            if !(rest.is_empty() || rest.starts_with('/')) {
                return None;
            }
            Some((
                m.target.len(),
                m.host_path().join(rest.trim_start_matches('/')),
            ))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, p)| p)
}

/// A path a container sees, made absolute against its working directory.
fn in_container(svc: &Yaml, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        let dir = svc["working_dir"].as_str().unwrap_or("/");
        format!("{}/{path}", dir.trim_end_matches('/'))
    }
}

/// Normalizes `a/./b` and `a/b/../c` (paths inside the repo only).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// `host:port` of a URL such as `redis://qbridge:6380/0`.
fn host_port(url: &str) -> (String, u16) {
    let parsed = url::Url::parse(url).unwrap_or_else(|e| panic!("{url:?} is not a URL: {e}"));
    (
        parsed.host_str().expect("a host").to_string(),
        parsed.port_or_known_default().expect("a port"),
    )
}

fn listen_port(listen: &str) -> u16 {
    listen
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("{listen:?} is not host:port"))
}

/// A listener beyond loopback starts only with a token for each write
/// endpoint (`http::auth::open_write_endpoints`): the container's must.
#[test]
fn the_container_listener_has_a_token_for_each_write_endpoint() {
    let cfg = load_compose_config();
    let listen: std::net::SocketAddr = cfg.http.listen.parse().expect("an address");
    // Published ports reach a container's listener only beyond its loopback.
    assert!(
        !listen.ip().is_loopback(),
        "{listen}: unreachable from the host"
    );
    let env = environment(service(&compose(), "qbridge"));
    for var in ["QBRIDGE_REPORT_TOKEN", "QBRIDGE_ENQUEUE_TOKEN"] {
        let token = env
            .get(var)
            .unwrap_or_else(|| panic!("qbridge needs {var}"));
        assert!(token.len() >= 16, "{var} is shorter than 16 characters");
    }
}

fn load_compose_config() -> Config {
    Config::from_toml(&read(COMPOSE_CONFIG), &Overrides::default())
        .unwrap_or_else(|e| panic!("{COMPOSE_CONFIG} does not load: {e}"))
}

// ------------------------------------------------------------ compose file

#[test]
fn compose_has_every_service_and_each_says_what_it_must() {
    let c = compose();
    let postgres = service(&c, "postgres");
    assert_eq!(postgres["image"].as_str(), Some("postgres:15"));
    assert_eq!(
        environment(postgres)
            .get("POSTGRES_PASSWORD")
            .map(String::as_str),
        Some("postgres")
    );
    assert!(
        command(&postgres["healthcheck"]["test"]).contains("pg_isready"),
        "postgres needs a healthcheck (pg_isready): the migration waits for it"
    );

    let redis = service(&c, "redis");
    assert_eq!(redis["image"].as_str(), Some("redis:7"));
    let redis_args = args(&redis["command"]);
    let flag = |name: &str| {
        redis_args
            .iter()
            .position(|a| a == name)
            .and_then(|i| redis_args.get(i + 1))
            .map(String::as_str)
    };
    assert_eq!(
        flag("--save"),
        Some(""),
        "redis must not snapshot: {redis_args:?}"
    );
    assert_eq!(
        flag("--appendonly"),
        Some("no"),
        "redis must not keep an AOF: {redis_args:?}"
    );

    let migrate = service(&c, "qbridge-migrate");
    assert_eq!(migrate["build"].as_str(), Some("."));
    assert_eq!(args(&migrate["command"]), ["migrate"]);
    assert!(environment(migrate).contains_key("QBRIDGE_DATABASE_URL"));

    let qbridge = service(&c, "qbridge");
    assert_eq!(qbridge["build"].as_str(), Some("."));
    let run = args(&qbridge["command"]);
    assert_eq!(run.first().map(String::as_str), Some("run"), "{run:?}");
    assert_eq!(config_arg(qbridge).as_deref(), Some(COMPOSE_CONFIG));
    assert_eq!(
        environment(qbridge).get("QBRIDGE_DATABASE_URL"),
        environment(migrate).get("QBRIDGE_DATABASE_URL"),
        "qbridge and its migration must use the same database"
    );
    assert_eq!(
        qbridge["depends_on"]["qbridge-migrate"]["condition"].as_str(),
        Some("service_completed_successfully"),
        "qbridge starts after the schema exists"
    );

    let producer = service(&c, "producer");
    assert_eq!(producer["image"].as_str(), Some("python:3.11-slim"));
    let env = environment(producer);
    assert_eq!(
        env.get("REDIS_URL").map(String::as_str),
        Some("redis://qbridge:6380/0")
    );
    let run = command(&producer["command"]);
    assert!(
        Regex::new(r"pip install\b.*\bredis\b")
            .unwrap()
            .is_match(&run),
        "the producer installs redis-py at start: {run}"
    );
    assert!(
        run.contains("examples/python/producer.py") && run.contains("while"),
        "the producer runs examples/python/producer.py in a loop: {run}"
    );

    let handler = service(&c, "handler");
    assert_eq!(handler["image"].as_str(), Some("python:3.11-slim"));
    assert!(command(&handler["command"]).contains("examples/python/handler.py"));
    assert_eq!(
        environment(handler).get("PORT").map(String::as_str),
        Some("8080")
    );

    let prometheus = service(&c, "prometheus");
    assert!(str_of(&prometheus["image"], "prometheus image").starts_with("prom/prometheus"));
    assert!(
        mounts(prometheus)
            .iter()
            .any(|m| normalize(&m.host_path()) == repo().join(PROMETHEUS)
                && m.target == "/etc/prometheus/prometheus.yml"),
        "prometheus reads {PROMETHEUS}"
    );

    let grafana = service(&c, "grafana");
    assert!(str_of(&grafana["image"], "grafana image").starts_with("grafana/grafana"));
    let env = environment(grafana);
    assert_eq!(
        env.get("GF_AUTH_ANONYMOUS_ENABLED").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        env.get("GF_AUTH_ANONYMOUS_ORG_ROLE").map(String::as_str),
        Some("Viewer"),
        "anonymous users may look, not edit"
    );
    if let Some(home) = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH") {
        let host = through_mounts(grafana, home)
            .unwrap_or_else(|| panic!("the home dashboard {home} is not mounted"));
        assert_eq!(normalize(&host), repo().join(DASHBOARD));
    }
}

#[test]
fn every_published_port_is_bound_to_loopback() {
    let c = compose();
    let mut published = 0;
    for (name, svc) in services(&c) {
        let name = str_of(name, "a service name");
        for port in svc["ports"].as_sequence().into_iter().flatten() {
            published += 1;
            match port {
                Yaml::String(p) => assert!(
                    p.starts_with("127.0.0.1:"),
                    "service {name}: port {p:?} must be bound to 127.0.0.1"
                ),
                Yaml::Mapping(_) => assert_eq!(
                    port["host_ip"].as_str(),
                    Some("127.0.0.1"),
                    "service {name}: port {port:?} must be bound to 127.0.0.1"
                ),
                other => panic!(
                    "service {name}: port {other:?} publishes on every interface; write \"127.0.0.1:host:container\""
                ),
            }
        }
    }
    assert!(published > 0);
}

#[test]
fn every_build_context_and_mount_exists_in_the_repo() {
    let c = compose();
    let declared: BTreeSet<String> = c["volumes"]
        .as_mapping()
        .map(|m| {
            m.keys()
                .map(|k| str_of(k, "a volume name").to_string())
                .collect()
        })
        .unwrap_or_default();
    for (name, svc) in services(&c) {
        let name = str_of(name, "a service name");
        if !svc["build"].is_null() {
            let (context, dockerfile) = match &svc["build"] {
                Yaml::String(ctx) => (ctx.clone(), "Dockerfile".to_string()),
                b => (
                    str_of(&b["context"], "build.context").to_string(),
                    b["dockerfile"].as_str().unwrap_or("Dockerfile").to_string(),
                ),
            };
            let dir = repo().join(&context);
            assert!(
                dir.is_dir(),
                "service {name}: build context {context} is missing"
            );
            assert!(
                dir.join(&dockerfile).is_file(),
                "service {name}: {context}/{dockerfile} is missing"
            );
        }
        assert!(
            !svc["build"].is_null() || svc["image"].is_string(),
            "service {name} has neither build nor image"
        );
        for m in mounts(svc) {
            if m.is_bind() {
                assert!(
                    !m.source.starts_with('/'),
                    "service {name}: mount {} is outside the repository",
                    m.source
                );
                assert!(
                    m.host_path().exists(),
                    "service {name}: mounted path {} does not exist",
                    m.source
                );
                assert!(
                    m.read_only,
                    "service {name}: mount the repository's {} read-only (:ro)",
                    m.source
                );
            } else {
                assert!(
                    declared.contains(&m.source),
                    "service {name}: named volume {} is not declared",
                    m.source
                );
            }
        }
    }
}

/// `--config FILE` (or `-c FILE`) of the qbridge service.
fn config_arg(svc: &Yaml) -> Option<String> {
    let run = args(&svc["command"]);
    run.iter()
        .position(|a| a == "--config" || a == "-c")
        .and_then(|i| run.get(i + 1).cloned())
        .or_else(|| {
            run.iter()
                .find_map(|a| a.strip_prefix("--config=").map(String::from))
        })
        .or_else(|| environment(svc).get("QBRIDGE_CONFIG").cloned())
}

/// The last stage's WORKDIR and its `COPY src dst` lines (not `--from`).
fn dockerfile_final_stage() -> (String, Vec<(String, String)>) {
    let text = read("Dockerfile");
    let lines: Vec<&str> = text.lines().collect();
    let last = lines
        .iter()
        .rposition(|l| l.trim_start().to_uppercase().starts_with("FROM "))
        .expect("the Dockerfile has a FROM");
    let mut workdir = "/".to_string();
    let mut copies = Vec::new();
    for line in &lines[last..] {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().map(|w| w.to_uppercase()).as_deref() {
            Some("WORKDIR") => workdir = words[1].to_string(),
            Some("COPY") if !words.iter().any(|w| w.starts_with("--from")) => {
                let plain: Vec<&str> = words[1..]
                    .iter()
                    .copied()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                if let [src, dst] = plain[..] {
                    copies.push((src.to_string(), dst.to_string()));
                }
            }
            _ => {}
        }
    }
    (workdir, copies)
}

#[test]
fn the_config_qbridge_runs_with_is_in_the_image_or_mounted() {
    let c = compose();
    let qbridge = service(&c, "qbridge");
    let config = config_arg(qbridge).expect("qbridge runs with --config");
    let (workdir, copies) = dockerfile_final_stage();
    let path = if config.starts_with('/') {
        config.clone()
    } else {
        let dir = qbridge["working_dir"].as_str().unwrap_or(&workdir);
        format!("{}/{config}", dir.trim_end_matches('/'))
    };
    let host = through_mounts(qbridge, &path).or_else(|| {
        copies.iter().find_map(|(src, dst)| {
            let rest = path.strip_prefix(dst.trim_end_matches('/'))?;
            rest.starts_with('/')
                .then(|| repo().join(src).join(rest.trim_start_matches('/')))
        })
    });
    let host = host.unwrap_or_else(|| {
        panic!("{path} is neither mounted into qbridge nor copied by the Dockerfile ({copies:?})")
    });
    assert_eq!(normalize(&host), repo().join(COMPOSE_CONFIG));
    assert!(host.is_file());
}

/// The Python samples are other files of the repository, reached through the
/// examples/ mount at the path their command names.
#[test]
fn the_sample_services_run_scripts_from_the_mounted_examples() {
    let c = compose();
    for (name, script) in [
        ("producer", "examples/python/producer.py"),
        ("handler", "examples/python/handler.py"),
    ] {
        let svc = service(&c, name);
        let host = through_mounts(svc, &in_container(svc, script))
            .unwrap_or_else(|| panic!("service {name}: {script} is not under a mount"));
        assert_eq!(
            normalize(&host),
            repo().join(script),
            "service {name} runs the repository's {script}"
        );
        assert!(
            host.parent()
                .and_then(Path::parent)
                .is_some_and(Path::is_dir),
            "service {name}: examples/ is mounted"
        );
    }
}

/// The sample producer and handler the compose file runs exist.
#[test]
fn the_sample_scripts_exist() {
    for script in ["examples/python/producer.py", "examples/python/handler.py"] {
        assert!(repo().join(script).is_file(), "{script} is missing");
    }
}

// ------------------------------------------------------ examples/compose.toml

#[test]
fn compose_config_loads_and_agrees_with_the_compose_file() {
    let cfg = load_compose_config();
    let c = compose();

    assert_eq!(cfg.redis_url, "redis://redis:6379");
    assert_eq!(cfg.http.listen, "0.0.0.0:9187");
    assert!(cfg.proxy.enabled, "qbridge run must also run the proxy");
    assert_eq!(cfg.proxy.listen, "0.0.0.0:6380");
    assert_eq!(cfg.proxy.upstream, "redis://redis:6379");
    assert_eq!(host_port(&cfg.redis_url).0, "redis");
    service(&c, "redis");

    assert_eq!(cfg.routes.len(), 1, "one route, orders");
    let route = &cfg.routes[0];
    assert_eq!(route.name, "orders");
    assert_eq!(route.format.to_string(), "json:/id");
    assert!(
        route.redis_consumer.is_some(),
        "the route has a Redis consumer"
    );
    assert_eq!(route.cutover.diff.ignore_fields, ["/processed_at"]);
    let Some(HandlerConfig::Http { url, .. }) = &route.handler else {
        panic!("the route's handler is http: {:?}", route.handler);
    };
    let (host, port) = host_port(url);
    assert_eq!(host, "handler", "the handler URL names the handler service");
    let handler = service(&c, "handler");
    assert_eq!(
        environment(handler).get("PORT").map(String::as_str),
        Some(port.to_string().as_str()),
        "the handler listens where the route calls it"
    );
    assert!(
        command(&handler["healthcheck"]["test"]).contains(&port.to_string()),
        "the handler's healthcheck probes its port"
    );

    // The producer pushes through the proxy onto the route's list.
    let producer = environment(service(&c, "producer"));
    let (host, port) = host_port(&producer["REDIS_URL"]);
    assert_eq!(host, "qbridge");
    assert_eq!(port, listen_port(&cfg.proxy.listen));
    if let Some(key) = producer.get("QUEUE_KEY") {
        assert_eq!(key, &route.redis_key);
    }

    // The host reaches /metrics and the proxy on the listeners' ports.
    let qbridge = service(&c, "qbridge");
    let ports: Vec<String> = qbridge["ports"]
        .as_sequence()
        .expect("qbridge publishes ports")
        .iter()
        .map(|p| str_of(p, "a port").to_string())
        .collect();
    for listen in [&cfg.http.listen, &cfg.proxy.listen] {
        let port = listen_port(listen);
        assert!(
            ports.iter().any(|p| p.ends_with(&format!(":{port}"))),
            "qbridge publishes {port}: {ports:?}"
        );
    }
}

// ------------------------------------------------------------- Prometheus

#[test]
fn prometheus_scrapes_qbridge_every_five_seconds() {
    let prom = yaml(PROMETHEUS);
    let cfg = load_compose_config();
    let jobs = prom["scrape_configs"]
        .as_sequence()
        .expect("scrape_configs");
    let want = format!("qbridge:{}", listen_port(&cfg.http.listen));
    let job = jobs
        .iter()
        .find(|j| {
            j["static_configs"]
                .as_sequence()
                .into_iter()
                .flatten()
                .flat_map(|s| s["targets"].as_sequence().into_iter().flatten())
                .any(|t| t.as_str() == Some(want.as_str()))
        })
        .unwrap_or_else(|| panic!("no scrape job targets {want}"));
    assert_eq!(
        job["metrics_path"].as_str().unwrap_or("/metrics"),
        "/metrics"
    );
    let interval = job["scrape_interval"]
        .as_str()
        .or(prom["global"]["scrape_interval"].as_str());
    assert_eq!(interval, Some("5s"));
    service(&compose(), "qbridge");
}

// ---------------------------------------------------------------- Grafana

/// Every `*.yml`/`*.yaml` in a provisioning directory.
fn provisioning(dir: &str) -> Vec<Yaml> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{dir} holds no YAML file");
    files
        .iter()
        .map(|p| {
            serde_yaml::from_str(&std::fs::read_to_string(p).unwrap())
                .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", p.display()))
        })
        .collect()
}

/// The uid of the provisioned Prometheus datasource.
fn datasource_uid() -> String {
    let sources: Vec<Yaml> = provisioning(DATASOURCES)
        .iter()
        .flat_map(|f| f["datasources"].as_sequence().cloned().unwrap_or_default())
        .filter(|d| d["type"].as_str() == Some("prometheus"))
        .collect();
    assert_eq!(sources.len(), 1, "one Prometheus datasource: {sources:?}");
    str_of(&sources[0]["uid"], "the datasource uid").to_string()
}

#[test]
fn grafana_provisions_prometheus_and_the_dashboard() {
    let c = compose();
    let grafana = service(&c, "grafana");
    let provisioning_dir = through_mounts(grafana, "/etc/grafana/provisioning")
        .expect("deploy/grafana/provisioning is mounted at /etc/grafana/provisioning");
    assert_eq!(
        normalize(&provisioning_dir),
        repo().join("deploy/grafana/provisioning")
    );

    let sources: Vec<Yaml> = provisioning(DATASOURCES)
        .iter()
        .flat_map(|f| f["datasources"].as_sequence().cloned().unwrap_or_default())
        .collect();
    let prom = sources
        .iter()
        .find(|d| d["type"].as_str() == Some("prometheus"))
        .expect("a Prometheus datasource");
    assert_eq!(prom["uid"].as_str(), Some(datasource_uid().as_str()));
    let (host, port) = host_port(str_of(&prom["url"], "the datasource url"));
    service(&c, &host);
    assert_eq!(port, 9090, "Prometheus listens on 9090");

    let providers: Vec<Yaml> = provisioning(DASHBOARD_PROVIDERS)
        .iter()
        .flat_map(|f| f["providers"].as_sequence().cloned().unwrap_or_default())
        .collect();
    assert!(!providers.is_empty(), "a dashboard provider");
    let found = providers.iter().any(|p| {
        p["type"].as_str().unwrap_or("file") == "file"
            && p["options"]["path"]
                .as_str()
                .and_then(|dir| through_mounts(grafana, dir))
                .is_some_and(|dir| normalize(&dir).join("qbridge.json") == repo().join(DASHBOARD))
    });
    assert!(
        found,
        "a file provider reads the mounted deploy/grafana/dashboards: {providers:?}"
    );
}

// -------------------------------------------------------------- dashboard

fn dashboard() -> Json {
    serde_json::from_str(&read(DASHBOARD))
        .unwrap_or_else(|e| panic!("{DASHBOARD} is not valid JSON: {e}"))
}

/// Every panel, rows' nested panels (collapsed rows) included.
fn panels(dash: &Json) -> Vec<&Json> {
    fn walk<'a>(list: &'a Json, out: &mut Vec<&'a Json>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

/// Every PromQL expression: panel targets and template variable queries.
fn exprs(dash: &Json) -> Vec<String> {
    let mut out: Vec<String> = panels(dash)
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .map(String::from)
        .collect();
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        match &v["query"] {
            Json::String(q) => out.push(q.clone()),
            q => out.extend(q["query"].as_str().map(String::from)),
        }
    }
    out
}

/// One line of whitespace.
fn squash(expr: &str) -> String {
    expr.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn metric_tokens(expr: &str) -> Vec<String> {
    Regex::new(r"\bqbridge_[a-z0-9_]+")
        .unwrap()
        .find_iter(expr)
        .map(|m| m.as_str().to_string())
        .collect()
}

/// The exported metric a series name belongs to: itself, or the histogram
/// or summary it is the `_bucket`/`_sum`/`_count` of.
fn base_metric(series: &str) -> Option<&'static str> {
    let all = qbridge::metrics::ALL;
    if let Some(m) = all.iter().find(|m| **m == series) {
        return Some(m);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = series.strip_suffix(suffix)?;
        all.iter().find(|m| **m == base).copied()
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Each metric's kind, as src/metrics.rs describes it.
fn kinds() -> BTreeMap<&'static str, Kind> {
    let src = read("src/metrics.rs");
    let consts: BTreeMap<String, String> =
        Regex::new(r#"pub const ([A-Z0-9_]+): &str = "([a-z0-9_]+)";"#)
            .unwrap()
            .captures_iter(&src)
            .map(|c| (c[1].to_string(), c[2].to_string()))
            .collect();
    let mut kinds = BTreeMap::new();
    for c in Regex::new(r"describe_(counter|gauge|histogram)!\(\s*([A-Z0-9_]+)")
        .unwrap()
        .captures_iter(&src)
    {
        let name = consts
            .get(&c[2])
            .unwrap_or_else(|| panic!("src/metrics.rs describes {} but has no such const", &c[2]));
        let metric = qbridge::metrics::ALL
            .iter()
            .find(|m| **m == name.as_str())
            .unwrap_or_else(|| panic!("{name} is described but not in metrics::ALL"));
        let kind = match &c[1] {
            "counter" => Kind::Counter,
            "gauge" => Kind::Gauge,
            _ => Kind::Histogram,
        };
        kinds.insert(*metric, kind);
    }
    for m in qbridge::metrics::ALL {
        assert!(
            kinds.contains_key(m),
            "{m} is in metrics::ALL but src/metrics.rs does not describe it"
        );
    }
    kinds
}

/// What qbridge's own Prometheus recorder renders with one sample of every
/// metric in ALL, each recorded as its kind.
fn rendered() -> String {
    let handle = qbridge::telemetry::prometheus();
    for (name, kind) in kinds() {
        match kind {
            Kind::Counter => metrics::counter!(name).increment(1),
            Kind::Gauge => metrics::gauge!(name).set(1.0),
            Kind::Histogram => metrics::histogram!(name).record(0.01),
        }
    }
    handle.render()
}

#[test]
fn every_dashboard_metric_is_one_qbridge_exports() {
    let dash = dashboard();
    let exprs = exprs(&dash);
    assert!(!exprs.is_empty());
    let kinds = kinds();
    let output = rendered();
    let exported: BTreeSet<&str> = output
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let counter_use = Regex::new(r"(?:rate|irate|increase)\(\s*(qbridge_[a-z0-9_]+)").unwrap();
    let mut unknown = Vec::new();
    for expr in &exprs {
        let tokens = metric_tokens(expr);
        assert!(
            !tokens.is_empty(),
            "a query names no qbridge metric: {expr}"
        );
        for series in &tokens {
            let Some(base) = base_metric(series) else {
                unknown.push(format!("{series} (in {})", squash(expr)));
                continue;
            };
            assert!(
                exported.contains(series.as_str()),
                "{series} (of {base}, a {:?}) is not a series qbridge's recorder exports; it renders {:?}\n  in {}",
                kinds[base],
                exported.iter().filter(|s| s.starts_with(base)).collect::<Vec<_>>(),
                squash(expr)
            );
            // Counters go through rate()/increase(); gauges never do.
            let rated = counter_use
                .captures_iter(expr)
                .filter(|c| &c[1] == series)
                .count();
            let used = tokens.iter().filter(|t| *t == series).count();
            match (kinds[base], series == base) {
                (Kind::Counter, _) => assert_eq!(
                    rated,
                    used,
                    "counter {series} outside rate()/increase(): {}",
                    squash(expr)
                ),
                (Kind::Gauge, _) => {
                    assert_eq!(rated, 0, "rate() of gauge {series}: {}", squash(expr))
                }
                (Kind::Histogram, false) => assert_eq!(
                    rated,
                    used,
                    "{series} outside rate()/increase(): {}",
                    squash(expr)
                ),
                (Kind::Histogram, true) => {}
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics qbridge does not export (not in qbridge::metrics::ALL):\n  {}",
        unknown.join("\n  ")
    );
}

#[test]
fn the_dashboard_shows_every_topic() {
    let dash = dashboard();
    let exprs: Vec<String> = exprs(&dash).iter().map(|e| squash(e)).collect();
    let uses = |series: &str| {
        exprs
            .iter()
            .any(|e| metric_tokens(e).iter().any(|t| t == series))
    };
    let any = |pred: &dyn Fn(&str) -> bool| exprs.iter().any(|e| pred(e));
    let quantile_of = |series: &str| {
        let pattern = format!(
            r"histogram_quantile\(0\.99, sum by \((?:[a-z_]+, )*le(?:, [a-z_]+)*\) \(rate\({series}\b"
        );
        let re = Regex::new(&pattern).unwrap();
        any(&|e| re.is_match(e))
    };
    let rate_of = |series: &str| {
        let re = Regex::new(&format!(r"rate\({series}\b")).unwrap();
        any(&|e| re.is_match(e))
    };
    let mut missing = Vec::new();
    let mut need = |topic: &str, ok: bool| {
        if !ok {
            missing.push(topic.to_string());
        }
    };
    need("queue lag", uses("qbridge_queue_lag_seconds"));
    need(
        "claim latency p99",
        quantile_of("qbridge_claim_duration_seconds_bucket"),
    );
    need("throughput", rate_of("qbridge_jobs_completed_total"));
    need("dead letters (gauge)", uses("qbridge_jobs_dead"));
    need(
        "dead letters (rate)",
        rate_of("qbridge_jobs_dead_lettered_total"),
    );
    let phase = Regex::new(r"\bqbridge_route_phase\b(\{[^}]*\})? == 1\b").unwrap();
    need("phase per route", any(&|e| phase.is_match(e)));
    for series in [
        "qbridge_diff_outcome_mismatches",
        "qbridge_diff_mismatch_ratio",
        "qbridge_diff_one_sided_jobs",
        "qbridge_diff_mirror_completeness_ratio",
        "qbridge_diff_ran_both_sides",
        "qbridge_jobs_table_dead_tuples",
        "qbridge_oldest_xmin_age_xids",
        "qbridge_oldest_transaction_seconds",
    ] {
        need(series, uses(series));
    }
    need(
        "mirror lag p99",
        quantile_of("qbridge_mirror_lag_seconds_bucket"),
    );
    need(
        "proxy commands per second",
        rate_of("qbridge_proxy_commands_total"),
    );
    assert!(missing.is_empty(), "the dashboard lacks: {missing:?}");
}

#[test]
fn the_dashboard_is_well_formed_and_uses_the_provisioned_datasource() {
    let dash = dashboard();
    let uid = datasource_uid();
    assert_eq!(dash["uid"].as_str(), Some("qbridge"));
    let schema = dash["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");

    let mut ids = BTreeSet::new();
    let mut cells: BTreeMap<(u64, u64), String> = BTreeMap::new();
    let mut data_panels = 0;
    for p in panels(&dash) {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        let id = p["id"].as_u64().expect("every panel has an id");
        assert!(ids.insert(id), "panel id {id} ({title}) is used twice");
        let kind = p["type"].as_str().unwrap_or("");
        assert!(
            ["timeseries", "stat", "row"].contains(&kind),
            "panel {title}: type {kind:?}"
        );
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24 && w > 0 && h > 0, "panel {title}: gridPos {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = cells.insert((cx, cy), title.clone()) {
                    panic!("panels {other} and {title} overlap");
                }
            }
        }
        if kind == "row" {
            continue;
        }
        data_panels += 1;
        assert_eq!(
            p["datasource"]["uid"].as_str(),
            Some(uid.as_str()),
            "panel {title} uses the provisioned datasource"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        let mut ref_ids = BTreeSet::new();
        for t in targets {
            assert!(
                ref_ids.insert(t["refId"].as_str().expect("refId")),
                "panel {title}: a refId twice"
            );
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {title}: a target without expr"
            );
            let ds = t["datasource"]["uid"].as_str();
            assert!(
                ds.is_none() || ds == Some(uid.as_str()),
                "panel {title}: a target on datasource {ds:?}"
            );
        }
    }
    assert!(data_panels >= 10);
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"].as_str() == Some("query") {
            assert_eq!(v["datasource"]["uid"].as_str(), Some(uid.as_str()));
        }
    }
}
