//! A route's cutover settings: `[routes.shadow]` (what the Postgres consumer
//! does with mirror copies), `[routes.diff]` (what the outcome comparison
//! ignores and samples) and `[routes.gates]` (the numbers `qbridge cutover
//! advance` demands). Every setting has a default a first migration can live
//! with; the runbook (`docs/src/runbook/gates.md`) says why each default is what it is.

use std::time::Duration;

use serde::Deserialize;

use super::{Dur, HandlerConfig};

/// What becomes of a mirror copy in `dual_write`. In `shadow` the Postgres
/// consumer always calls the handler in shadow mode. Decided where the copy
/// is written: by the config of the process that runs the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DualWriteMirrors {
    /// A proxied push is recorded in the key ledger only (`job_keys`: key
    /// and bytes, all the diff and repair read), with no `jobs` row: the
    /// cheapest mirror. Copies due later, RQ items and the other
    /// producer paths still get rows, drained as with `Skip`.
    #[default]
    Ledger,
    /// A `jobs` row the Postgres consumer completes without a call: proves
    /// claims at the production rate already, no side effects.
    Skip,
    /// Call the handler in shadow mode already.
    Shadow,
}

/// `[routes.shadow]` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct ShadowFile {
    #[serde(default)]
    dual_write: Option<DualWriteMirrors>,
    #[serde(default)]
    handler: Option<HandlerConfig>,
    #[serde(default)]
    noise_sample: Option<f64>,
}

/// `[routes.diff]` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct DiffFile {
    #[serde(default)]
    ignore_fields: Vec<String>,
    #[serde(default)]
    ignore_patterns: Vec<String>,
    #[serde(default)]
    settle: Option<Dur>,
    #[serde(default)]
    sample_keys: Option<usize>,
}

/// `[routes.gates]` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct GatesFile {
    #[serde(default)]
    window: Option<Dur>,
    #[serde(default)]
    min_jobs: Option<u64>,
    #[serde(default)]
    mirror_completeness: Option<f64>,
    #[serde(default)]
    ack_tolerance: Option<f64>,
    #[serde(default)]
    max_mismatch_rate: Option<f64>,
    #[serde(default)]
    max_postgres_lag: Option<Dur>,
    #[serde(default)]
    quiet_period: Option<Dur>,
    #[serde(default)]
    decommission_wait: Option<Dur>,
}

/// How a route's mirror copies are consumed.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowConfig {
    /// Mirror copies in `dual_write`: ledger entries, drained rows or shadow calls.
    pub dual_write: DualWriteMirrors,
    /// A separate handler for shadow calls (a shadow URL or command); `None`
    /// calls the route's handler with `Qbridge-Mode: shadow`
    /// (`QBRIDGE_MODE=shadow` for a command).
    pub handler: Option<HandlerConfig>,
    /// Share of shadow calls made twice, to measure the handler's own noise.
    pub noise_sample: f64,
}

/// How the diff compares the two sides.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffConfig {
    /// JSON pointers of response fields left out of the digest (`*` matches
    /// any key or index), e.g. `/created_at`, `/items/*/id`.
    pub ignore_fields: Vec<String>,
    /// Regular expressions blanked out of the response before it is digested
    /// (non-JSON bodies, or values inside strings).
    pub ignore_patterns: Vec<String>,
    /// Jobs pushed more recently than this are not yet expected on the other
    /// side (the Redis consumer may not have popped them).
    pub settle: Duration,
    /// Keys listed per category in the diff.
    pub sample_keys: usize,
}

/// The numbers each advance needs.
#[derive(Debug, Clone, PartialEq)]
pub struct GatesConfig {
    /// The span every gate is measured over.
    pub window: Duration,
    /// Fewest jobs in the window before a gate can pass at all.
    pub min_jobs: u64,
    /// dual_write → shadow: share of Redis-side jobs that have a Postgres copy.
    pub mirror_completeness: f64,
    /// shadow → postgres_only: |Redis acks − Postgres acks| / Redis acks.
    pub ack_tolerance: f64,
    /// shadow → postgres_only: outcome mismatches / compared jobs, above noise.
    pub max_mismatch_rate: f64,
    /// shadow → postgres_only: Postgres push-to-outcome p99.
    pub max_postgres_lag: Duration,
    /// postgres_only → decommissioned: no Redis-side job seen for this long.
    pub quiet_period: Duration,
    /// Into decommissioned: how long the archive waits for the route's Redis
    /// consumers to stop and finish what they hold before it refuses.
    pub decommission_wait: Duration,
}

