//! The transparent RESP proxy. So far: the RESP2/RESP3 frame codec with
//! bounded parsing. The connection splice and mirroring build on it.

pub mod frame;
