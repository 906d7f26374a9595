//! Running `qbridge survey` the way the tests need it: as an ACL user of
//! the throwaway Redis that may only read (a write would be refused, and
//! the refusal would be in `ACL LOG`, which must stay empty), with every
//! key's type, content and TTL compared before and after when nothing else
//! runs (and the number of keys), and with
//! no form of the payloads' marker in anything the survey printed or wrote.

use std::collections::BTreeMap;
use std::path::PathBuf;

use qbridge::config::{Config, Overrides};
use serde_json::Value;

use crate::servers::ThrowawayRedis;
use crate::support;

/// The text every test payload carries: it must never reach the output.
pub const MARK: &str = "qbt-survey-payload-5c1e9a";

/// The read-only user the survey runs as.
const USER: &str = "qbt-surveyor";
const PASSWORD: &str = "survey-pw-41d7";

/// What one survey printed and wrote.
pub struct Surveyed {
    pub json: Value,
    pub text: String,
    pub draft: Config,
    pub draft_text: String,
}

impl Surveyed {
    /// The row of `queue` of `framework` under `namespace` (panics with the
    /// rows when there is none).
    pub fn row(&self, framework: &str, namespace: &str, queue: &str) -> &Value {
        self.json["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                r["framework"] == framework && r["namespace"] == namespace && r["queue"] == queue
            })
            .unwrap_or_else(|| {
                panic!(
                    "no {framework} row {namespace:?}/{queue:?} in {}",
                    self.json
                )
            })
    }

    /// The installation of `framework` under `namespace`.
    pub fn found(&self, framework: &str, namespace: &str) -> &Value {
        self.json["frameworks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["framework"] == framework && f["namespace"] == namespace)
            .unwrap_or_else(|| panic!("no {framework} {namespace:?} in {}", self.json))
    }

    /// The counts of a row: waiting, scheduled, retrying, dead, in flight
    /// (`-1` for a state the framework does not have).
    pub fn counts(&self, framework: &str, namespace: &str, queue: &str) -> [i64; 5] {
        let row = self.row(framework, namespace, queue);
        let n = |k: &str| row[k].as_i64().unwrap_or(-1);
        [
            n("waiting"),
            n("scheduled"),
            n("retrying"),
            n("dead"),
            n("in_flight"),
        ]
    }
}

