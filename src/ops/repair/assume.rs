//! An operator's decision that jobs are lost when qbridge has no evidence
//! (`qbridge diff --repair --assume-lost KEY… | --assume-lost-before TIME
//! --reason …`): the selected unaccounted mirror copies are pushed back to
//! Redis, and the named held re-pushes run live in Postgres instead (one
//! path per key: a key whose re-push is released is not pushed back too,
//! or it would run on both sides). The decision
//! is the operator's, so it is audited in `qbridge.repair_audit` with who,
//! why, what was selected and what it did.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::RepairReport;
use crate::error::{Error, Result};
use crate::ingest;
use crate::redis::epoch;
use crate::routes::Route;

/// Which jobs an operator declares lost, by whom and why.
#[derive(Debug, Clone, Default)]
pub struct Assumption {
    /// These job keys.
    pub keys: Vec<String>,
    /// Every job mirrored (or held) before this time.
    pub before: Option<DateTime<Utc>>,
    /// The operator, as the audit shows them.
    pub by: String,
    /// Why they know the jobs are lost (required).
    pub reason: String,
}

impl Assumption {
    /// A decision names what it covers and says why.
    pub fn check(&self) -> Result<()> {
        if self.keys.is_empty() && self.before.is_none() {
            return Err(Error::InvalidInput(
                "--assume-lost needs job keys, or --assume-lost-before a time".into(),
            ));
        }
        if self.reason.trim().is_empty() {
            return Err(Error::InvalidInput(
                "assuming jobs lost is an operator's decision: give it a --reason".into(),
            ));
        }
        Ok(())
    }

    /// Splits `unaccounted` into those this decision covers and the rest.
    ///
    /// `before` covers a job pushed before that time; for identical copies
    /// (content hashes no pop has taken) it covers, per text, as many as
    /// copies of it were pushed before that time and not popped by then:
    /// the missing copies are named by count, so the key named may be one
    /// pushed later than the copy Redis lost (oracle seeds 3208, 3568).
    pub(super) async fn split(
        &self,
        db: &PgPool,
        route: &Route,
        unaccounted: Vec<String>,
    ) -> Result<(Vec<String>, Vec<String>)> {
        let mut before: Vec<String> = Vec::new();
        if let Some(time) = self.before.filter(|_| !unaccounted.is_empty()) {
            let by_text = epoch::copies_before(db, &route.queue, &unaccounted, time).await?;
            let judged: Vec<&String> = by_text.iter().map(|(k, _)| k).collect();
            let per_key: Vec<&String> =
                unaccounted.iter().filter(|k| !judged.contains(k)).collect();
            // Per key by when Redis had it (a popped number: when the pop
            // took it), as the evidence is judged.
            before = sqlx::query_scalar(epoch::HAD_AT_SQL)
                .bind(&route.queue)
                .bind(&per_key)
                .bind(time)
                .fetch_all(db)
                .await?;
            before.extend(by_text.into_iter().filter(|(_, c)| *c).map(|(k, _)| k));
        }
        Ok(unaccounted
            .into_iter()
            .partition(|k| self.keys.contains(k) || before.contains(k)))
    }

    /// The evidence line of the jobs this decision pushes back.
    pub(super) fn evidence_line(&self) -> String {
        format!("assumed lost by {}: {}", self.by, self.reason.trim())
    }

    /// Runs the held re-pushes of `keys` (named by the operator, and not
    /// held in Redis) live; their keys. (Only named keys: a
    /// Redis crash at some time says nothing of whether an original had
    /// run before it, so `before` never releases a held re-push.)
    pub(super) async fn release_held(
        &self,
        db: &PgPool,
        route: &Route,
        keys: &[String],
        payload_limit: usize,
    ) -> Result<Vec<String>> {
        let mut tx = db.begin().await?;
        let released = ingest::release(&mut tx, &route.queue, keys, payload_limit).await?;
        tx.commit().await?;
        Ok(released)
    }

    /// Records the decision and what it did.
    pub(super) async fn audit(
        &self,
        db: &PgPool,
        route: &Route,
        done: &RepairReport,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO qbridge.repair_audit (route, by, reason, keys, before, pushed_back, released) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&route.name)
        .bind(&self.by)
        .bind(self.reason.trim())
        .bind((!self.keys.is_empty()).then_some(&self.keys))
        .bind(self.before)
        .bind(done.repushed as i32)
        .bind(done.released as i32)
        .execute(db)
        .await?;
        tracing::info!(
            route = %route.name,
            by = %self.by,
            pushed_back = done.repushed,
            released = done.released,
            "jobs assumed lost by an operator"
        );
        Ok(())
    }
}
