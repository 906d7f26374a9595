//! TLS end to end on throwaway servers with certificates made per test
//! (`certs`): Postgres with `sslmode` in the URL (`postgres`), and Redis over
//! `rediss://` with a private CA for the producer API, the Redis consumer and
//! the proxy's upstream (`redis`).

mod certs;
mod postgres;
mod redis;
