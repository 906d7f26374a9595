//! List-item formats: how one item of a routed Redis list becomes a job.
//!
//! Every mirrored item needs two things from its route's [`Format`]:
//!
//! - a stable **job key** (ARCHITECTURE.md, "Vocabulary"), so the Redis copy and the Postgres copy
//!   of a job can be matched and a re-push (a Sidekiq retry, a producer retry)
//!   is not mistaken for a new job;
//! - its **original bytes, exactly**, so a rollback can push the item back to
//!   Redis byte-for-byte whatever the payload looks like.
//!
//! [`decode`] never fails. An item that does not parse as its route's format
//! (or that Postgres could not store as parsed: a NUL character, an oversized
//! key) comes back as a raw item with [`Decoded::flagged`] saying why, so the
//! caller can count it and still mirror it. Nothing is ever dropped.
//!
//! Payload shapes (the `payload` stored as jsonb):
//!
//! | format | key | kind | payload |
//! | --- | --- | --- | --- |
//! | `json` | value at the key pointer | none | the parsed item |
//! | `sidekiq` | `jid` | `class` (`wrapped` for ActiveJob) | the parsed job hash |
//! | `celery` | `headers.id` (body `id` for protocol 1) | `headers.task` (body `task`) | `{"envelope": …, "body": …}` |
//! | `resque` | content hash | `class` | the parsed `{class, args}` |
//! | `rq` | the item text | none | `{"rq_job_id": …}` |
//! | `raw` | content hash | none | `{"raw_b64": …}` |
//! | flagged | content hash | none | `{"raw_b64": …, "flagged": reason}` |
//!
//! Flag reasons come from a fixed set of short texts that never quote the
//! item, so they are safe in logs and as a low-cardinality metric label.
//! Payloads themselves must never be logged: [`Decoded`]'s `Debug` leaves
//! them out.

mod celery;
mod json;
mod raw;
mod resque;
pub mod rq;
mod sidekiq;

#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::queue::validate::MAX_FIELD_LEN;

/// The payload format of a route's list items.
///
/// Written in config as its name: `"sidekiq"`, `"celery"`, `"resque"`,
/// `"rq"`, `"raw"`, or `"json:<pointer>"` (e.g. `"json:/id"`) — JSON needs
/// the pointer of its job key. A config that keeps the pointer in its own
/// field can use [`Format::from_parts`]. Serde uses the same text form.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// Any JSON document; the job key is the string or integer at
    /// `key_pointer` (RFC 6901, e.g. `/id` or `/meta/job_id`). Build it with
    /// [`Format::json`] to have the pointer checked.
    Json {
        /// RFC 6901 pointer to the job key inside each item.
        key_pointer: String,
    },
    /// A Sidekiq job hash (`jid`, `class`, `args`, `queue`, …).
    Sidekiq,
    /// A Celery message in kombu's Redis transport envelope.
    Celery,
    /// A Resque job `{"class": …, "args": […]}`, which carries no id.
    Resque,
    /// An RQ queue entry: the list item is the job id.
    Rq,
    /// Any bytes, kept as they are.
    Raw,
}

