//! The book's configuration table (`docs/src/reference/configuration.md`)
//! against the code: every default it states is the one a minimal
//! configuration gets through `Config::from_toml`, and every key of the
//! configuration structs in `src/config` has a row. A default changed in the
//! code without the table (or the other way round) fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use qbridge::config::{parse_duration, parse_size, Config, Overrides};

const TABLE: &str = "docs/src/reference/configuration.md";

/// A default as the code has it.
#[derive(Debug)]
enum Val {
    Str(String),
    Int(i64),
    Float(f64),
    Dur(Duration),
    Size(usize),
    Bool(bool),
    /// An enum, compared by its Debug name against the documented string.
    Enum(String),
    /// Not set (`none` in the table).
    Absent,
}

/// The table's rows: key → default cell.
fn table_rows() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join(TABLE)).expect("the reference page");
    let mut rows = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        assert!(cells.len() >= 5, "{TABLE}: a row without 5 cells: {line}");
        let key = cells[0].trim().trim_matches('`').to_string();
        let previous = rows.insert(key.clone(), cells[2].trim().to_string());
        assert!(previous.is_none(), "{TABLE}: `{key}` has two rows");
    }
    rows
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One pool, one route without and one with a Redis consumer: every section
/// present, nothing but what is required set.
const MINIMAL: &str = r#"
[[pools]]
queues = ["plain"]
handler = { type = "http", url = "http://127.0.0.1:1/" }

[[schedules]]
name = "tick"
queue = "plain"
every = "60s"

[[routes]]
redis_key = "list:a"
queue = "a"
format = "json:/id"
handler = { type = "noop" }

[[routes]]
redis_key = "list:b"
queue = "b"
format = "raw"
handler = { type = "noop" }
redis_consumer = {}
"#;

