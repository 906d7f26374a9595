//! The vocabulary of a migration, with no I/O: the phases a route walks
//! through ([`phase`]) and how one list item of a route becomes a job — its
//! job key and its byte-exact payload ([`formats`]) — and where a framework
//! keeps a queue's jobs besides its list ([`structures`]); and which phase
//! change every process routing pushes has followed ([`following`]).

pub mod following;
pub mod formats;
pub mod phase;
pub mod structures;

pub use phase::{bucket, Phase, PhaseView};
