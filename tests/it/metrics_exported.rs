//! Every metric the book tells an operator to watch is one qbridge exports
//! (`qbridge::metrics::ALL`), and every counter among them shows in
//! `/metrics` from the moment a process starts, at 0 per route or queue —
//! not only after it first counts (an absent series reads as "not
//! exported", and an alert on it never fires).

use std::collections::BTreeSet;

use crate::cutover::rig::{Options, Rig};

/// The `qbridge_…` names the book's pages cite (a histogram's `_bucket`
/// series named as its histogram; a bare prefix like `qbridge_diff_` is
/// not a name).
fn documented() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/src");
    let re = regex::Regex::new(r"qbridge_[a-z_]+").unwrap();
    let mut stack = vec![std::path::PathBuf::from(dir)];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for m in re.find_iter(&text) {
                let name = m.as_str();
                if name.ends_with('_') || NOT_METRICS.contains(&name) {
                    continue;
                }
                let name = name.strip_suffix("_bucket").unwrap_or(name);
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// `qbridge_…` words of the book that name other things: the Postgres
/// roles, the Python package, the task option, the NOTIFY channel.
const NOT_METRICS: &[&str] = &[
    "qbridge_migrator",
    "qbridge_runtime",
    "qbridge_reporter",
    "qbridge_readonly",
    "qbridge_adapters",
    "qbridge_shadow",
    "qbridge_phases",
];

/// Counters whose labels name something known only when it happens (the
/// push's path, the settled re-push's result): they appear with their
/// first count.
const ON_FIRST_COUNT: &[&str] = &[
    "qbridge_route_pushes_total",
    "qbridge_mirrored_total",
    "qbridge_proxy_postgres_writes_total",
    "qbridge_repushes_settled_total",
    "qbridge_prefetch_handed_back_total",
];

#[test]
fn every_metric_the_book_names_is_exported() {
    let unknown: Vec<String> = documented()
        .into_iter()
        .filter(|n| !qbridge::metrics::ALL.contains(&n.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "the book names metrics qbridge does not export: {unknown:?}"
    );
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_counters_the_book_names_show_from_the_start(pool: sqlx::PgPool) {
    let handle = qbridge::telemetry::prometheus();
    let mut rig = Rig::new(&pool, Options::default()).await;
    rig.start().await;
    let route = rig.route();
    let text = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let text = handle.render();
            if text.contains(&format!(
                "qbridge_mirror_lost_total{{route=\"{}\"}}",
                route.name
            )) {
                return text;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the runtime's zero series within 10 s");
    let missing: Vec<String> = documented()
        .into_iter()
        .filter(|n| n.ends_with("_total") && !ON_FIRST_COUNT.contains(&n.as_str()))
        .filter(|n| {
            !text
                .lines()
                .any(|l| l.starts_with(&format!("{n}{{")) || l.starts_with(&format!("{n} ")))
        })
        .collect();
    assert!(missing.is_empty(), "not in /metrics at start: {missing:?}");
    assert!(
        text.contains("qbridge_outcomes_dropped_total{reason=\"full\"} 0"),
        "{text}"
    );
    rig.finish().await;
}
