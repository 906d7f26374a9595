//! The one place a qbridge process is put together from its config. Lower
//! layers never import `app`; `commands` (the CLI), the drill and the
//! benchmarks start processes through it.
//!
//! - [`runtime`]: `qbridge run` — pools, the completer, the Redis side, the
//!   HTTP listener and the background services, and their ordered shutdown.
//! - [`proxy`]: `qbridge proxy` — the RESP proxy with its mirror writers,
//!   the route maintenance and the HTTP listener.
//! - [`redis_side`]: the Redis side both share (route table and phase
//!   watch, producer, proxy and mirror writers, Redis consumers, the
//!   route maintenance services).
//! - [`outcome_spool`]: the Redis consumers' outcome spool and its replay.
//! - [`pools`]: the Postgres consumer's pools, built from the config.
//! - [`maintenance`]: the queue's background services (history, LISTEN,
//!   reaper, schedules, tenant backfill, gauges).

pub mod maintenance;
pub mod outcome_spool;
pub mod pools;
pub mod proxy;
pub mod redis_side;
pub mod runtime;

pub use redis_side::RedisSide;
pub use runtime::{Runtime, RuntimeReport};
