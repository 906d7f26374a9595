//! A fault the fault suite caused on purpose, as the oracle reads it: the
//! only reason it accepts a Redis job run twice. Apart so the rig, which
//! records them, and the oracle, which judges by them, share it without
//! importing each other.

/// A fault caused on purpose (a kill, a restart, a scenario's whole
/// fault): what it was and when it began and ended.
#[derive(Debug, Clone)]
pub struct Fault {
    pub what: String,
    pub from: chrono::DateTime<chrono::Utc>,
    pub until: chrono::DateTime<chrono::Utc>,
}
