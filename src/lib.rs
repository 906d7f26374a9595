//! qbridge: move Redis-list job queues onto a Postgres job queue without
//! downtime, without losing a job and without running one twice.
//!
//! The modules, bottom layer first (a module imports only from layers below
//! its own; `tests/layers.rs` checks it, and `ARCHITECTURE.md` draws it):
//!
//! - plumbing: [`error`] (the crate's error type), [`redact`] (passwords out
//!   of URLs), [`output`] (tables, JSON, progress bars for the CLI),
//!   [`shutdown`] (signals → a token), [`periodic`] (background services
//!   started and stopped together), [`metrics`] (metric names);
//!   [`secret`] (tokens and passwords compared in constant time),
//!   [`telemetry`] (logging and the Prometheus recorder).
//! - [`queue`] — the Postgres queue core (no Redis, no HTTP): enqueue,
//!   claim, fenced heartbeat/complete/retry/dead-letter, completer, reaper,
//!   dead-letter tools, lock keys, schedules, history, the LISTEN wake-up.
//! - [`db`] — connecting, migrating, checking the schema.
//! - [`model`] — phases and list-item formats (job keys, byte-exact
//!   payloads); no I/O.
//! - [`config`] — TOML + flags/env → a validated [`config::Config`].
//! - [`cutover`] — the stored phase flag and how every process follows it;
//!   [`shadow`] — outcome records and response digests.
//! - [`routes`] — a process's route table with live phases; [`handler`] —
//!   what running a job means (`http`, `command`, `noop`).
//! - [`ingest`] — the one place routed list items become Postgres jobs.
//! - [`redis`] — every Redis key name, connecting, the producer API with its
//!   outbox, the Redis consumer.
//! - [`mirror`] — the proxy's group-commit writer, its gap spool and repair.
//! - [`ops`] — operator tools: the diff, repair, gates, advance/rollback,
//!   decommission; [`proxy`] — the RESP proxy; [`worker`] — the Postgres
//!   consumer's pools.
//! - [`http`] — `/metrics`, health, enqueue, outcomes, the admin API.
//! - [`app`] — the one place a process is put together from its config.
//! - outside the runtime: [`demo`] (the migration drill), [`bench`]
//!   (`qbridge bench`), [`chaos`] (the fault suite), [`cli`] and
//!   [`commands`] (the command line).

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
