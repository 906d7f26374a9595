//! Retry delays: capped exponential backoff with full jitter on the upper half,
//! so a burst of failures does not come back as a synchronized burst.

use std::time::Duration;

use rand::Rng;

/// Backoff settings of one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failed attempt (before jitter).
    pub base: Duration,
    /// Upper bound of any delay.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(3600),
        }
    }
}

impl Backoff {
    /// The un-jittered delay after `attempt` (1-based) failed: base·2^(attempt-1),
    /// at most `cap`.
    pub fn ceiling(&self, attempt: i32) -> Duration {
        let exp = attempt.saturating_sub(1).clamp(0, 62) as u32;
        let factor = 1u64.checked_shl(exp).unwrap_or(u64::MAX);
        let base_ms = self.base.as_millis().min(u64::MAX as u128) as u64;
        let ms = base_ms.saturating_mul(factor);
        Duration::from_millis(ms).min(self.cap)
    }

    /// The delay to use: uniformly random in [ceiling/2, ceiling].
    pub fn delay(&self, attempt: i32) -> Duration {
        let ceiling = self.ceiling(attempt).as_millis() as u64;
        let half = ceiling / 2;
        let jitter = if ceiling > half {
            rand::rng().random_range(0..=ceiling - half)
        } else {
            0
        };
        Duration::from_millis(half + jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(base_ms: u64, cap_ms: u64) -> Backoff {
        Backoff {
            base: Duration::from_millis(base_ms),
            cap: Duration::from_millis(cap_ms),
        }
    }

    #[test]
    fn doubles_until_cap() {
        let b = b(100, 1000);
        let got: Vec<u128> = (1..=6).map(|a| b.ceiling(a).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn huge_attempts_do_not_overflow() {
        assert_eq!(b(1000, 5000).ceiling(i32::MAX).as_millis(), 5000);
        assert_eq!(b(1000, 5000).ceiling(0).as_millis(), 1000);
    }

    #[test]
    fn jitter_stays_in_upper_half() {
        let b = b(1000, 60_000);
        for attempt in 1..10 {
            let ceiling = b.ceiling(attempt);
            for _ in 0..50 {
                let d = b.delay(attempt);
                assert!(d <= ceiling && d >= ceiling / 2, "{d:?} vs {ceiling:?}");
            }
        }
    }
}
