//! The operator layer: what `qbridge cutover`, `qbridge diff` and the admin
//! API do, above the runtime pieces they inspect.
//!
//! - [`redis_view`]: what a route still holds in Redis; [`structures`]:
//!   what its framework's other structures hold (Sidekiq's schedule, retry
//!   and dead sets).
//! - [`diff`]: the two sides of a route compared over a window;
//!   [`diff_metrics`] publishes it as gauges; [`repair`] fills what is
//!   missing on one side; [`evidence`] decides which silent mirror copies
//!   Redis provably lost (repairable) and which are unaccounted.
//! - [`gates`]: the measured numbers each advance needs.
//! - [`operate`]: advance, rollback and the percent ramp ([`backlog`]:
//!   on the way into `dual_write`, the identical items Redis already holds);
//!   [`decommission`] archives and deletes a route's Redis keys.
//! - [`window`]: where a diff's window starts.
//! - [`shadow_test`]: one shadow call with a stored job, before `shadow`.
//! - [`survey`]: what a team's Redis holds before any route exists
//!   (`qbridge survey`), and a draft config from it.

pub mod backlog;
pub mod decommission;
pub mod diff;
pub mod diff_metrics;
pub mod evidence;
pub mod gates;
pub mod import;
pub mod operate;
pub mod redis_view;
pub mod repair;
pub mod shadow_test;
pub mod structures;
pub mod survey;
pub mod window;
