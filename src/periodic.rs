//! Background services of a process: periodic passes (the reaper, schedules,
//! gauges, history retention, key pruning, the repair loops) and long-lived
//! watchers (the LISTEN connection, the phase watch), started into one
//! [`Services`] set and stopped together under a deadline.
//!
//! Each pass logs what it did itself; this module only paces, starts and
//! stops. A pass that finds more work waiting (a gap repair that moved a
//! full batch) answers [`Pace::Again`] to run again at once instead of
//! sleeping a whole period.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a pass tells the loop about the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Sleep one period.
    Wait,
    /// More work is waiting: run again at once (unless stopping).
    Again,
}

impl From<()> for Pace {
    fn from((): ()) -> Pace {
        Pace::Wait
    }
}

/// When the first pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At once.
    Now,
    /// After one period (for passes already run at start-up).
    AfterOnePeriod,
}

/// Runs `pass` every `period` until `token` is cancelled (see [`Start`] and
/// [`Pace`]).
pub async fn every<F, Fut>(period: Duration, token: CancellationToken, start: Start, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Into<Pace>,
{
    if start == Start::AfterOnePeriod && !sleep_or_stop(period, &token).await {
        return;
    }
    loop {
        let pace = pass().await.into();
        if token.is_cancelled() {
            return;
        }
        if pace == Pace::Wait && !sleep_or_stop(period, &token).await {
            return;
        }
    }
}

/// Sleeps `period`; false when `token` was cancelled first.
async fn sleep_or_stop(period: Duration, token: &CancellationToken) -> bool {
    tokio::select! {
        _ = token.cancelled() => false,
        _ = tokio::time::sleep(period) => true,
    }
}

/// A set of background tasks that stop together: one cancellation token
/// they all watch, and a deadline after which the stragglers (a pass stuck
/// on a half-open connection) are aborted rather than holding the process.
#[derive(Debug, Default)]
pub struct Services {
    token: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl Services {
    /// An empty set.
    pub fn new() -> Services {
        Services::default()
    }

    /// The token every service of the set stops on; cancelled by [`stop`](Services::stop).
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Starts a periodic pass. `state` is cloned for each pass, so the pass
    /// owns what it uses (a pool, a Redis connection, the route table).
    pub fn every<S, F, Fut>(
        &mut self,
        name: &'static str,
        period: Duration,
        start: Start,
        state: S,
        pass: F,
    ) where
        S: Clone + Send + Sync + 'static,
        F: Fn(S) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: Into<Pace>,
    {
        let token = self.token.clone();
        self.spawn(name, async move {
            every(period, token, start, || pass(state.clone())).await;
        });
    }

    /// Starts a service that runs until the set's token is cancelled (give
    /// it [`token`](Services::token)).
    pub fn spawn<Fut>(&mut self, name: &'static str, service: Fut)
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tasks.push((name, tokio::spawn(service)));
    }

    /// Adds a task started elsewhere that stops on this set's token.
    pub fn adopt(&mut self, name: &'static str, task: JoinHandle<()>) {
        self.tasks.push((name, task));
    }

    /// How many services run.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True when none runs.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Cancels the token and waits for every service until `deadline` has
    /// passed; the ones still running then are aborted and named in a log.
    pub async fn stop(self, deadline: Duration) {
        self.token.cancel();
        let until = tokio::time::Instant::now() + deadline;
        for (name, mut task) in self.tasks {
            if tokio::time::timeout_at(until, &mut task).await.is_err() {
                tracing::warn!(
                    service = name,
                    "background service did not stop in time; aborted"
                );
                task.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn passes_run_every_period_until_stopped() {
        let mut services = Services::new();
        let count = Arc::new(AtomicU32::new(0));
        services.every(
            "count",
            Duration::from_secs(10),
            Start::Now,
            Arc::clone(&count),
            |count: Arc<AtomicU32>| async move {
                count.fetch_add(1, Ordering::SeqCst);
            },
        );
        tokio::time::sleep(Duration::from_secs(35)).await;
        services.stop(Duration::from_secs(1)).await;
        // At 0, 10, 20 and 30 s.
        assert_eq!(count.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_with_more_work_runs_again_at_once() {
        let count = Arc::new(AtomicU32::new(0));
        let token = CancellationToken::new();
        let counted = Arc::clone(&count);
        let run = tokio::spawn(every(
            Duration::from_secs(60),
            token.clone(),
            Start::AfterOnePeriod,
            move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 2 {
                        Pace::Again
                    } else {
                        Pace::Wait
                    }
                }
            },
        ));
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert_eq!(count.load(Ordering::SeqCst), 0, "waits one period first");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            count.load(Ordering::SeqCst),
            3,
            "two Again passes, then a Wait"
        );
        token.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_service_stuck_past_the_deadline_is_aborted() {
        let mut services = Services::new();
        services.spawn("stuck", std::future::pending());
        let polite = services.token().clone();
        services.spawn("polite", async move { polite.cancelled().await });
        assert_eq!(services.len(), 2);
        let started = tokio::time::Instant::now();
        services.stop(Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }
}