/// Why a format name or key pointer was refused (a config error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The name is none of the known formats.
    #[error("unknown payload format {0:?}; expected one of json:<pointer>, sidekiq, celery, resque, rq, raw")]
    Unknown(String),
    /// `json` was given without the pointer of its job key.
    #[error("the json format needs the JSON pointer of its job key, e.g. json:/id")]
    MissingKeyPointer,
    /// A key pointer was given to a format that takes none.
    #[error("the {0} format takes no key pointer (only json does)")]
    UnexpectedKeyPointer(&'static str),
    /// The key pointer is not an RFC 6901 pointer to a member.
    #[error("invalid JSON pointer {pointer:?}: {reason}")]
    InvalidKeyPointer {
        /// The pointer as given.
        pointer: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Format {
    /// A JSON format keyed by `key_pointer`, checked to be an RFC 6901
    /// pointer below the document root.
    pub fn json(key_pointer: &str) -> Result<Self, FormatError> {
        let invalid = |reason| FormatError::InvalidKeyPointer {
            pointer: key_pointer.to_string(),
            reason,
        };
        // The root pointer "" would make the whole document the key: never
        // what an operator means, and it would key every object item as missing.
        if !key_pointer.starts_with('/') {
            return Err(invalid("it must start with '/'"));
        }
        // serde_json does not reject bad escapes; it silently finds nothing.
        let mut chars = key_pointer.chars();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return Err(invalid("'~' must be followed by 0 or 1"));
            }
        }
        Ok(Format::Json {
            key_pointer: key_pointer.to_string(),
        })
    }

    /// Builds a format from a name and an optional key pointer, for configs
    /// that keep the two in separate fields.
    pub fn from_parts(name: &str, key_pointer: Option<&str>) -> Result<Self, FormatError> {
        let format = match name {
            "json" => return Format::json(key_pointer.ok_or(FormatError::MissingKeyPointer)?),
            "sidekiq" => Format::Sidekiq,
            "celery" => Format::Celery,
            "resque" => Format::Resque,
            "rq" => Format::Rq,
            "raw" => Format::Raw,
            other => return Err(FormatError::Unknown(other.to_string())),
        };
        match key_pointer {
            Some(_) => Err(FormatError::UnexpectedKeyPointer(format.name())),
            None => Ok(format),
        }
    }

    /// The format's name without its pointer: `json`, `sidekiq`, … (a
    /// low-cardinality label for metrics and `stats`).
    pub fn name(&self) -> &'static str {
        match self {
            Format::Json { .. } => "json",
            Format::Sidekiq => "sidekiq",
            Format::Celery => "celery",
            Format::Resque => "resque",
            Format::Rq => "rq",
            Format::Raw => "raw",
        }
    }
}

impl FromStr for Format {
    type Err = FormatError;

    /// Parses `sidekiq`, `celery`, `resque`, `rq`, `raw` or `json:<pointer>`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("json", pointer)) => Format::json(pointer),
            _ => Format::from_parts(s, None),
        }
    }
}

impl fmt::Display for Format {
    /// The text [`FromStr`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Format::Json { key_pointer } => write!(f, "json:{key_pointer}"),
            other => f.write_str(other.name()),
        }
    }
}

impl serde::Serialize for Format {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Format {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a job key comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeySource {
    /// An id carried by the item itself (Sidekiq `jid`, Celery task id, the
    /// JSON pointer's value, the RQ job id). It is the job key as it is.
    Id(String),
    /// Lowercase hex SHA-256 of the item bytes, for items with no id (resque,
    /// raw, flagged). Identical payloads share it, so the caller adds an
    /// occurrence number with [`KeySource::with_occurrence`] to keep two
    /// pushes of the same bytes two jobs.
    ContentHash(String),
}

impl KeySource {
    /// The final job key: an id unchanged, a content hash as
    /// `sha256:<hex>:<n>`, where `n` is the caller's count of this hash on the
    /// route (e.g. 1 for the first push of these bytes, 2 for the second).
    pub fn with_occurrence(&self, n: u64) -> String {
        match self {
            KeySource::Id(id) => id.clone(),
            KeySource::ContentHash(hex) => format!("sha256:{hex}:{n}"),
        }
    }

    /// The key of a live copy stored while Postgres runs the route: it never
    /// reaches Redis, so it is numbered apart from what Redis counts,
    /// `sha256:<hex>:pg<n>` (an id unchanged).
    pub fn with_live_occurrence(&self, n: u64) -> String {
        match self {
            KeySource::Id(id) => id.clone(),
            KeySource::ContentHash(hex) => format!("sha256:{hex}:pg{n}"),
        }
    }

