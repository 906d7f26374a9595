//! The cutover end to end: planted discrepancies in the diff and the gates,
//! rollback with jobs in flight, decommissioning, and the phase watch.

mod celery_priority;
mod celery_push_forms;
mod decommission;
mod decommission_gap;
mod decommission_idle;
mod due_settle;
mod followers;
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

/// `qbridge import` of `route` (in `phase`) now, as the command runs it; the
/// line of the structure keyed `key`, with the whole report for messages.
pub(crate) async fn import_line(
    pool: &sqlx::PgPool,
    conn: &mut ::redis::aio::ConnectionManager,
    route: &qbridge::routes::Route,
    phase: qbridge::model::Phase,
    key: &str,
) -> (qbridge::ops::import::StructureImport, String) {
    let report = qbridge::ops::import::import(pool, conn, route, phase, false, 1 << 20, |_, _| {})
        .await
        .unwrap();
    let text = format!("{report:?}");
    let line = report
        .structures
        .into_iter()
        .find(|s| s.key == key)
        .unwrap_or_else(|| panic!("no line for {key}: {text}"));
    (line, text)
}
