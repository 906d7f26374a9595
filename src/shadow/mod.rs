//! The shadow comparison's raw material: what each side's handlers did with
//! a job.
//!
//! - [`outcomes`]: both consumers (and outside workers through
//!   `qbridge.report_outcome` or HTTP) write one row per attempt into
//!   `qbridge.outcomes`, keyed by job key. Recording never blocks or fails
//!   the job it describes.
//! - [`spool`]: qbridge's Redis consumer syncs each outcome to local disk
//!   before it acks the item, until Postgres has it; the records of a
//!   process that died are replayed.
//! - [`digest`]: response digests with a route's ignore rules.
//!
//! The diff that compares the two sides, and its repair, are operator tools
//! in [`crate::ops`].

pub mod digest;
pub mod outcomes;
pub mod spool;

pub use digest::Digester;
pub use outcomes::{
    digest_hex, record, Mode, Outcome, OutcomeKind, OutcomeRecorder, OutcomeWriter,
    RecorderOptions, Side, WriterReport,
};
