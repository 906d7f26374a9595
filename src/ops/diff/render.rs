//! The diff for people: the one-line verdict the gates and logs carry and
//! the table `qbridge diff` prints.

use super::Diff;

fn percent(r: f64) -> String {
    format!("{:.2}%", r * 100.0)
}

/// The one-line summary.
pub(super) fn verdict(d: &Diff) -> String {
    let head = if d.matches() { "MATCH" } else { "DIFFERS" };
    let mut line = format!(
        "{}: {head} ({}) — redis {} jobs, postgres {} enqueued; only on redis {} ({} ran with no Postgres copy, {} waiting with no copy: --repair copies those); only on postgres {}{}; mismatches {}/{} ({}, noise {}); ran twice: redis {}, postgres {}; ran live on both sides {}",
        d.route,
        d.phase,
        d.redis_seen,
        d.postgres_enqueued,
        d.only_redis_ran + d.only_redis_waiting,
        d.only_redis_ran,
        d.only_redis_waiting,
        d.only_postgres,
        only_postgres_detail(d),
        d.mismatched,
        d.compared,
        percent(d.mismatch_rate),
        percent(d.noise_rate),
        d.redis.ran_twice,
        d.postgres.ran_twice,
        d.ran_both_sides,
    );
    if !d.redis_reports && d.postgres_mirrors > 0 {
        line.push_str(
            "; the Redis side reported no outcomes, so 'only on postgres' may count jobs Redis ran",
        );
    }
    if d.ran_outcome_unknown > 0 {
        line.push_str(&format!(
            "; ran on Redis, outcome unknown: {} (in the route's ran set, no outcome reported; not compared, never pushed back)",
            d.ran_outcome_unknown
        ));
    }
    if d.skipped_repushes > 0 {
        line.push_str(&format!(
            "; {} re-pushes of jobs Postgres runs live were fetched on Redis and skipped (the live-key guard)",
            d.skipped_repushes
        ));
    }
    if d.held_repushes > 0 {
        line.push_str(&format!(
            "; {} re-pushes after the flip held back until the Redis side shows it let go of the original",
            d.held_repushes
        ));
    }
    if d.redis_truncated {
        line.push_str("; Redis lists longer than the diff reads: counts are lower bounds");
    }
    let elsewhere = crate::ops::structures::non_empty(&d.redis_elsewhere);
    if !elsewhere.is_empty() {
        line.push_str(&format!(
            "; also only on Redis, outside the list: {}",
            elsewhere.join(", ")
        ));
    }
    line
}

/// What the jobs only on Postgres are: repairable on evidence, or
/// unaccounted and why.
fn only_postgres_detail(d: &Diff) -> String {
    if d.only_postgres == 0 {
        return String::new();
    }
    let mut parts = Vec::new();
    if d.repairable > 0 {
        parts.push(format!(
            "{} repairable: Redis lost them ({})",
            d.repairable,
            d.repair_evidence.join("; ")
        ));
    }
    if d.unaccounted > 0 {
        parts.push(format!(
            "{} unaccounted, {}",
            d.unaccounted,
            d.unaccounted_reason
                .as_deref()
                .unwrap_or("no evidence either way")
        ));
    }
    format!(" ({})", parts.join("; "))
}

/// The diff as a table for people.
pub fn table(d: &Diff) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "route {} (queue {}, phase {}), {} → {}\n\n",
        d.route,
        d.queue,
        d.phase,
        d.since.format("%Y-%m-%d %H:%M:%S"),
        d.until.format("%H:%M:%S")
    ));
    out.push_str(&format!("{:<28} {:>12} {:>12}\n", "", "redis", "postgres"));
    for (name, r, p) in side_by_side(d) {
        out.push_str(&format!("{name:<28} {r:>12} {p:>12}\n"));
    }
    out.push_str(&format!(
        "\nin Redis now: {} waiting, {} in processing, {} parked for the mirror repair\n",
        d.redis_waiting, d.redis_processing, d.redis_parked
    ));
    out.push_str(&format!(
        "mirror completeness {:.4}%; outcome mismatches {} of {} compared ({}); noise {} of {} ({})\n",
        d.mirror_completeness * 100.0,
        d.mismatched,
        d.compared,
        percent(d.mismatch_rate),
        d.noise_disagreed,
        d.noise_samples,
        percent(d.noise_rate)
    ));
    if d.only_postgres > 0 {
        out.push_str(&format!(
            "only on postgres: {} repairable on evidence, {} unaccounted\n",
            d.repairable, d.unaccounted
        ));
        for line in &d.repair_evidence {
            out.push_str(&format!("  evidence of a loss: {line}\n"));
        }
        if let Some(why) = &d.unaccounted_reason {
            out.push_str(&format!("  unaccounted because: {why}\n"));
        }
    }
    samples(d, &mut out);
    out.push('\n');
    out.push_str(&d.verdict);
    out.push('\n');
    out
}

/// The table's rows: each number of the Redis side beside the Postgres one.
fn side_by_side(d: &Diff) -> [(&'static str, String, String); 8] {
    let secs = |v: Option<f64>| v.map_or("-".to_string(), |s| format!("{:.3}s", s));
    [
        (
            "jobs",
            d.redis_seen.to_string(),
            d.postgres_enqueued.to_string(),
        ),
        (
            "acks",
            d.redis.acks.to_string(),
            d.postgres.acks.to_string(),
        ),
        (
            "failed attempts",
            d.redis.failures.to_string(),
            d.postgres.failures.to_string(),
        ),
        (
            "dead",
            d.redis.dead.to_string(),
            d.postgres.dead.to_string(),
        ),
        (
            "ran more than once",
            d.redis.ran_twice.to_string(),
            d.postgres.ran_twice.to_string(),
        ),
        (
            "only on this side",
            (d.only_redis_ran + d.only_redis_waiting).to_string(),
            d.only_postgres.to_string(),
        ),
        (
            "push→outcome p50",
            secs(d.redis.lag_p50),
            secs(d.postgres.lag_p50),
        ),
        (
            "push→outcome p99",
            secs(d.redis.lag_p99),
            secs(d.postgres.lag_p99),
        ),
    ]
}

/// The sample keys of each kind of discrepancy, one line per kind.
fn samples(d: &Diff, out: &mut String) {
    let list = |name: &str, keys: &[String], out: &mut String| {
        if !keys.is_empty() {
            out.push_str(&format!("{name}: {}\n", keys.join(", ")));
        }
    };
    list("only on redis (sample)", &d.sample_only_redis, out);
    list("only on postgres (sample)", &d.sample_only_postgres, out);
    let due: Vec<String> = d
        .sample_unaccounted_due
        .iter()
        .map(|(key, at)| {
            let ago = (d.until - *at).num_seconds().max(0);
            format!(
                "{key} (due {}, {ago}s ago)",
                at.format("%Y-%m-%d %H:%M:%S UTC")
            )
        })
        .collect();
    list("unaccounted (sample, when due)", &due, out);
    list("held re-pushes (sample)", &d.sample_held_repushes, out);
    list(
        "ran on redis, outcome unknown (sample)",
        &d.sample_ran_outcome_unknown,
        out,
    );
    list("ran more than once (sample)", &d.sample_ran_twice, out);
    list(
        "ran live on both sides (sample)",
        &d.sample_ran_both_sides,
        out,
    );
    for m in &d.mismatches {
        out.push_str(&format!(
            "mismatch {}: redis {} / postgres {}{}\n",
            m.key,
            m.redis,
            m.postgres,
            if m.digest_differs {
                ", responses differ"
            } else {
                ""
            }
        ));
    }
}
