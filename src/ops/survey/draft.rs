//! The draft `qbridge.toml` a survey writes (`--write-config FILE`): one
//! route per queue in `redis_only`, with what the survey could tell (key,
//! format, push end, the framework's retry default, Celery's priority
//! steps) and a comment for each thing a human must decide (the handler
//! first). It loads with `Config::load` as written; the tests load it.
//!
//! The Redis password never goes into the file (`redis_url` is written
//! without it): qbridge takes secrets from the environment.

use std::collections::HashSet;
use std::path::Path;

use super::report::{Framework, QueueRow, Survey};
use super::{celery, resque, rq, sidekiq};

/// The draft for `survey`, read from `redis_url` (its password left out)
/// trusting `ca_file` on `rediss://`.
pub fn draft(survey: &Survey, redis_url: &str, ca_file: Option<&Path>) -> String {
    let mut out = format!(
        "# Draft written by `qbridge survey` on {} from Redis {}.\n\
         # Review every route and decide what the comments marked DECIDE ask,\n\
         # then follow docs/src/guides/survey.md.\n\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        survey
            .redis_version
            .as_deref()
            .unwrap_or("(version unknown)")
    );
    match without_password(redis_url) {
        Some(url) => out.push_str(&format!(
            "redis_url = {}   # the password stays out of this file: give it with --redis-url or QBRIDGE_REDIS_URL\n",
            quoted(&url)
        )),
        None => out.push_str("# redis_url = \"redis://…\"   # DECIDE: the survey's URL did not parse\n"),
    }
    if let Some(ca) = ca_file {
        out.push_str(&format!(
            "redis_ca_file = {}\n",
            quoted(&ca.to_string_lossy())
        ));
    }
    let mut names = HashSet::new();
    for row in &survey.queues {
        out.push('\n');
        out.push_str(&route(row, &mut names));
    }
    if survey.queues.is_empty() {
        out.push_str(
            "\n# No queue was found: add [[routes]] by hand (docs/src/guides/routes.md).\n",
        );
    }
    out
}

/// One `[[routes]]` entry (commented out whole when its key is not UTF-8:
/// a route's `redis_key` is text).
fn route(row: &QueueRow, names: &mut HashSet<String>) -> String {
    let name = unique_name(row, names);
    let mut lines = vec![format!("# {}", summary(row))];
    let Ok(key) = std::str::from_utf8(&row.raw_key) else {
        lines.push(format!(
            "# DECIDE: the list {} is not UTF-8 and a route's redis_key is text; rename it or leave it out",
            row.key
        ));
        return lines.join("\n") + "\n";
    };
    lines.push("[[routes]]".into());
    lines.push(format!("name = {}", quoted(&name)));
    lines.push(format!("redis_key = {}", quoted(key)));
    lines.push(format!("queue = {}   # the Postgres queue", quoted(&name)));
    let format = match row.framework {
        Framework::List => row.format_guess.clone().unwrap_or_else(|| "raw".into()),
        f => f.format().to_string(),
    };
    lines.push(format!("format = {}", quoted(&format)));
    let push = match row.push {
        crate::config::PushEnd::Lpush => "lpush",
        crate::config::PushEnd::Rpush => "rpush",
    };
    if row.framework == Framework::List {
        lines.push(format!(
            "push = \"{push}\"   # DECIDE: the end your producers push to"
        ));
    } else {
        lines.push(format!("push = \"{push}\""));
    }
    lines.push("phase = \"redis_only\"".into());
    if row.framework != Framework::List {
        lines.push("redis_side = \"fleet\"   # your own workers run the Redis side".into());
    }
    if let Some((n, why)) = max_attempts(row.framework) {
        lines.push(format!("max_attempts = {n}   # {why}"));
    }
    if !row.priority_steps.is_empty() {
        lines.push(priority_steps(&row.priority_steps));
    }
    if row.framework == Framework::Celery && !row.namespace.is_empty() {
        lines.push(format!(
            "key_prefix = {}   # kombu's global_keyprefix",
            quoted(&row.namespace)
        ));
    }
    lines.push(
        "# handler = { type = \"http\", url = \"http://127.0.0.1:8091/\" }   # DECIDE: what runs these jobs on the Postgres side (docs/src/guides/frameworks.md)"
            .into(),
    );
    lines.join("\n") + "\n"
}

