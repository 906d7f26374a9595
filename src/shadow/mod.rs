//! The shadow comparison: what each side's handlers did with a job.
//!
//! So far this is outcome recording ([`outcomes`]): both consumers (and
//! outside workers through `qbridge.report_outcome` or HTTP) write one row
//! per attempt into `qbridge.outcomes`, keyed by job key, for the diff to
//! join. Recording never blocks or fails the job it describes.

pub mod outcomes;

pub use outcomes::{
    digest_hex, record, Mode, Outcome, OutcomeKind, OutcomeRecorder, OutcomeWriter,
    RecorderOptions, Side, WriterReport,
};
