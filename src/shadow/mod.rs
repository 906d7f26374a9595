//! The shadow comparison: what each side's handlers did with a job.
//!
//! - [`outcomes`]: both consumers (and outside workers through
//!   `qbridge.report_outcome` or HTTP) write one row per attempt into
//!   `qbridge.outcomes`, keyed by job key. Recording never blocks or fails
//!   the job it describes.
//! - [`digest`]: response digests with a route's ignore rules.
//! - [`redis_view`]: what a route still holds in Redis.
//! - [`diff`]: the two sides compared over a window; [`repair`] fills what
//!   is missing on one side.

pub mod diff;
pub mod diff_metrics;
pub mod digest;
pub mod outcomes;
pub mod redis_view;
pub mod repair;

pub use digest::Digester;
pub use outcomes::{
    digest_hex, record, Mode, Outcome, OutcomeKind, OutcomeRecorder, OutcomeWriter,
    RecorderOptions, Side, WriterReport,
};