    /// The key of a pop in `redis_only` of bytes no mirrored copy waits for:
    /// `sha256:<hex>:r-<pop>`, a name no push can have (an id unchanged).
    pub fn unmirrored(&self, pop: &str) -> String {
        match self {
            KeySource::Id(id) => id.clone(),
            KeySource::ContentHash(hex) => format!("sha256:{hex}:r-{pop}"),
        }
    }

    /// True when the key is a content hash, i.e. the caller must number
    /// occurrences for the key to be unique.
    pub fn is_content_hash(&self) -> bool {
        matches!(self, KeySource::ContentHash(_))
    }

    /// Whether job key `key` names these bytes: their id, or their content
    /// hash under any occurrence number.
    pub fn names(&self, key: &str) -> bool {
        match self {
            KeySource::Id(id) => key == id,
            KeySource::ContentHash(hex) => key
                .strip_prefix("sha256:")
                .and_then(|rest| rest.strip_prefix(hex.as_str()))
                .is_some_and(|rest| rest.starts_with(':')),
        }
    }
}

/// One list item, decoded by its route's format.
#[derive(Clone, PartialEq)]
pub struct Decoded {
    /// Where the job key comes from; see [`KeySource::with_occurrence`].
    pub key: KeySource,
    /// The job's class or task name, when the format has one.
    pub kind: Option<String>,
    /// The item as JSON, in the shape the format documents (module docs).
    /// Always storable as Postgres jsonb (no NUL characters).
    pub payload: Value,
    /// The exact bytes of the item, pushed back to Redis on rollback.
    pub original: Bytes,
    /// Why the item was stored raw instead of as its format; `None` when it
    /// parsed. A short fixed text that never quotes the item.
    pub flagged: Option<String>,
}

impl fmt::Debug for Decoded {
    // Payloads are personal data: show their size, never their content.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoded")
            .field("key", &self.key)
            .field("kind", &self.kind)
            .field("original_len", &self.original.len())
            .field("flagged", &self.flagged)
            .finish_non_exhaustive()
    }
}

/// Decodes one list item by `format`. Never fails: see the module docs.
pub fn decode(format: &Format, item: &[u8]) -> Decoded {
    decode_bytes(format, Bytes::copy_from_slice(item))
}

/// [`decode`] for an item already held as [`Bytes`] (e.g. a RESP frame's
/// bulk string), which becomes `original` without a copy.
/// The job priority an item's own message asks for (larger runs first):
/// Celery's message priority, negated (kombu runs a lower number first); 0
/// for every other format.
pub fn job_priority(format: &Format, payload: &Value) -> i32 {
    match format {
        Format::Celery => celery::job_priority(payload),
        _ => 0,
    }
}

/// When an item's own message says it is due, if later than its push:
/// Celery's `eta` header (a countdown or `eta` task, which kombu pushes at
/// once and a worker holds until then). `None` for every other format, whose
/// later jobs wait in a set instead (`mirror::due`).
pub fn due_at(format: &Format, payload: &Value) -> Option<chrono::DateTime<chrono::Utc>> {
    match format {
        Format::Celery => celery::eta(payload),
        _ => None,
    }
}

/// Attempts a job already used on the Redis side, as its framework records
/// them in the job: Sidekiq's `retry_count` counts retries from 0 at the
/// first failure (so that many plus one attempts failed), Celery's
/// `retries` header the retries so far. `None` for a job never retried, or
/// a format that does not say (RQ keeps it in its job hash, Resque nowhere).
pub fn attempts_so_far(format: &Format, payload: &Value) -> Option<i32> {
    let count = |pointer: &str| {
        payload
            .pointer(pointer)
            .and_then(Value::as_i64)
            .filter(|n| *n >= 0)
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX))
    };
    match format {
        Format::Sidekiq => count("/retry_count").map(|n| n.saturating_add(1)),
        Format::Celery => count("/envelope/headers/retries").filter(|n| *n > 0),
        _ => None,
    }
}