/// The code's default for each key whose default the test can read.
fn code_defaults(c: &Config) -> Vec<(&'static str, Val)> {
    use Val::*;
    let pool = &c.pools[0];
    let route = &c.routes[0];
    let route_pool = c
        .pools
        .iter()
        .find(|p| p.queues == ["a"])
        .expect("route a's pool");
    let consumer = c.routes[1]
        .redis_consumer
        .as_ref()
        .expect("route b's consumer");
    let (shadow, diff, gates) = (
        &route.cutover.shadow,
        &route.cutover.diff,
        &route.cutover.gates,
    );
    let timeout = match &pool.handler {
        qbridge::config::HandlerConfig::Http { timeout, .. } => timeout.0,
        other => panic!("the minimal pool's handler is http: {other:?}"),
    };
    let opt = |v: &Option<String>| v.clone().map(Str).unwrap_or(Absent);
    let path = |v: &Option<std::path::PathBuf>| {
        v.as_ref().map_or(Absent, |p| Str(p.display().to_string()))
    };
    let job = &c.schedules[0].job;
    vec![
        ("database_url", Str(c.database_url.clone())),
        ("max_connections", Int(c.max_connections.into())),
        ("shutdown_deadline", Dur(c.shutdown_deadline)),
        ("payload_limit", Size(c.payload_limit)),
        ("reaper_interval", Dur(c.reaper_interval)),
        ("completer_batch", Int(c.completer_batch as i64)),
        ("completer_tick", Dur(c.completer_tick)),
        ("redis_url", Str(c.redis_url.clone())),
        (
            "[database] pooler",
            Enum(format!("{:?}", c.database.pooler)),
        ),
        ("[database] direct_url", opt(&c.database.direct_url)),
        ("[http] listen", Str(c.http.listen.clone())),
        ("[http] max_body", Size(c.http.max_body.0)),
        (
            "[http] enqueue_requires_token",
            Bool(c.http.enqueue_requires_token),
        ),
        ("[http] admin_token_file", path(&c.http.admin_token_file)),
        ("[http] report_token_file", path(&c.http.report_token_file)),
        (
            "[http] enqueue_token_file",
            path(&c.http.enqueue_token_file),
        ),
        (
            "[history] retention_days",
            Int(c.history.retention_days.into()),
        ),
        ("[proxy] enabled", Bool(c.proxy.enabled)),
        ("[proxy] listen", Str(c.proxy.listen.clone())),
        ("[proxy] max_bulk_len", Size(c.proxy.max_bulk_len)),
        ("[proxy] max_elements", Int(c.proxy.max_elements as i64)),
        ("[proxy] max_clients", Int(c.proxy.max_clients as i64)),
        ("[proxy] mirror_buffer", Size(c.proxy.mirror_buffer)),
        ("[proxy] mirror_batch", Int(c.proxy.mirror_batch as i64)),
        ("[proxy] mirror_writers", Int(c.proxy.mirror_writers as i64)),
        ("[proxy] mirror_linger", Dur(c.proxy.mirror_linger)),
        (
            "[proxy] password_file",
            c.proxy
                .password
                .as_ref()
                .map_or(Absent, |_| Str("set".into())),
        ),
        ("[[pools]] concurrency", Int(pool.concurrency as i64)),
        ("[[pools]] batch_size", Int(pool.batch_size)),
        ("[[pools]] lease", Dur(pool.lease)),
        ("[[pools]] poll_interval", Dur(pool.poll_interval)),
        ("[[pools]] prefetch_window", Dur(pool.prefetch_window)),
        ("[[pools]] backoff_base", Dur(pool.backoff.base)),
        ("[[pools]] backoff_cap", Dur(pool.backoff.cap)),
        ("[[pools]] lock_retry_delay", Dur(pool.lock_retry_delay)),
        ("handler timeout", Dur(timeout)),
        ("[[schedules]] kind", opt(&job.kind)),
        ("[[schedules]] priority", Int(job.priority.into())),
        ("[[routes]] phase", Enum(format!("{:?}", route.phase))),
        ("[[routes]] push", Enum(format!("{:?}", route.push))),
        ("[[routes]] dedup_window", Dur(route.dedup_window)),
        ("[[routes]] key_prefix", opt(&route.keys.prefix)),
        ("[[routes]] priority_sep", opt(&route.keys.priority_sep)),
        ("[[routes]] unacked_key", opt(&route.keys.unacked_key)),
        (
            "[[routes]] unacked_index_key",
            opt(&route.keys.unacked_index_key),
        ),
        (
            "[routes.pool] concurrency",
            Int(route_pool.concurrency as i64),
        ),
        ("[routes.pool] batch_size", Int(route_pool.batch_size)),
        ("[routes.pool] lease", Dur(route_pool.lease)),
        ("[routes.pool] poll_interval", Dur(route_pool.poll_interval)),
        (
            "[routes.pool] prefetch_window",
            Dur(route_pool.prefetch_window),
        ),
        ("[routes.pool] backoff_base", Dur(route_pool.backoff.base)),
        ("[routes.pool] backoff_cap", Dur(route_pool.backoff.cap)),
        (
            "[routes.redis_consumer] concurrency",
            Int(consumer.concurrency as i64),
        ),
        (
            "[routes.redis_consumer] max_attempts",
            Int(consumer.max_attempts.into()),
        ),
        (
            "[routes.redis_consumer] retry_delay",
            Dur(consumer.retry_delay),
        ),
        (
            "[routes.shadow] dual_write",
            Enum(format!("{:?}", shadow.dual_write)),
        ),
        ("[routes.shadow] noise_sample", Float(shadow.noise_sample)),
        ("[routes.diff] settle", Dur(diff.settle)),
        ("[routes.diff] sample_keys", Int(diff.sample_keys as i64)),
        ("[routes.gates] window", Dur(gates.window)),
        ("[routes.gates] min_jobs", Int(gates.min_jobs as i64)),
        (
            "[routes.gates] mirror_completeness",
            Float(gates.mirror_completeness),
        ),
        ("[routes.gates] ack_tolerance", Float(gates.ack_tolerance)),
        (
            "[routes.gates] max_mismatch_rate",
            Float(gates.max_mismatch_rate),
        ),
        (
            "[routes.gates] max_postgres_lag",
            Dur(gates.max_postgres_lag),
        ),
        ("[routes.gates] quiet_period", Dur(gates.quiet_period)),
        (
            "[routes.gates] decommission_wait",
            Dur(gates.decommission_wait),
        ),
    ]
}

