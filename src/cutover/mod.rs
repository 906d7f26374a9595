//! The cutover of a route: its phase and how every process reads it.
//!
//! - [`Phase`] and [`PhaseView`]: the small interface every producer path
//!   (proxy, producer API, HTTP enqueue) and consumer asks "what phase is
//!   route R in?". Processes still seed it from the route config.
//! - [`store`]: the stored phase flag — compare-and-swap transitions, the
//!   audit log, the NOTIFY that announces a change.
//! - [`watch`]: feeds a [`PhaseView`] from the store, keeping the last known
//!   phases while Postgres is unreachable.
//!
//! Not wired into the processes yet: the gates and the `qbridge cutover`
//! commands that make the stored flag the one operators change come next.

mod phase;
pub mod store;
pub mod watch;

pub use phase::{Phase, PhaseView};
