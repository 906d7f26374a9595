//! `qbridge demo --framework … --realistic`: the walk with the gates a real
//! route gets by default and a producer paced like a real app's, so the
//! time each gate holds the walk is the time a team's migration takes.
//!
//! The quick drill sizes the gates to its step (a 5 s window, 20 jobs, a
//! 2 s settle) and pushes bursts; that proves the walk, not its duration.
//! Here the route keeps every `[routes.gates]` and `[routes.diff]` default
//! (a 10-minute window, 100 jobs, a 30 s settle, 0.1% ack tolerance) and the
//! producer pushes about 4 jobs a second, with a countdown job every few
//! seconds due 15 to 60 s later, so jobs cross every phase change.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::framework::FleetEnv;
use super::{push, Framework, Produced};

/// The route's shadow, diff and gate settings: the drill's quick ones,
/// or (realistic) only what a team sets anyway — the handler's volatile
/// response field.
pub(super) fn route_tuning(realistic: bool, step: Duration) -> String {
    if realistic {
        return "diff = { ignore_fields = [\"/processed_at\"] }\n".into();
    }
    let step = step.as_secs_f64();
    format!(
        "shadow = {{ noise_sample = 0.05 }}\n\
         diff = {{ settle = \"2s\", ignore_fields = [\"/processed_at\"] }}\n\
         gates = {{ window = \"{step}s\", min_jobs = 20, ack_tolerance = 0.2, quiet_period = \"2s\", max_postgres_lag = \"5s\" }}\n"
    )
}

/// How long an advance waits for its gate before the drill forces it (and
/// counts the force): long enough that a realistic walk never needs one.
pub(super) fn patience(realistic: bool, step: Duration) -> Duration {
    match realistic {
        true => Duration::from_secs(45 * 60),
        false => step * 6,
    }
}

/// The producer of a realistic walk: 4 jobs each second, and a countdown
/// job due 15-60 s later every 5 s, until `stop`.
pub(super) fn paced(
    (fw, env): (Framework, FleetEnv),
    produced: Produced,
    counter: Arc<AtomicU64>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick: u64 = 0;
        while !stop.is_cancelled() {
            let started = tokio::time::Instant::now();
            if let Err(e) = push(fw, &env, &produced, &counter, 4, None).await {
                tracing::warn!(error = %e, "demo: the producer failed; trying again");
            }
            if tick.is_multiple_of(5) {
                let due = Duration::from_secs(15 + (tick * 7) % 46);
                if let Err(e) = push(fw, &env, &produced, &counter, 1, Some(due)).await {
                    tracing::warn!(error = %e, "demo: the producer failed; trying again");
                }
            }
            tick += 1;
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep_until(started + Duration::from_secs(1)) => {}
            }
        }
    })
}
