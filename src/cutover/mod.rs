//! The cutover of a route: its phase and how every process reads it.
//!
//! - [`Phase`] and [`PhaseView`]: the small interface every producer path
//!   (proxy, producer API, HTTP enqueue) and consumer asks "what phase is
//!   route R in?". Processes still seed it from the route config.
//! - [`store`]: the stored phase flag — compare-and-swap transitions, the
//!   audit log, the NOTIFY that announces a change. The watch that feeds the
//!   view from the store, the gates and the `qbridge cutover` commands build
//!   on it.

mod phase;
pub mod store;

pub use phase::{Phase, PhaseView};