pub fn decode_bytes(format: &Format, item: Bytes) -> Decoded {
    let parsed = match format {
        Format::Json { key_pointer } => json::decode(&item, key_pointer),
        Format::Sidekiq => sidekiq::decode(&item),
        Format::Celery => celery::decode(&item),
        Format::Resque => resque::decode(&item),
        Format::Rq => rq::decode(&item),
        Format::Raw => Ok(raw::decode(&item)),
    };
    match parsed.and_then(storable) {
        Ok(parts) => Decoded {
            key: parts.key,
            kind: parts.kind,
            payload: parts.payload,
            original: item,
            flagged: None,
        },
        Err(reason) => Decoded {
            key: content_hash(&item),
            kind: None,
            payload: raw::flagged_payload(&item, reason),
            original: item,
            flagged: Some(reason.to_string()),
        },
    }
}

/// The bytes to push back to Redis on rollback: always exactly the item as
/// it was read, whatever the format made of it.
pub fn encode_original(decoded: &Decoded) -> &[u8] {
    &decoded.original
}

/// Recovers the item bytes from a raw or flagged payload alone
/// (`{"raw_b64": …}` or `{"raw_b64": …, "flagged": …}` and nothing else), so
/// those items round-trip from what Postgres stores even without `original`.
///
/// Returns `None` for every other shape. JSON formats (json, sidekiq, celery,
/// resque) cannot be recovered byte-exactly from their payload: jsonb
/// normalizes whitespace, key order, duplicate keys and number spelling. The
/// mirroring code stores `original` alongside (its own bytea column) for that.
/// A `json`-format item that itself is exactly `{"raw_b64": "…"}` would look
/// raw here, which is one more reason to prefer the stored `original`.
pub fn original_from_payload(payload: &Value) -> Option<Vec<u8>> {
    let fields = payload.as_object()?;
    let b64 = fields.get(raw::RAW_FIELD)?.as_str()?;
    let only_raw_fields = fields.iter().all(|(name, value)| {
        name == raw::RAW_FIELD || (name == raw::FLAGGED_FIELD && value.is_string())
    });
    if !only_raw_fields {
        return None;
    }
    BASE64.decode(b64).ok()
}

/// What a format makes of an item that parses.
struct Parts {
    key: KeySource,
    kind: Option<String>,
    payload: Value,
}

/// Why an item is stored raw: a fixed text that never quotes the item.
type Flag = &'static str;

/// Hex SHA-256 of the item, the key of items that carry no id.
fn content_hash(item: &[u8]) -> KeySource {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(item);
    let mut hex = String::with_capacity(digest.len() * 2);
    for byte in digest {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    KeySource::ContentHash(hex)
}

/// A member that is a non-empty string (ids and class names must be).
fn non_empty_str(value: Option<&Value>) -> Option<&str> {
    value.and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Refuses parts Postgres could not store as they are, so the item is kept
/// raw instead of failing the mirror insert later: the queue refuses keys and
/// kinds over [`MAX_FIELD_LEN`] bytes, and neither text nor jsonb can hold
/// U+0000 (JSON spells it `\u0000`; the raw form has no such limit).
fn storable(parts: Parts) -> Result<Parts, Flag> {
    let field_ok = |s: &str| s.len() <= MAX_FIELD_LEN && !s.contains('\0');
    if let KeySource::Id(id) = &parts.key {
        if !field_ok(id) {
            return Err("job key too long or holds a NUL character");
        }
    }
    if parts.kind.as_deref().is_some_and(|kind| !field_ok(kind)) {
        return Err("job kind too long or holds a NUL character");
    }
    if holds_nul(&parts.payload) {
        return Err("payload holds a NUL character (\\u0000), which jsonb cannot store");
    }
    Ok(parts)
}

/// True when any string or member name in `value` holds U+0000.
fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}
