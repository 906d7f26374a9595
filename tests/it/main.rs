//! qbridge's integration tests: one binary, one module per topic, real
//! Postgres (`DATABASE_URL`, see `.cargo/config.toml`). Every test gets a fresh
//! database from `#[sqlx::test]`.

mod admin_http;
mod bad_input;
mod claim;
mod claim_plans;
mod cli;
mod console;
mod cutover;
mod cutover_cli;
mod cutover_proxy;
mod cutover_store;
mod demo;
mod dlq;
mod enqueue;
mod exactly_once;
mod examples;
mod examples_fleets;
mod fence;
mod fleet_adapters;
mod http_enqueue;
mod keys;
mod lock_key;
mod maintenance;
mod mirror;
mod outage;
mod outcomes;
mod oversized;
mod pooler;
mod prefetch;
mod producer;
mod proxy;
mod redaction;
mod redis_consumer;
mod retry;
mod roles;
mod route_pool;
mod schedule;
mod schema_check;
mod sentinel;
mod servers;
mod shutdown;
mod support;
mod tls;
mod wakeup;
mod worker;
