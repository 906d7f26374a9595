//! The cutover of a route: its phase and how every process reads it.
//!
//! - [`Phase`] and [`PhaseView`]: the small interface every producer path
//!   (proxy, producer API, HTTP enqueue) and consumer asks "what phase is
//!   route R in?".
//! - [`store`]: the stored phase flag — compare-and-swap transitions, the
//!   audit log, the NOTIFY that announces a change.
//! - [`watch`]: feeds a [`PhaseView`] from the store, keeping the last known
//!   phases while Postgres is unreachable.
//!
//! - [`gates`]: the measured numbers each advance needs.
//! - [`operate`]: advance and rollback as `qbridge cutover` runs them;
//!   [`decommission`] archives and deletes a route's Redis keys.
//!
//! The runbook for operators is `cutover/` at the repository root.

pub mod decommission;
pub mod gates;
pub mod operate;
mod phase;
pub mod store;
pub mod watch;

pub use phase::{bucket, Phase, PhaseView};
