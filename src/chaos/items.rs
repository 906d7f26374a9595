//! What the fault suite's producers push: unique ids, or a few identical
//! texts (content-hash keys), and the bytes of each. Apart from the load so
//! the rig (which sets the route's format from it) and the oracle can name
//! it without depending on the producers.

use bytes::Bytes;

/// What the producers push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Items {
    /// JSON with a unique `id` (route format `json:/id`): the key is the id.
    Ids,
    /// A few identical texts over and over (route format `raw`): keys are
    /// content hashes numbered by occurrence, the case that can drift.
    Repeating,
}

impl Items {
    /// How many distinct texts [`Items::Repeating`] cycles through.
    const TEXTS: u64 = 5;

    /// The route format the items need.
    pub fn format(self) -> &'static str {
        match self {
            Items::Ids => "json:/id",
            Items::Repeating => "raw",
        }
    }

    /// The name the n-th item of a producer is acknowledged under: its id,
    /// or its text (the oracle counts pushes per text).
    pub(super) fn name(self, producer: &str, n: u64) -> String {
        match self {
            Items::Ids => format!("{producer}-{n}"),
            Items::Repeating => format!("job-{}", n % Self::TEXTS),
        }
    }

    /// Whether pushing a name again is a new job (identical bytes are two
    /// jobs on a content-hash route) rather than a re-push of the same one.
    pub fn repeats_are_new_jobs(self) -> bool {
        self == Items::Repeating
    }
}

/// The item pushed under `name` (see [`Items`]).
pub fn item(items: Items, name: &str) -> Bytes {
    match items {
        Items::Ids => Bytes::from(serde_json::json!({ "id": name, "work": "chaos" }).to_string()),
        Items::Repeating => Bytes::from(name.to_string()),
    }
}
