//! One attempt of a claimed job: what it gets (a live run, a shadow call of a
//! mirror copy, or a drain without a call), running its handler until it
//! finishes or its lease is lost, recording the outcome for the diff, and
//! handing the outcome to the completer.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::DualWriteMirrors;
use crate::handler::{Handler, HandlerResult, HandlerRun};
use crate::metrics as m;
use crate::model::Phase;
use crate::queue::backoff::Backoff;
use crate::queue::completer::{Finished, Outcome};
use crate::queue::{fence, ClaimedJob, JobCopy};
use crate::routes::{Route, Routes};
use crate::shadow::{Mode, Outcome as RecordedOutcome, OutcomeKind, OutcomeRecorder, Side};
use crate::worker::heartbeat::InFlight;

/// What a pool serving route queues needs beyond a plain pool.
#[derive(Clone)]
pub struct RouteRuns {
    /// Where every attempt's outcome goes.
    pub recorder: OutcomeRecorder,
    /// The routes and their phases (kept current by the cutover watch).
    pub routes: Routes,
    /// A route's separate shadow handler (`[routes.shadow] handler`), by route name.
    pub shadow_handlers: HashMap<String, Arc<Handler>>,
}

/// What one claimed job gets.
enum Plan {
    /// A live run; recorded (with the route's digest rules) when the job is
    /// keyed and on a route.
    Live { recorded: Option<Arc<Route>> },
    /// A shadow call of a mirror copy, recorded with mode `shadow`.
    Shadow {
        route: Arc<Route>,
        handler: Arc<Handler>,
    },
    /// A mirror copy completed without a call.
    Drain,
}

/// What one attempt's task carries.
pub(super) struct AttemptCtx {
    pub(super) db: PgPool,
    pub(super) handler: Arc<Handler>,
    pub(super) completer: mpsc::Sender<Finished>,
    pub(super) inflight: InFlight,
    pub(super) backoff: Backoff,
    pub(super) to_start: metrics::Histogram,
    pub(super) routes: Option<RouteRuns>,
    /// The job's queue, shared with the pool when it serves one queue.
    pub(super) queue: Arc<str>,
}

impl AttemptCtx {
    /// Live, shadow or drain. A mirror copy's live run happens on the Redis
    /// side: running its handler live here would run the job twice, so it is
    /// only ever called in shadow mode (in `shadow`, or in `dual_write` when
    /// the route asks for it; also the leftovers of those phases in
    /// `postgres_only`) or completed without a call, which still proves
    /// claims and throughput (ARCHITECTURE.md, "Vocabulary").
    fn plan(&self, job: &ClaimedJob) -> Plan {
        let Some(runs) = &self.routes else {
            return match job.copy {
                JobCopy::Live => Plan::Live { recorded: None },
                JobCopy::Mirror => Plan::Drain,
            };
        };
        let route = runs.routes.by_queue(&job.queue);
        if job.copy == JobCopy::Live {
            return Plan::Live {
                recorded: route.filter(|_| job.key.is_some()).cloned(),
            };
        }
        let Some(route) = route.filter(|_| job.key.is_some()) else {
            return Plan::Drain;
        };
        let shadowed = match runs.routes.phase(route) {
            Phase::DualWrite => route.config.cutover.shadow.dual_write == DualWriteMirrors::Shadow,
            Phase::Shadow | Phase::PostgresOnly => true,
            Phase::RedisOnly | Phase::Decommissioned => false,
        };
        if !shadowed {
            return Plan::Drain;
        }
        Plan::Shadow {
            route: Arc::clone(route),
            handler: runs
                .shadow_handlers
                .get(&route.name)
                .cloned()
                .unwrap_or_else(|| self.handler.clone()),
        }
    }

    /// Records one attempt for the diff.
    fn record(&self, job: &ClaimedJob, mode: Mode, outcome: &Outcome, run: &HandlerRun) {
        let (Some(runs), Some(key)) = (&self.routes, &job.key) else {
            return;
        };
        runs.recorder.record(RecordedOutcome {
            queue: job.queue.clone(),
            key: key.clone(),
            side: Side::Postgres,
            mode,
            outcome: match outcome {
                Outcome::Complete => OutcomeKind::Ok,
                Outcome::Retry { .. } => OutcomeKind::Failed,
                Outcome::Dead { .. } => OutcomeKind::Dead,
            },
            error_class: run.error_class,
            digest: run.digest.clone(),
            attempt: Some(job.attempts),
        });
    }

