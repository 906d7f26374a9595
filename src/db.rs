//! Connecting to Postgres and checking the schema, with errors that say what to
//! do and never show a password.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::error::{Error, Result};
use crate::queue::MIGRATOR;
use crate::redact::redact_url;

/// What sits between qbridge and Postgres.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Pooler {
    /// Postgres itself, or a pooler in session mode.
    #[default]
    None,
    /// A pooler in transaction mode: no named prepared statements, no
    /// session state, LISTEN only over `[database] direct_url`.
    PgbouncerTransaction,
}

impl Pooler {
    /// The setting's value, as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::None => "none",
            Pooler::PgbouncerTransaction => "pgbouncer-transaction",
        }
    }
}

/// Opens a pool straight to Postgres (no pooler in between).
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool> {
    connect_via(url, Pooler::None, max_connections).await
}

/// Opens a pool of at most `max_connections`, failing fast (5 s) with a
/// one-line error when the server cannot be reached. Behind a
/// transaction-mode `pooler` no statement is named (the statement cache is
/// off: with the patched sqlx-postgres in `vendor/`, statements are
/// unnamed and sent as one sequence) and no startup parameter a pooler
/// rejects is sent. Otherwise statements stay prepared but are planned at
/// every run (see [`plan_every_run`]).
pub async fn connect_via(url: &str, pooler: Pooler, max_connections: u32) -> Result<PgPool> {
    let unreachable = |reason: String| Error::Unreachable {
        url: redact_url(url),
        reason,
    };
    let options: PgConnectOptions = url.parse().map_err(|e: sqlx::Error| {
        unreachable(format!(
            "not a valid Postgres URL ({})",
            first_line(&e.to_string())
        ))
    })?;
    // Statement logging would print bound values, i.e. payloads.
    let options = options.disable_statement_logging();
    let options = match pooler {
        Pooler::None => options,
        // PgBouncer refuses `extra_float_digits` at startup unless told to
        // ignore it; qbridge reads floats in binary, so it is not needed.
        // Unnamed statements are planned at every run already.
        Pooler::PgbouncerTransaction => {
            options.statement_cache_capacity(0).extra_float_digits(None)
        }
    };
    // One direct connection first: the pool reports every failure as "timed
    // out", while the connection says why (refused, bad password, no database).
    match tokio::time::timeout(Duration::from_secs(5), options.connect()).await {
        Err(_) => return Err(unreachable("no answer within 5s".into())),
        Ok(Err(e)) => {
            let reason = first_line(&e.to_string());
            let hint = match tls_hint(&reason) {
                "" if pooler == Pooler::None => crate::error::undeclared_pooler_hint(&reason),
                tls => tls,
            };
            return Err(unreachable(format!("{reason}{hint}")));
        }
        Ok(Ok(mut conn)) => {
            use sqlx::Connection;
            // The pool's connections run this too; failing here says why.
            if pooler == Pooler::None {
                plan_every_run(&mut conn)
                    .await
                    .map_err(|e| unreachable(first_line(&e.to_string())))?;
            }
            let _ = conn.close().await;
        }
    }
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if pooler == Pooler::None {
                    plan_every_run(conn).await?;
                }
                Ok(())
            })
        })
        .connect_with(options)
        .await
        .map_err(|e| unreachable(first_line(&e.to_string())))
}

/// Makes `conn` plan every statement for the values it runs with and the
/// table as it is now, never reusing a plan cached for the table as it once
/// was: a queue table's statistics swing between empty and huge, and a plan
/// made while it was empty reads the whole table once a backlog arrives
/// (`tests/it/claim_plans.rs`). A plan per statement costs a
/// fraction of a millisecond. Set after connecting rather than as a startup
/// parameter, which a pooler in session mode may refuse. (Behind a
/// transaction-mode pooler statements are unnamed, so planned at every run
/// already.)
async fn plan_every_run(conn: &mut sqlx::PgConnection) -> std::result::Result<(), sqlx::Error> {
    use sqlx::Executor;
    conn.execute("SET plan_cache_mode = force_custom_plan")
        .await
        .map(drop)
}

/// Applies pending migrations.
pub async fn migrate(pool: &PgPool) -> Result<()> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// SQLSTATE of a missing table (no `_sqlx_migrations`: never migrated).
const UNDEFINED_TABLE: &str = "42P01";
/// SQLSTATE of a missing schema.
const INVALID_SCHEMA_NAME: &str = "3F000";

/// Errors with [`Error::SchemaNotCurrent`] unless every embedded migration is
/// applied, and with [`Error::SchemaNewer`] when a newer binary's migrations
/// are applied too. Any other failure (Postgres down, a timeout, no permission) is an
/// [`Error::Db`]: "run qbridge migrate" would be the wrong advice for it.
pub async fn check_schema(pool: &PgPool) -> Result<()> {
    let applied: Option<i64> = sqlx::query_scalar(
        "SELECT max(version) FROM _sqlx_migrations WHERE success \
          AND EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'qbridge')",
    )
    .fetch_one(pool)
    .await
    .map_err(|e| {
        let missing = e
            .as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|c| c == UNDEFINED_TABLE || c == INVALID_SCHEMA_NAME);
        if missing {
            Error::SchemaNotCurrent
        } else {
            Error::Db(e)
        }
    })?;
    let known = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    match applied {
        Some(applied) if applied == known => Ok(()),
        // A newer binary migrated ahead of this one (a rolling deploy
        // half-way): its tables may hold states this binary would mishandle.
        Some(applied) if applied > known => Err(Error::SchemaNewer { applied, known }),
        _ => Err(Error::SchemaNotCurrent),
    }
}

/// What to change when the failure is about TLS (sslmode/sslrootcert in the
/// URL), where "is it running?" would send the operator the wrong way.
fn tls_hint(reason: &str) -> &'static str {
    let lower = reason.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("unknownissuer") {
        " (check sslrootcert in the URL: it must hold the CA that signed the server's certificate; verify-full also needs the host in it)"
    } else if lower.contains("does not support tls") {
        " (the server has ssl = off: turn it on, or lower sslmode)"
    } else {
        ""
    }
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_string()
}
