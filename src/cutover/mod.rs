//! The stored phase flag of each route and how every process follows it.
//!
//! - [`store`]: the flag in Postgres — compare-and-swap transitions, the
//!   audit log, the NOTIFY that announces a change.
//! - [`watch`]: feeds a process's [`PhaseView`](crate::model::PhaseView)
//!   from the store, keeping the last known phases while Postgres is
//!   unreachable.
//! - [`follow`]: whether every process routing a route's pushes has
//!   followed its latest change, with the pushes it routed before written.
//!
//! The phases themselves are in [`crate::model::phase`]; what an operator
//! does with them (gates, advance, rollback, decommission) is in
//! [`crate::ops`]. The runbook for operators is `docs/src/runbook/` in the
//! book.

pub mod follow;
pub mod store;
pub mod watch;
