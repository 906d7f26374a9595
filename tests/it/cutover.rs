//! The cutover end to end: planted discrepancies in the diff and the gates,
//! rollback with jobs in flight, decommissioning, and the phase watch.

mod celery_priority;
mod celery_push_forms;
mod decommission;
mod decommission_gap;
mod decommission_idle;
mod due_settle;
mod framework_structures;
mod gate_noise;
mod gradual;
mod held_and_delayed;
mod planted;
pub(crate) mod rig;
mod rollback;
mod rq_jobs;
mod rq_scheduled;
mod rq_unique;
mod shadow_test;
mod sidekiq_scheduled;
mod watch;
