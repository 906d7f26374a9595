//! qbridge: move Redis-list job queues onto a Postgres job queue without
//! downtime, without losing a job and without running one twice.
//!
//! Module map:
//! - [`queue`] — the Postgres queue core (no Redis): enqueue, claim, fenced
//!   heartbeat/complete/retry/dead-letter, completer, reaper, DLQ, schedules.
//! - [`worker`] — pools, handlers (`http`, `command`, `noop`), graceful shutdown.
//! - [`redis`] — list-item formats (job keys, byte-exact payloads).
//! - [`proxy`] — the RESP codec of the proxy.
//! - [`shadow`] — outcome recording for the shadow comparison.
//! - [`http`] — `/metrics`, `/livez`, `/readyz`, enqueue, outcomes, the
//!   token-protected admin API.
//! - [`secret`] — the admin token and the proxy password, compared in
//!   constant time.
//! - [`config`] — TOML + flags/env → validated [`config::Config`].
//! - [`db`] — connecting, migrating, checking the schema.
//! - [`cli`] / [`commands`] — the `qbridge` command line.
//! - [`bench`] — `qbridge bench`.
//! - [`chaos`] — the fault suite (`qbridge chaos`): faults under load, judged
//!   by a no-loss oracle.
//! - [`metrics`], [`telemetry`], [`shutdown`], [`ticker`], [`redact`], [`error`] — plumbing.

pub mod app;
pub mod bench;
pub mod chaos;
pub mod cli;
pub mod commands;
pub mod config;
pub mod cutover;
pub mod db;
pub mod demo;
pub mod error;
pub mod handler;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod mirror;
pub mod model;
pub mod ops;
pub mod output;
pub mod periodic;
pub mod proxy;
pub mod queue;
pub mod redact;
pub mod redis;
pub mod routes;
pub mod secret;
pub mod shadow;
pub mod shutdown;
pub mod telemetry;
pub mod worker;

pub use error::{Error, Result};
pub use queue::MIGRATOR;
