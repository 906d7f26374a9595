//! The soak's verdict per column. The samples are split into the first two
//! thirds (the "settled" part, warm-up included) and the last third. A column
//! that must not grow is *bounded* when the last third's maximum is at most the
//! first two thirds' maximum plus 10% plus a small absolute floor (values near
//! zero, like a 0.1 s lag, would otherwise fail on noise). Throughput is
//! *steady* when the last third's mean is at least 90% of the first two
//! thirds' mean.

use super::Sample;

/// The rule as printed above the verdicts.
pub const RULE: &str = "bounded = max(last) <= max(first) * 1.10 + floor; \
                        steady = mean(last) >= mean(first) * 0.90";

const GROWTH_MARGIN: f64 = 0.10;
const THROUGHPUT_KEEP: f64 = 0.90;

/// A judged column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    Rss,
    Throughput,
    Lag,
    TableSize,
    DeadTuples,
}

impl Column {
    pub const ALL: [Column; 5] = [
        Column::Rss,
        Column::Throughput,
        Column::Lag,
        Column::TableSize,
        Column::DeadTuples,
    ];

    /// The name used in the table and the JSON keys.
    pub fn name(self) -> &'static str {
        match self {
            Column::Rss => "rss_mib",
            Column::Throughput => "done_jobs_s",
            Column::Lag => "lag_s",
            Column::TableSize => "table_mib",
            Column::DeadTuples => "dead_tuples",
        }
    }

    /// The absolute slack of a must-not-grow column, in its own unit.
    pub fn floor(self) -> f64 {
        match self {
            Column::Rss => 4.0,
            Column::Throughput => 0.0,
            Column::Lag => 1.0,
            Column::TableSize => 1.0,
            Column::DeadTuples => 5000.0,
        }
    }

    fn value(self, s: &Sample) -> f64 {
        match self {
            Column::Rss => s.rss_mib,
            Column::Throughput => s.completed_s,
            Column::Lag => s.lag_s,
            Column::TableSize => s.table_mib,
            Column::DeadTuples => s.dead_tuples,
        }
    }
}

/// What a column did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Fewer than three samples: nothing to compare.
    TooShort,
    /// A must-not-grow column: `first`/`last` are the maxima of the two parts.
    Bounded { first: f64, last: f64, ok: bool },
    /// Throughput: `first`/`last` are the means of the two parts.
    Steady { first: f64, last: f64, ok: bool },
}

impl Verdict {
    pub fn passed(self) -> bool {
        match self {
            Verdict::TooShort => false,
            Verdict::Bounded { ok, .. } | Verdict::Steady { ok, .. } => ok,
        }
    }

    /// last / first (1.0 when first is zero and last is too).
    pub fn growth(self) -> f64 {
        match self {
            Verdict::TooShort => 0.0,
            Verdict::Bounded { first, last, .. } | Verdict::Steady { first, last, .. } => {
                if first > 0.0 {
                    last / first
                } else if last > 0.0 {
                    f64::INFINITY
                } else {
                    1.0
                }
            }
        }
    }

    /// One line for people.
    pub fn describe(self) -> String {
        match self {
            Verdict::TooShort => "too short to judge (fewer than 3 samples)".into(),
            Verdict::Bounded { first, last, ok } => format!(
                "{} (max first two thirds {first:.2}, max last third {last:.2})",
                if ok { "bounded" } else { "GROWING" }
            ),
            Verdict::Steady { first, last, ok } => format!(
                "{} (mean first two thirds {first:.0}, mean last third {last:.0})",
                if ok { "steady" } else { "DROPPING" }
            ),
        }
    }
}

/// Judges one column over the samples.
pub fn judge(column: Column, samples: &[Sample]) -> Verdict {
    if samples.len() < 3 {
        return Verdict::TooShort;
    }
    let split = samples.len() - samples.len() / 3;
    let values: Vec<f64> = samples.iter().map(|s| column.value(s)).collect();
    let (head, tail) = values.split_at(split);
    if column == Column::Throughput {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (first, last) = (mean(head), mean(tail));
        return Verdict::Steady {
            first,
            last,
            ok: last >= first * THROUGHPUT_KEEP,
        };
    }
    let max = |v: &[f64]| v.iter().copied().fold(f64::MIN, f64::max);
    let (first, last) = (max(head), max(tail));
    Verdict::Bounded {
        first,
        last,
        ok: last <= first * (1.0 + GROWTH_MARGIN) + column.floor(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rss(values: &[f64]) -> Vec<Sample> {
        values
            .iter()
            .map(|&v| Sample {
                rss_mib: v,
                completed_s: v,
                ..Sample::default()
            })
            .collect()
    }

    #[test]
    fn a_plateau_is_bounded_and_a_leak_is_not() {
        let flat = rss(&[40.0, 60.0, 61.0, 60.0, 62.0, 61.0]);
        assert!(judge(Column::Rss, &flat).passed());
        let leak = rss(&[40.0, 50.0, 60.0, 70.0, 80.0, 90.0]);
        let v = judge(Column::Rss, &leak);
        assert!(!v.passed(), "{}", v.describe());
        assert_eq!(
            v,
            Verdict::Bounded {
                first: 70.0,
                last: 90.0,
                ok: false
            }
        );
    }

    #[test]
    fn the_floor_absorbs_noise_near_zero() {
        let lag = [0.0, 0.1, 0.0, 0.2, 0.0, 0.9]
            .iter()
            .map(|&v| Sample {
                lag_s: v,
                ..Sample::default()
            })
            .collect::<Vec<_>>();
        assert!(judge(Column::Lag, &lag).passed());
    }

    #[test]
    fn throughput_must_hold_its_mean() {
        assert!(judge(Column::Throughput, &rss(&[100.0, 100.0, 100.0, 95.0])).passed());
        assert!(!judge(Column::Throughput, &rss(&[100.0, 100.0, 100.0, 50.0])).passed());
    }

    #[test]
    fn two_samples_are_too_few() {
        assert_eq!(judge(Column::Rss, &rss(&[1.0, 2.0])), Verdict::TooShort);
    }
}