/// Keys whose default the table states in words the test cannot compare
/// with one value, and why. A key must be here or in `code_defaults`.
const IN_WORDS: &[(&str, &str)] = &[
    ("worker_id", "$HOSTNAME:pid, from the machine"),
    (
        "state_dir",
        "$STATE_DIRECTORY, else the XDG state folder, from the environment",
    ),
    (
        "redis_ca_file",
        "none: the system's CAs (a TLS setting, no value to read)",
    ),
    ("[proxy] upstream", "redis_url's value"),
    (
        "[http] enqueue_queues",
        "empty: every queue (a list, not one value)",
    ),
    ("[proxy] upstream_ca_file", "redis_ca_file's trust"),
    ("[[pools]] name", "poolN by position"),
    ("[[pools]] queues", "required"),
    ("[[pools]] kinds", "all kinds"),
    ("[[pools]] handler", "required"),
    ("[pools.tenant] pointer", "required"),
    ("[pools.tenant] cap", "required"),
    ("handler type", "required"),
    ("handler url", "required"),
    ("handler headers", "none: an empty table"),
    ("handler program", "required"),
    ("handler args", "none: an empty list"),
    ("handler permanent_exit_codes", "none: an empty list"),
    ("[[schedules]] name", "required"),
    ("[[schedules]] queue", "required"),
    ("[[schedules]] every", "one of every or cron"),
    ("[[schedules]] cron", "one of every or cron"),
    ("[[schedules]] payload", "an empty JSON object"),
    ("[[routes]] name", "the queue's name"),
    ("[[routes]] redis_key", "required"),
    ("[[routes]] db", "redis_url's database"),
    ("[[routes]] queue", "required"),
    ("[[routes]] format", "required"),
    ("[[routes]] key_pointer", "part of the format"),
    ("[[routes]] max_attempts", "the queue's default"),
    ("[[routes]] handler", "none"),
    ("[[routes]] redis_side", "depends on redis_consumer"),
    ("[[routes]] priority_steps", "kombu's steps, kept as none"),
    ("[routes.redis_consumer] consumer_name", "the host name"),
    ("[routes.shadow] handler", "the route's handler"),
    ("[routes.diff] ignore_fields", "none: an empty list"),
    ("[routes.diff] ignore_patterns", "none: an empty list"),
];

/// The default cell's value: its first code span, or the bare word `none`.
fn documented(cell: &str) -> Option<String> {
    if cell == "none" || cell.starts_with("none ") {
        return Some("none".into());
    }
    let rest = cell.strip_prefix('`')?;
    Some(rest[..rest.find('`')?].to_string())
}

fn matches(doc: &str, code: &Val) -> bool {
    let text = doc.trim_matches('"');
    let number = || text.replace([',', '_'], "");
    match code {
        Val::Absent => doc == "none",
        Val::Str(s) => doc.starts_with('"') && text == s,
        Val::Int(i) => number().parse::<i64>().is_ok_and(|d| d == *i),
        Val::Float(f) => number().parse::<f64>().is_ok_and(|d| d == *f),
        Val::Dur(d) => doc.starts_with('"') && parse_duration(text).is_ok_and(|v| v == *d),
        Val::Size(s) => parse_size(text).is_ok_and(|v| v == *s),
        Val::Bool(b) => text.parse::<bool>().is_ok_and(|v| v == *b),
        Val::Enum(name) => {
            let norm = |s: &str| s.to_lowercase().replace(['_', '-'], "");
            doc.starts_with('"') && norm(text) == norm(name)
        }
    }
}