/// The framework's own attempts, and why.
fn max_attempts(framework: Framework) -> Option<(i32, &'static str)> {
    Some(match framework {
        Framework::Sidekiq => (
            sidekiq::MAX_ATTEMPTS,
            "Sidekiq: 25 retries + the first run (DECIDE if your jobs set `retry`)",
        ),
        Framework::Celery => (
            celery::MAX_ATTEMPTS,
            "Celery: max_retries 3 + the first run, for tasks that call retry (1 if none does)",
        ),
        Framework::Rq => (
            rq::MAX_ATTEMPTS,
            "RQ: one run unless jobs are enqueued with Retry",
        ),
        Framework::Resque => (
            resque::MAX_ATTEMPTS,
            "Resque: one run (retries need resque-retry)",
        ),
        Framework::List => return None,
    })
}

/// kombu's default steps when the lists found fit them, else the steps
/// found (and a note that the broker's setting decides).
fn priority_steps(found: &[u8]) -> String {
    let default = crate::model::structures::CELERY_PRIORITY_STEPS;
    if found.iter().all(|s| default.contains(s)) {
        "priority_steps = [0, 3, 6, 9]   # kombu's default; DECIDE if broker_transport_options sets priority_steps".into()
    } else {
        let mut steps = vec![0u8];
        steps.extend(found.iter().copied().filter(|s| *s > 0));
        steps.sort_unstable();
        steps.dedup();
        format!(
            "priority_steps = {steps:?}   # the steps whose lists exist; DECIDE: copy broker_transport_options' priority_steps"
        )
    }
}

/// What the survey counted for the queue, as a comment (no payload).
fn summary(row: &QueueRow) -> String {
    let n = |v: Option<u64>| v.map_or("-".to_string(), |n| n.to_string());
    let mut s = format!(
        "{}{}: {} waiting, {} scheduled, {} retrying, {} dead, {} in flight",
        row.framework.name(),
        if row.namespace.is_empty() {
            String::new()
        } else {
            format!(" ({})", row.namespace)
        },
        row.waiting,
        n(row.scheduled),
        n(row.retrying),
        n(row.dead),
        n(row.in_flight)
    );
    if let Some(rate) = &row.push_rate {
        s.push_str(&format!(
            ", {}{:.1} pushes/s",
            if rate.exact { "" } else { ">=" },
            rate.per_second
        ));
    }
    if row.framework == Framework::List {
        s.push_str("; DECIDE: is this list a queue?");
    }
    s
}

/// A route name for `row` no other route has: the queue's name, then with
/// the namespace, then with the framework, then numbered; only `A-Z a-z
/// 0-9 _ . -` (route names go into Redis keys and SCAN patterns).
fn unique_name(row: &QueueRow, taken: &mut HashSet<String>) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .take(100)
            .collect()
    };
    let queue = clean(&row.queue);
    let ns = clean(row.namespace.trim_end_matches(':'));
    let framework = row.framework.name();
    let mut candidates = vec![queue.clone()];
    if !ns.is_empty() {
        candidates.push(format!("{ns}-{queue}"));
    }
    candidates.push(format!("{framework}-{queue}"));
    candidates.push(format!("{framework}-{ns}-{queue}"));
    let chosen = candidates
        .into_iter()
        .find(|c| !c.is_empty() && !taken.contains(c))
        .unwrap_or_else(|| {
            (2..)
                .map(|i| format!("{framework}-{queue}-{i}"))
                .find(|c| !taken.contains(c))
                .expect("an unused number")
        });
    taken.insert(chosen.clone());
    chosen
}