/// An admin connection to the throwaway server.
pub async fn admin(redis: &ThrowawayRedis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// `qbridge survey --json --write-config` then the text form, as the
/// read-only user. `quiescent`: nothing else writes meanwhile, so every
/// key's DUMP must be the same after as before.
pub async fn survey_read_only(redis: &ThrowawayRedis, sample: &str, quiescent: bool) -> Surveyed {
    let mut conn = admin(redis).await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            USER,
            "reset",
            "on",
            &format!(">{PASSWORD}"),
            "~*",
            "resetchannels",
        ])
        .arg(&[
            "-@all", "+@read", "+info", "+ping", "+hello", "+select", "+auth",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg("LOG")
        .arg("RESET")
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = if quiescent {
        Some(dump_all(&mut conn).await)
    } else {
        None
    };
    let dir = tempfile::tempdir().unwrap();
    let draft_path: PathBuf = dir.path().join("qbridge.toml");
    let url = format!("redis://{USER}:{PASSWORD}@127.0.0.1:{}/0", redis.port);
    let json_run = support::qbridge(&[
        "survey",
        "--redis-url",
        &url,
        "--sample",
        sample,
        "--json",
        "--write-config",
        draft_path.to_str().unwrap(),
    ])
    .await;
    assert!(
        json_run.status.success(),
        "survey failed: {}",
        support::last_stderr_line(&json_run)
    );
    let text_run = support::qbridge(&["survey", "--redis-url", &url, "--sample", "0s"]).await;
    assert!(
        text_run.status.success(),
        "survey failed: {}",
        support::last_stderr_line(&text_run)
    );
    let log: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(log.is_empty(), "the survey was refused a command: {log:?}");
    if let Some(before) = before {
        let after = dump_all(&mut conn).await;
        assert_eq!(
            before.len(),
            after.len(),
            "the survey changed the number of keys"
        );
        let changed: Vec<String> = before
            .iter()
            .filter(|(k, v)| after.get(*k) != Some(*v))
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect();
        assert!(changed.is_empty(), "the survey changed keys: {changed:?}");
    }
    let draft_text = std::fs::read_to_string(&draft_path).unwrap();
    let outputs = [
        String::from_utf8_lossy(&json_run.stdout).into_owned(),
        String::from_utf8_lossy(&json_run.stderr).into_owned(),
        String::from_utf8_lossy(&text_run.stdout).into_owned(),
        String::from_utf8_lossy(&text_run.stderr).into_owned(),
        draft_text.clone(),
    ];
    for out in &outputs {
        for form in marker_forms() {
            assert!(
                !out.contains(&form),
                "a payload reached the output ({form:?}):\n{out}"
            );
        }
        assert!(
            !out.contains(PASSWORD),
            "the password reached the output:\n{out}"
        );
    }
    let draft = Config::load(Some(&draft_path), &Overrides::default())
        .unwrap_or_else(|e| panic!("the draft does not load: {e}\n{draft_text}"));
    Surveyed {
        json: serde_json::from_slice(&json_run.stdout).unwrap(),
        text: outputs[2].clone(),
        draft,
        draft_text,
    }
}

/// The marker as text and as it reads inside base64 (Celery's message
/// bodies), at each of base64's three alignments.
fn marker_forms() -> Vec<String> {
    use base64::Engine as _;
    let mut forms = vec![MARK.to_string()];
    for pad in 0..3 {
        let text = format!("{}{MARK}", "x".repeat(pad));
        let encoded = base64::engine::general_purpose::STANDARD.encode(text);
        // Characters touched by the padding or the end are left out.
        let start = (pad * 4).div_ceil(3) + 1;
        forms.push(encoded[start..encoded.len() - 4].to_string());
    }
    forms
}

/// Every key with its type, its content and whether it has a TTL. Not
/// DUMP's bytes: a hash or set kept as a hash table serializes in the
/// table's order, which a read may change (a lookup moves an incremental
/// rehash along) without changing a member; so members are compared in
/// sorted order, lists and sorted sets in theirs.
async fn dump_all(
    conn: &mut redis::aio::MultiplexedConnection,
) -> BTreeMap<Vec<u8>, (String, Vec<Vec<u8>>, bool)> {
    let mut out = BTreeMap::new();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        for key in keys {
            let kind: String = redis::cmd("TYPE")
                .arg(&key)
                .query_async(conn)
                .await
                .unwrap();
            let content = content(conn, &key, &kind).await;
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(conn)
                .await
                .unwrap();
            out.insert(key, (kind, content, ttl >= 0));
        }
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}

async fn content(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &[u8],
    kind: &str,
) -> Vec<Vec<u8>> {
    let read = |cmd: &str| {
        let mut c = redis::cmd(cmd);
        c.arg(key);
        c
    };
    let mut members: Vec<Vec<u8>> = match kind {
        "string" => vec![read("GET").query_async(conn).await.unwrap()],
        "list" => read("LRANGE")
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await
            .unwrap(),
        "zset" => read("ZRANGE")
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(conn)
            .await
            .unwrap(),
        "set" => read("SMEMBERS").query_async(conn).await.unwrap(),
        "hash" => {
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = read("HGETALL").query_async(conn).await.unwrap();
            pairs
                .into_iter()
                .map(|(f, v)| [f, b"=".to_vec(), v].concat())
                .collect()
        }
        _ => vec![read("DUMP").query_async(conn).await.unwrap()],
    };
    if kind == "set" || kind == "hash" {
        members.sort();
    }
    members
}

/// Runs `tests/python/<script> <args>` with the test venv's Python, in
/// that directory, with `env`; panics with its stderr when it fails.
pub async fn python(script: &str, args: &[&str], env: &[(&str, &str)]) {
    let out = tokio::process::Command::new(support::python())
        .arg(script)
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python"))
        .envs(env.iter().copied())
        .output()
        .await
        .expect("python runs");
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
