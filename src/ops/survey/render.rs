//! The survey as text: a header line, one row per queue, what each
//! framework installation hints at, the server's push counters, and the
//! notes. `-` is a state the framework does not have (or cannot be seen),
//! `~` a count scaled from part of a shared structure, `>=` a push rate
//! that may miss pushes consumed within the window.

use super::report::{Framework, QueueRow, Survey};
use crate::output;

const HEADER: [&str; 10] = [
    "framework",
    "queue",
    "key",
    "waiting",
    "scheduled",
    "retrying",
    "dead",
    "in flight",
    "bytes p50/max",
    "push/s",
];

/// The whole report.
pub fn text(s: &Survey) -> String {
    let mut out = format!(
        "Redis {}, {} keys scanned in {:.2}s{}\n\n",
        s.redis_version.as_deref().unwrap_or("(version unknown)"),
        s.keys,
        s.scan_seconds,
        if s.sample_seconds > 0.0 {
            format!("; push rates sampled over {}s", s.sample_seconds)
        } else {
            String::new()
        }
    );
    if s.queues.is_empty() {
        out.push_str("no queue found: no framework's keys and no lists in this database\n");
    } else {
        let rows: Vec<Vec<String>> = s.queues.iter().map(row).collect();
        out.push_str(&output::table(&HEADER, &rows));
        out.push('\n');
    }
    if !s.frameworks.is_empty() {
        out.push('\n');
    }
    for f in &s.frameworks {
        let mut parts = Vec::new();
        if f.framework != Framework::List {
            parts.push(format!("{} worker process(es) registered", f.workers));
        }
        parts.extend(f.version_hints.iter().cloned());
        parts.extend(f.options.iter().cloned());
        out.push_str(&format!(
            "{}: {}\n",
            label(f.framework.name(), &f.namespace),
            parts.join("; ")
        ));
    }
    if let Some(p) = &s.server_pushes {
        out.push_str(&format!(
            "\nserver-wide over the window: {:.1} LPUSH/RPUSH/LPUSHX/RPUSHX calls/s to any list, {:.1} script calls/s (EVAL/EVALSHA/FCALL; a script may push too)\n",
            p.push_calls_per_second, p.script_calls_per_second
        ));
    }
    if s.sample_seconds > 0.0 {
        out.push_str("push/s counts the items that arrived in each list during the window; >= means workers took some, and what they took within the window is not seen\n");
    }
    for row in s.queues.iter().filter(|q| !q.notes.is_empty()) {
        out.push_str(&format!(
            "{} {}: {}\n",
            row.framework.name(),
            row.key,
            row.notes.join("; ")
        ));
    }
    for note in &s.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

fn label(framework: &str, namespace: &str) -> String {
    if namespace.is_empty() {
        framework.to_string()
    } else {
        format!("{framework} ({namespace})")
    }
}

fn row(q: &QueueRow) -> Vec<String> {
    let count = |n: Option<u64>, column: &str| match n {
        None => "-".to_string(),
        Some(n) if q.estimated.contains(&column) => format!("~{n}"),
        Some(n) => n.to_string(),
    };
    let mut waiting = q.waiting.to_string();
    if !q.priority_steps.is_empty() {
        waiting.push_str(&format!(" incl. prio {:?}", q.priority_steps));
    }
    vec![
        label(q.framework.name(), &q.namespace),
        q.queue.clone(),
        q.key.clone(),
        waiting,
        count(q.scheduled, "scheduled"),
        count(q.retrying, "retrying"),
        count(q.dead, "dead"),
        count(q.in_flight, "in_flight"),
        q.payload
            .as_ref()
            .map_or("-".into(), |p| format!("{}/{}", p.p50_bytes, p.max_bytes)),
        q.push_rate.as_ref().map_or("-".into(), |r| {
            format!("{}{:.1}", if r.exact { "" } else { ">=" }, r.per_second)
        }),
    ]
}