/// `url` without its password; `None` when it is no URL. A Sentinel URL
/// naming several hosts (`redis+sentinel://h1:26379,h2:26379/master`) is
/// no URL to the `url` crate: its password is cut out of the text.
fn without_password(url: &str) -> Option<String> {
    if let Ok(mut parsed) = url::Url::parse(url) {
        if parsed.password().is_some() {
            parsed.set_password(None).ok()?;
        }
        return Some(parsed.to_string());
    }
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let Some(at) = authority.rfind('@') else {
        return Some(url.to_string());
    };
    let user = authority[..at].split(':').next().unwrap_or("");
    let user = if user.is_empty() {
        String::new()
    } else {
        format!("{user}@")
    };
    Some(format!("{}{user}{}", &url[..start], &rest[at + 1..]))
}

/// A TOML basic string (control bytes escaped).
fn quoted(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_unique_and_fit_a_route_name() {
        let mut taken = HashSet::new();
        let row = |f, ns: &str, q: &str| QueueRow::new(f, ns, q, q.as_bytes().to_vec());
        let a = unique_name(&row(Framework::Sidekiq, "", "default"), &mut taken);
        let b = unique_name(&row(Framework::Sidekiq, "acme", "default"), &mut taken);
        let c = unique_name(&row(Framework::Rq, "rq", "default"), &mut taken);
        let d = unique_name(&row(Framework::List, "", "jobs:in"), &mut taken);
        assert_eq!(
            [a, b, c, d],
            ["default", "acme-default", "rq-default", "jobs_in"]
        );
    }

    #[test]
    fn a_draft_loads_with_the_config_loader() {
        let mut sidekiq = QueueRow::new(
            Framework::Sidekiq,
            "acme",
            "default",
            b"acme:queue:default".to_vec(),
        );
        sidekiq.scheduled = Some(2);
        let mut celery = QueueRow::new(
            Framework::Celery,
            "acme:",
            "orders",
            b"acme:orders".to_vec(),
        );
        celery.priority_steps = vec![3, 5];
        let mut list = QueueRow::new(Framework::List, "", "jobs:in", b"jobs:in".to_vec());
        list.format_guess = Some("json:/id".into());
        let odd = QueueRow::new(Framework::List, "", "x", vec![0xff, b'x']);
        let survey = Survey {
            redis_version: Some("7.0.15".into()),
            keys: 4,
            scan_seconds: 0.0,
            frameworks: Vec::new(),
            queues: vec![sidekiq, celery, list, odd],
            sample_seconds: 0.0,
            server_pushes: None,
            notes: Vec::new(),
        };
        let text = draft(&survey, "redis://app:s3cret@cache:6379/2", None);
        assert!(!text.contains("s3cret"), "{text}");
        let config = crate::config::Config::from_toml(&text, &Default::default()).unwrap();
        let routes: Vec<(&str, &str, String)> = config
            .routes
            .iter()
            .map(|r| (r.name.as_str(), r.redis_key.as_str(), r.format.to_string()))
            .collect();
        assert_eq!(
            routes,
            [
                ("default", "acme:queue:default", "sidekiq".to_string()),
                ("orders", "acme:orders", "celery".to_string()),
                ("jobs_in", "jobs:in", "json:/id".to_string()),
            ]
        );
        assert_eq!(
            config.routes[1].keys.priority_steps.as_deref(),
            Some(&[3u8, 5][..])
        );
        assert_eq!(config.routes[0].max_attempts, Some(26));
        assert!(text.contains("key_prefix = \"acme:\""), "{text}");
    }

    #[test]
    fn the_password_stays_out() {
        assert_eq!(
            without_password("redis://app:s3cret@cache:6380/2").as_deref(),
            Some("redis://app@cache:6380/2")
        );
        assert_eq!(without_password("not a url"), None);
        assert_eq!(
            without_password("redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/mymaster").as_deref(),
            Some("redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster")
        );
        assert_eq!(
            without_password("redis+sentinel://app:pw@h1:1,h2:2/m").as_deref(),
            Some("redis+sentinel://app@h1:1,h2:2/m")
        );
    }
}