/// Everything the cutover reads from a route's config.
#[derive(Debug, Clone, PartialEq)]
pub struct CutoverConfig {
    pub shadow: ShadowConfig,
    pub diff: DiffConfig,
    pub gates: GatesConfig,
}

impl Default for CutoverConfig {
    fn default() -> Self {
        validate(None, None, None).expect("the defaults are valid")
    }
}

fn share(value: Option<f64>, default: f64, name: &str) -> Result<f64, String> {
    let v = value.unwrap_or(default);
    if !(0.0..=1.0).contains(&v) || v.is_nan() {
        return Err(format!("{name} must be between 0 and 1, got {v}"));
    }
    Ok(v)
}

/// Validates the three tables; errors name the key.
pub(super) fn validate(
    shadow: Option<ShadowFile>,
    diff: Option<DiffFile>,
    gates: Option<GatesFile>,
) -> Result<CutoverConfig, String> {
    let (shadow, diff, gates) = (
        shadow.unwrap_or_default(),
        diff.unwrap_or_default(),
        gates.unwrap_or_default(),
    );
    for pointer in &diff.ignore_fields {
        if !pointer.starts_with('/') {
            return Err(format!(
                "diff.ignore_fields: {pointer:?} is not a JSON pointer (it must start with /)"
            ));
        }
    }
    for pattern in &diff.ignore_patterns {
        regex::Regex::new(pattern)
            .map_err(|e| format!("diff.ignore_patterns: {pattern:?}: {}", one_line(&e)))?;
    }
    if let Some(handler) = &shadow.handler {
        super::check_handler(handler).map_err(|e| format!("shadow.{e}"))?;
    }
    let sample_keys = diff.sample_keys.unwrap_or(10);
    if sample_keys > 1000 {
        return Err("diff.sample_keys must be at most 1000".into());
    }
    let window = gates
        .window
        .map(|d| d.0)
        .unwrap_or(Duration::from_secs(600));
    if window < Duration::from_secs(1) {
        return Err("gates.window must be at least 1s".into());
    }
    Ok(CutoverConfig {
        shadow: ShadowConfig {
            dual_write: shadow.dual_write.unwrap_or_default(),
            handler: shadow.handler,
            noise_sample: share(shadow.noise_sample, 0.01, "shadow.noise_sample")?,
        },
        diff: DiffConfig {
            ignore_fields: diff.ignore_fields,
            ignore_patterns: diff.ignore_patterns,
            settle: diff.settle.map(|d| d.0).unwrap_or(Duration::from_secs(30)),
            sample_keys,
        },
        gates: GatesConfig {
            window,
            min_jobs: gates.min_jobs.unwrap_or(100),
            mirror_completeness: share(
                gates.mirror_completeness,
                0.9999,
                "gates.mirror_completeness",
            )?,
            ack_tolerance: share(gates.ack_tolerance, 0.001, "gates.ack_tolerance")?,
            max_mismatch_rate: share(gates.max_mismatch_rate, 0.001, "gates.max_mismatch_rate")?,
            max_postgres_lag: gates
                .max_postgres_lag
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(5)),
            quiet_period: gates
                .quiet_period
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(600)),
            decommission_wait: gates
                .decommission_wait
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(60)),
        },
    })
}

/// A regex error's text is multi-line (it draws a caret); keep the last line.
fn one_line(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid pattern")
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = CutoverConfig::default();
        assert_eq!(c.shadow.dual_write, DualWriteMirrors::Ledger);
        assert_eq!(c.gates.window, Duration::from_secs(600));
        assert_eq!(c.gates.mirror_completeness, 0.9999);
        assert_eq!(c.diff.settle, Duration::from_secs(30));
    }

    #[test]
    fn bad_values_name_their_key() {
        let bad_share = GatesFile {
            mirror_completeness: Some(1.5),
            ..Default::default()
        };
        let err = validate(None, None, Some(bad_share)).unwrap_err();
        assert!(err.contains("gates.mirror_completeness"), "{err}");
        let bad_regex = DiffFile {
            ignore_patterns: vec!["(".into()],
            ..Default::default()
        };
        let err = validate(None, Some(bad_regex), None).unwrap_err();
        assert!(
            err.starts_with("diff.ignore_patterns") && !err.contains('\n'),
            "{err}"
        );
        let bad_pointer = DiffFile {
            ignore_fields: vec!["created_at".into()],
            ..Default::default()
        };
        assert!(validate(None, Some(bad_pointer), None)
            .unwrap_err()
            .contains("JSON pointer"));
    }
}
