//! The Redis side of a migration: every Redis key qbridge reads or writes
//! ([`keys`]), connecting to Redis ([`connect`]), the producer API with its
//! outbox, the Redis consumer, the live-key guard ([`live_guard`]: what
//! Postgres owns, for the Redis side to skip), the gap list's entries ([`gap_entry`]), RQ's job hashes ([`rq_jobs`]), which Redis a route talks to ([`epoch`]:
//! the evidence that Redis lost data), and per-route Redis numbers for `qbridge
//! stats`.

pub mod connect;
pub mod consumer;
pub mod epoch;
pub mod gap_entry;
pub mod keys;
pub mod live_guard;
pub mod outbox;
pub mod producer;
pub mod ran_refill;
pub mod route_stats;
pub mod rq_jobs;
pub mod sentinel;