#[test]
fn every_documented_default_is_the_codes() {
    let rows = table_rows();
    let config = Config::from_toml(MINIMAL, &Overrides::default()).expect("the minimal config");
    let checked = code_defaults(&config);
    let mut wrong = Vec::new();
    for (key, code) in &checked {
        let Some(cell) = rows.get(*key) else {
            wrong.push(format!("`{key}` has no row in {TABLE}"));
            continue;
        };
        match documented(cell) {
            Some(doc) if matches(&doc, code) => {}
            _ => wrong.push(format!("`{key}`: {TABLE} says {cell}, the code {code:?}")),
        }
    }
    let known: BTreeSet<&str> = checked
        .iter()
        .map(|(k, _)| *k)
        .chain(IN_WORDS.iter().map(|(k, _)| *k))
        .collect();
    for key in rows.keys() {
        if !known.contains(key.as_str()) {
            wrong.push(format!(
                "`{key}` is in {TABLE} but neither checked nor listed in IN_WORDS"
            ));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

/// The sections of the table, by the struct that deserializes each.
const SECTIONS: &[(&str, &str)] = &[
    ("FileConfig", ""),
    ("DatabaseFile", "[database]"),
    ("HttpConfig", "[http]"),
    ("HistoryConfig", "[history]"),
    ("ProxyFile", "[proxy]"),
    ("PoolFile", "[[pools]]"),
    ("TenantConfig", "[pools.tenant]"),
    ("HandlerConfig", "handler"),
    ("ScheduleFile", "[[schedules]]"),
    ("RouteFile", "[[routes]]"),
    ("RoutePoolFile", "[routes.pool]"),
    ("RedisConsumerFile", "[routes.redis_consumer]"),
    ("ShadowFile", "[routes.shadow]"),
    ("DiffFile", "[routes.diff]"),
    ("GatesFile", "[routes.gates]"),
];

/// The field names of `struct name { … }` (or an enum's variants' fields)
/// in the configuration's sources.
fn fields_of(name: &str) -> Vec<String> {
    let mut sources = vec![root().join("src/config.rs")];
    for entry in std::fs::read_dir(root().join("src/config")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            sources.push(path);
        }
    }
    for path in sources {
        let text = std::fs::read_to_string(&path).unwrap();
        for opener in [format!("struct {name} {{"), format!("enum {name} {{")] {
            let Some(start) = text.find(&opener) else {
                continue;
            };
            let mut depth = 0;
            let mut fields = Vec::new();
            for line in text[start..].lines() {
                let code = line.split("//").next().unwrap_or("");
                if depth >= 1 && !code.trim_start().starts_with('#') {
                    let decl = code.trim_start().trim_start_matches("pub(crate) ");
                    let decl = decl
                        .trim_start_matches("pub(super) ")
                        .trim_start_matches("pub ");
                    if let Some((field, _)) = decl.split_once(':') {
                        let is_ident = !field.is_empty()
                            && field.chars().all(|c| c.is_ascii_lowercase() || c == '_');
                        if is_ident {
                            fields.push(field.to_string());
                        }
                    }
                }
                depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
                if depth <= 0 {
                    break;
                }
            }
            return fields;
        }
    }
    panic!("no struct or enum {name} in src/config");
}

#[test]
fn every_key_of_the_code_has_a_row() {
    let rows = table_rows();
    // A field that is a table of its own is covered by that section's rows.
    let section_names: BTreeSet<String> = SECTIONS
        .iter()
        .map(|(_, s)| {
            s.trim_matches(['[', ']'])
                .rsplit('.')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut missing = Vec::new();
    for (name, section) in SECTIONS {
        let fields = fields_of(name);
        assert!(!fields.is_empty(), "found no fields in {name}");
        for field in fields {
            let key = if section.is_empty() {
                field.clone()
            } else {
                format!("{section} {field}")
            };
            if !rows.contains_key(&key) && !section_names.contains(&field) {
                missing.push(key);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys of src/config missing from {TABLE}: {missing:?}"
    );
}

/// The README's ten-line example is a configuration qbridge accepts.
#[test]
fn the_readme_example_loads() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme.find("```toml\n").expect("README has a TOML example") + 8;
    let example = &readme[start..start + readme[start..].find("```").unwrap()];
    let config = Config::from_toml(example, &Overrides::default()).expect("README's example");
    assert_eq!(config.routes.len(), 1);
    assert!(config.proxy.enabled);
}
