//! The one place a qbridge process is put together from its config.
//!
//! - [`runtime`]: `qbridge run` — pools, the completer, the LISTEN
//!   connection, maintenance, the HTTP listener and the Redis side.
//! - [`services`]: the Redis side of a process (route table, producer,
//!   proxy with its mirror writers, Redis consumers, repair loops), which
//!   `qbridge run` and `qbridge proxy` share.

pub mod runtime;
pub mod services;

pub use runtime::{Runtime, RuntimeReport};
