//! The Postgres consumer: pools per queue that claim, run handlers and
//! report outcomes to the batched completer, plus the heartbeat and the
//! gauge collector. The process that runs them is assembled in
//! [`crate::app`].

mod attempt;
mod follow_up;
pub mod gauges;
pub mod heartbeat;
pub mod pool;
pub mod prefetch;
