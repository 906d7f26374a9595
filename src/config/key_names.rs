//! A route's framework key names (`model::structures::KeyNames`): the
//! route keys `key_prefix`, `priority_steps`, `priority_sep`, `unacked_key`
//! and `unacked_index_key`, each checked against the framework that has
//! such an option (kombu's transport options for Celery, `RQ_KEY_PREFIX`
//! for RQ 3) and against the route's `redis_key`, which stays the full key
//! of the list.

use crate::model::formats::Format;
use crate::model::structures::KeyNames;

/// The keys as the route's table states them.
pub(super) struct KeyNamesFile {
    pub key_prefix: Option<String>,
    pub priority_steps: Option<Vec<i64>>,
    pub priority_sep: Option<String>,
    pub unacked_key: Option<String>,
    pub unacked_index_key: Option<String>,
}

/// Validates the route's key names for `format` and `redis_key`; the error
/// is one line naming the key.
pub(super) fn validate(
    format: &Format,
    redis_key: &str,
    file: KeyNamesFile,
) -> std::result::Result<KeyNames, String> {
    let celery_only = [
        ("priority_steps", file.priority_steps.is_some()),
        ("priority_sep", file.priority_sep.is_some()),
        ("unacked_key", file.unacked_key.is_some()),
        ("unacked_index_key", file.unacked_index_key.is_some()),
    ];
    if *format != Format::Celery {
        if let Some((key, _)) = celery_only.iter().find(|(_, set)| *set) {
            return Err(format!(
                "{key} is kombu's transport option: it needs format = \"celery\""
            ));
        }
    }
    for (key, value) in [
        ("key_prefix", &file.key_prefix),
        ("priority_sep", &file.priority_sep),
        ("unacked_key", &file.unacked_key),
        ("unacked_index_key", &file.unacked_index_key),
    ] {
        if value.as_deref() == Some("") {
            return Err(format!(
                "{key} is empty: leave it out for the framework's default"
            ));
        }
    }
    if let Some(prefix) = &file.key_prefix {
        key_prefix(format, redis_key, prefix)?;
    }
    let priority_steps = file
        .priority_steps
        .map(|steps| priority_steps(&steps))
        .transpose()?;
    Ok(KeyNames {
        prefix: file.key_prefix,
        priority_steps,
        priority_sep: file.priority_sep,
        unacked_key: file.unacked_key,
        unacked_index_key: file.unacked_index_key,
    })
}

/// kombu's `global_keyprefix` goes before the queue's name in its list's
/// key; RQ's `RQ_KEY_PREFIX` takes the place of `rq` in `rq:queue:<name>`
/// (and RQ refuses a prefix outside `[A-Za-z0-9_.:{}-]`).
fn key_prefix(format: &Format, redis_key: &str, prefix: &str) -> std::result::Result<(), String> {
    match format {
        Format::Celery => {
            if redis_key.len() <= prefix.len() || !redis_key.starts_with(prefix) {
                return Err(format!(
                    "key_prefix {prefix:?} must begin redis_key {redis_key:?}: kombu's global_keyprefix goes before the queue's name (redis_key = \"{prefix}<queue>\")"
                ));
            }
            Ok(())
        }
        Format::Rq => {
            let allowed = |b: u8| b.is_ascii_alphanumeric() || b"_.:{}-".contains(&b);
            if !prefix.bytes().all(allowed) {
                return Err(format!(
                    "key_prefix {prefix:?} is not a prefix RQ accepts (RQ_KEY_PREFIX: letters, digits and _ . : - {{ }})"
                ));
            }
            let queue = redis_key
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_prefix(":queue:"));
            if queue.is_none_or(str::is_empty) {
                return Err(format!(
                    "key_prefix {prefix:?} needs redis_key \"{prefix}:queue:<name>\" (RQ_KEY_PREFIX takes the place of rq in every key), not {redis_key:?}"
                ));
            }
            Ok(())
        }
        _ => Err(
            "key_prefix is kombu's global_keyprefix (format = \"celery\") or RQ's RQ_KEY_PREFIX (format = \"rq\"): other formats have none"
                .into(),
        ),
    }
}

/// kombu's `priority_steps` as the route states them (the transport
/// option, `[0, 3, 6, 9]` by default): ascending, each 0 to 255. Returns the
/// steps above 0, whose lists are the route's besides its own.
fn priority_steps(steps: &[i64]) -> std::result::Result<Vec<u8>, String> {
    if steps.iter().any(|s| !(0..=255).contains(s)) {
        return Err("priority_steps must be between 0 and 255 (kombu's priorities)".into());
    }
    if steps.windows(2).any(|w| w[0] >= w[1]) {
        return Err("priority_steps must be in ascending order without repeats, as kombu's".into());
    }
    Ok(steps.iter().filter(|s| **s > 0).map(|s| *s as u8).collect())
}
