//! The Redis side of a migration: list-item formats (job key and byte-exact
//! payload), the route table, storing routed items as live or mirror copies,
//! the group-commit mirror writer of the proxy, the producer API with its
//! outbox, the Redis consumer, and TLS trust for `rediss://`.

pub mod consumer;
pub mod formats;
pub mod mirror;
pub mod outbox;
pub mod producer;
pub mod route_stats;
pub mod routes;
pub mod services;
pub mod store;
pub mod tls;
