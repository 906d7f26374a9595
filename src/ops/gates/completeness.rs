//! The dual_write gate's completeness check, explained: how many
//! Redis-side jobs lack a Postgres copy, which, and the safe action.

use crate::ops::diff::Diff;

/// The completeness measured, and which jobs lack a copy and what to do:
/// waiting ones `--repair` copies; ones that already ran were pushed before
/// mirroring began (run `qbridge import` after the advance) or around the
/// proxy.
pub(super) fn value(d: &Diff) -> String {
    let pct = format!("{:.4}%", d.mirror_completeness * 100.0);
    if d.only_redis_ran + d.only_redis_waiting == 0 {
        return pct;
    }
    let sample = match d.sample_only_redis.is_empty() {
        true => String::new(),
        false => format!(
            "; e.g. {}",
            d.sample_only_redis
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    format!(
        "{pct} ({} of {} Redis-side jobs have no Postgres copy: {} waiting, which qbridge diff \
         --repair copies; {} ran, pushed before mirroring began (qbridge import copies what \
         still waits) or by a producer not behind the proxy{sample})",
        d.only_redis_ran + d.only_redis_waiting,
        d.redis_seen,
        d.only_redis_waiting,
        d.only_redis_ran,
    )
}
