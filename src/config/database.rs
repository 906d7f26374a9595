//! `[database]`: how qbridge reaches Postgres besides `database_url`.
//! `pooler` declares a transaction-mode connection pooler (PgBouncer,
//! Supavisor, Neon's pooler) in front of it; `direct_url` is an optional
//! direct connection to the same database for what needs a session (LISTEN,
//! the migration lock).

use serde::Deserialize;

pub use crate::db::Pooler;
use crate::error::{Error, Result};

/// `[database]` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct DatabaseFile {
    #[serde(default)]
    pooler: Option<Pooler>,
    #[serde(default)]
    direct_url: Option<String>,
}

/// `[database]`, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatabaseConfig {
    pub pooler: Pooler,
    /// A direct connection for LISTEN and `qbridge migrate`; behind a
    /// transaction-mode pooler without it, processes poll only.
    pub direct_url: Option<String>,
}

impl DatabaseConfig {
    /// Where the LISTEN connection goes: `database_url` without a pooler,
    /// else `direct_url`; `None` leaves polling as the only wake-up.
    pub fn listen_url<'a>(&'a self, database_url: &'a str) -> Option<&'a str> {
        match self.pooler {
            Pooler::None => Some(self.direct_url.as_deref().unwrap_or(database_url)),
            Pooler::PgbouncerTransaction => self.direct_url.as_deref(),
        }
    }

    /// Where migrations run: they hold a session lock, which a
    /// transaction-mode pooler cannot keep.
    pub fn migrate_url<'a>(&'a self, database_url: &'a str) -> Result<&'a str> {
        match (self.pooler, &self.direct_url) {
            (_, Some(direct)) => Ok(direct),
            (Pooler::None, None) => Ok(database_url),
            (Pooler::PgbouncerTransaction, None) => Err(Error::Config(
                "qbridge migrate needs a direct connection behind a transaction-mode pooler: \
                 set [database] direct_url (or run it with --database-url pointing at Postgres \
                 itself and --pooler none)"
                    .into(),
            )),
        }
    }
}

/// Validates `[database]`; `pooler` from a flag or the environment wins.
pub(crate) fn validate_database(
    file: DatabaseFile,
    pooler: Option<Pooler>,
) -> Result<DatabaseConfig> {
    if let Some(url) = &file.direct_url {
        // sqlx parses any scheme; a MySQL or Redis URL here is a mistake.
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::Config(format!(
                "[database] direct_url: {:?} must start with postgres://",
                crate::redact::redact_url(url)
            )));
        }
        url.parse::<sqlx::postgres::PgConnectOptions>()
            .map_err(|e| {
                Error::Config(format!(
                    "[database] direct_url: not a valid Postgres URL ({})",
                    e.to_string().lines().next().unwrap_or_default()
                ))
            })?;
    }
    Ok(DatabaseConfig {
        pooler: pooler.or(file.pooler).unwrap_or_default(),
        direct_url: file.direct_url,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_and_migrate_targets_follow_the_pooler() {
        let plain = DatabaseConfig::default();
        assert_eq!(plain.listen_url("db"), Some("db"));
        assert_eq!(plain.migrate_url("db").unwrap(), "db");
        let pooled = DatabaseConfig {
            pooler: Pooler::PgbouncerTransaction,
            direct_url: None,
        };
        assert_eq!(pooled.listen_url("db"), None);
        let err = pooled.migrate_url("db").unwrap_err().to_string();
        assert!(err.contains("direct_url"), "{err}");
        let with_direct = DatabaseConfig {
            direct_url: Some("direct".into()),
            ..pooled
        };
        assert_eq!(with_direct.listen_url("db"), Some("direct"));
        assert_eq!(with_direct.migrate_url("db").unwrap(), "direct");
    }

    #[test]
    fn a_bad_direct_url_is_a_one_line_error() {
        let file = DatabaseFile {
            pooler: None,
            direct_url: Some("mysql://x".into()),
        };
        let err = validate_database(file, None).unwrap_err().to_string();
        assert!(err.contains("direct_url"), "{err}");
        assert!(!err.contains('\n'));
    }
}
