//! The cutover of a route: its phase and how every process reads it.
//!
//! So far this is the read side: [`Phase`] and [`PhaseView`], the small
//! interface every producer path (proxy, producer API, HTTP enqueue) and
//! consumer asks "what phase is route R in?". The phases start from the
//! route config; the stored, compare-and-swap phase flag with its audit log
//! and watch builds on this and updates the same view.

mod phase;

pub use phase::{Phase, PhaseView};
