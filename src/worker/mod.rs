//! The worker runtime behind `qbridge run`: pools per queue that claim, run
//! handlers and report outcomes to the batched completer, plus the heartbeat,
//! the gauge collector and graceful shutdown.

pub mod gauges;
pub mod handler;
pub mod heartbeat;
pub mod pool;
pub mod runtime;

pub use handler::{Handler, HandlerResult, HandlerRun};
pub use runtime::{Runtime, RuntimeReport};