    /// What the handler's result means for the job.
    fn outcome(&self, job: &ClaimedJob, result: HandlerResult) -> Outcome {
        match result {
            HandlerResult::Done => Outcome::Complete,
            HandlerResult::Permanent(error) => Outcome::Dead { error },
            HandlerResult::Retry(error) if job.attempts >= job.max_attempts => Outcome::Dead {
                error: format!("attempts exhausted ({}): {error}", job.attempts),
            },
            HandlerResult::Retry(error) => Outcome::Retry {
                delay: self.backoff.delay(job.attempts),
                error,
            },
        }
    }

    /// One shadow call (and, sampled, a second one for the noise baseline).
    async fn shadow(&self, job: &ClaimedJob, route: &Route, handler: &Handler) -> HandlerRun {
        metrics::counter!(m::SHADOW_CALLS, "queue" => self.queue.to_string()).increment(1);
        let run = handler
            .run_recorded(job, Mode::Shadow, &route.digester)
            .await;
        let sample = route.config.cutover.shadow.noise_sample;
        if sample > 0.0 && rand::random::<f64>() < sample {
            let again = handler
                .run_recorded(job, Mode::Noise, &route.digester)
                .await;
            let outcome = self.outcome(job, again.result.clone());
            self.record(job, Mode::Noise, &outcome, &again);
        }
        run
    }

    /// Runs one claimed job to its outcome, handed to the completer; a
    /// cancelled attempt hands its job back (fenced).
    pub(super) async fn run(self, job: ClaimedJob, cancel: CancellationToken) {
        let job_ref = job.job_ref();
        let waited = (chrono::Utc::now() - job.run_at)
            .num_microseconds()
            .unwrap_or(0)
            .max(0);
        self.to_start.record(waited as f64 / 1e6);
        let plan = self.plan(&job);
        let call = async {
            match &plan {
                Plan::Drain => {
                    metrics::counter!(m::MIRROR_DRAINED, "queue" => self.queue.to_string())
                        .increment(1);
                    HandlerRun {
                        result: HandlerResult::Done,
                        digest: None,
                        error_class: None,
                    }
                }
                Plan::Live {
                    recorded: Some(route),
                } => {
                    self.handler
                        .run_recorded(&job, Mode::Live, &route.digester)
                        .await
                }
                Plan::Live { recorded: None } => HandlerRun {
                    result: self.handler.run(&job).await,
                    digest: None,
                    error_class: None,
                },
                Plan::Shadow { route, handler } => self.shadow(&job, route, handler).await,
            }
        };
        // biased: a handler that finished just as the deadline hit keeps its result.
        let run = tokio::select! {
            biased;
            r = call => Some(r),
            _ = cancel.cancelled() => None,
        };
        let Some(HandlerRun {
            result,
            digest,
            error_class,
        }) = run
        else {
            self.inflight.remove(job_ref);
            // Cancelled: either the lease was lost (then nothing may be written)
            // or shutdown ran out of time (then hand the job back now rather
            // than after the lease expires). release() is fenced, so it is a
            // no-op in the first case.
            if let Err(err) = fence::release(&self.db, &[job_ref], false).await {
                tracing::warn!(job.id = job.id, error = %err, "could not hand job back; it returns when its lease expires");
            }
            return;
        };
        let run = HandlerRun {
            result,
            digest,
            error_class,
        };
        let outcome = self.outcome(&job, run.result.clone());
        match plan {
            Plan::Live { recorded: Some(_) } => self.record(&job, Mode::Live, &outcome, &run),
            Plan::Shadow { .. } => self.record(&job, Mode::Shadow, &outcome, &run),
            Plan::Live { recorded: None } | Plan::Drain => {}
        }
        // Ids and queue only: error texts can echo payload data, so they go
        // to the database (last_error), never to the log.
        match &outcome {
            Outcome::Complete => {}
            Outcome::Retry { delay, .. } => tracing::info!(job.id = job.id, queue = %job.queue,
                attempt = job.attempts, retry_in_ms = delay.as_millis() as u64, "job failed; will retry"),
            Outcome::Dead { .. } => tracing::warn!(job.id = job.id, queue = %job.queue,
                attempt = job.attempts, "job failed permanently; moved to the dead-letter table"),
        }
        let finished = Finished {
            job: job_ref,
            queue: self.queue,
            outcome,
        };
        // The completer outlives every pool, so this only fails if it crashed;
        // the lease then expires and the job runs again.
        if self.completer.send(finished).await.is_err() {
            tracing::error!(
                job.id = job.id,
                "completer is gone; job will be re-run after its lease expires"
            );
        }
        // Heartbeats go on until the outcome is queued for the completer.
        self.inflight.remove(job_ref);
    }
}
