//! Input checks shared by every producer path (library, CLI, HTTP), so a bad
//! name or payload is refused before anything is written.

use crate::error::{Error, Result};
use crate::queue::job::NewJob;

/// Default payload size limit: 1 MiB of serialized JSON.
pub const DEFAULT_PAYLOAD_LIMIT: usize = 1024 * 1024;

/// Most bytes in a job's key, lock key or kind. They are indexed and compared
/// on hot paths; an id or a class name is far shorter.
pub const MAX_FIELD_LEN: usize = 1024;

/// Why a payload holding U+0000 is refused. Names no part of the payload.
const NUL_IN_PAYLOAD: &str = "payload contains a NUL character (\\u0000) in a string or key; \
     Postgres jsonb cannot store it: remove or replace it before enqueueing";

/// Accepts 1–128 characters of `[A-Za-z0-9_.:-]`.
pub fn queue_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidQueueName(name.to_string()))
    }
}

/// Parses `text` as a JSON payload, refusing it when over `limit` bytes.
pub fn payload_text(text: &str, limit: usize) -> Result<serde_json::Value> {
    if text.len() > limit {
        return Err(Error::PayloadTooLarge {
            size: text.len(),
            limit,
        });
    }
    let value = serde_json::from_str(text).map_err(|e| Error::PayloadNotJson(e.to_string()))?;
    // JSON text can only spell U+0000 as the escape `\u0000`.
    if text.contains("\\u0000") && has_nul(&value) {
        return Err(Error::InvalidInput(NUL_IN_PAYLOAD.into()));
    }
    Ok(value)
}

/// Serializes a payload, refusing it when over `limit` bytes.
pub fn payload_value(value: &serde_json::Value, limit: usize) -> Result<String> {
    let text = serde_json::to_string(value).map_err(|e| Error::PayloadNotJson(e.to_string()))?;
    if text.len() > limit {
        return Err(Error::PayloadTooLarge {
            size: text.len(),
            limit,
        });
    }
    // serde_json writes U+0000 as `\u0000`: search the text, walk the value
    // only on a hit (the text may hold an escaped backslash before "u0000").
    if text.contains("\\u0000") && has_nul(value) {
        return Err(Error::InvalidInput(NUL_IN_PAYLOAD.into()));
    }
    Ok(text)
}

/// True when any string or object key in `value` holds U+0000.
fn has_nul(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// Checks a job's key, lock key and kind: at most [`MAX_FIELD_LEN`] bytes and
/// no NUL character (Postgres text cannot hold one). Errors give the length,
/// never the value.
pub fn job_fields(job: &NewJob) -> Result<()> {
    for (what, value) in [
        ("key", &job.key),
        ("lock_key", &job.lock_key),
        ("kind", &job.kind),
    ] {
        let Some(v) = value else { continue };
        if v.len() > MAX_FIELD_LEN {
            return Err(Error::InvalidInput(format!(
                "job {what} is {} bytes, over the limit of {MAX_FIELD_LEN} bytes",
                v.len()
            )));
        }
        if v.contains('\0') {
            return Err(Error::InvalidInput(format!(
                "job {what} contains a NUL character; Postgres text cannot store it"
            )));
        }
    }
    Ok(())
}

/// Turns a JSON pointer (`/tenant/id`) into the path array `#>>` takes.
pub fn json_pointer_path(pointer: &str) -> Result<Vec<String>> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer.strip_prefix('/').ok_or_else(|| {
        Error::InvalidInput(format!(
            "JSON pointer {pointer:?} must start with '/' (e.g. /tenant_id)"
        ))
    })?;
    Ok(rest
        .split('/')
        .map(|seg| seg.replace("~1", "/").replace("~0", "~"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names() {
        assert!(queue_name("emails").is_ok());
        assert!(queue_name("a.b:c-d_e9").is_ok());
        assert!(queue_name(&"x".repeat(128)).is_ok());
        for bad in [
            "",
            "has space",
            "semi;colon",
            "quote'",
            "ünï",
            &"x".repeat(129),
        ] {
            assert!(queue_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn payload_checks() {
        assert!(payload_text("{\"a\":1}", 100).is_ok());
        assert!(matches!(
            payload_text("{not json", 100),
            Err(Error::PayloadNotJson(_))
        ));
        assert!(matches!(
            payload_text("[1,2,3]", 3),
            Err(Error::PayloadTooLarge { size: 7, limit: 3 })
        ));
    }

    #[test]
    fn nul_characters_are_refused() {
        for text in [
            r#"{"a":"x\u0000y"}"#,
            r#"{"a\u0000":1}"#,
            r#"[1, {"deep": ["\u0000"]}]"#,
            r#""\u0000""#,
        ] {
            let err = payload_text(text, 1000).unwrap_err().to_string();
            assert!(err.contains("NUL"), "{text}: {err}");
            assert!(!err.contains('\n'), "{err}");
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            let err = payload_value(&value, 1000).unwrap_err().to_string();
            assert!(err.contains("NUL"), "{text}: {err}");
        }
        // An escaped backslash before "u0000" is six plain characters.
        let text = r#"{"path":"C:\\u0000"}"#;
        let value = payload_text(text, 1000).unwrap();
        assert_eq!(value["path"], "C:\\u0000");
        assert!(payload_value(&value, 1000).is_ok());
    }

    #[test]
    fn job_field_limits() {
        let job = || NewJob::new("q", serde_json::json!({}));
        let max = "k".repeat(MAX_FIELD_LEN);
        let over = "k".repeat(MAX_FIELD_LEN + 1);
        assert!(job_fields(&job()).is_ok());
        assert!(job_fields(&job().with_key(&max).with_lock_key(&max).with_kind(&max)).is_ok());
        for (what, j) in [
            ("key", job().with_key(&over)),
            ("lock_key", job().with_lock_key(&over)),
            ("kind", job().with_kind(&over)),
        ] {
            let err = job_fields(&j).unwrap_err().to_string();
            assert!(err.contains(what) && err.contains("1025 bytes"), "{err}");
            assert!(!err.contains("kkkk"), "the value leaked: {err}");
        }
        let err = job_fields(&job().with_key("a\0b")).unwrap_err().to_string();
        assert!(err.contains("NUL"), "{err}");
    }

    #[test]
    fn pointers() {
        assert_eq!(json_pointer_path("/a/b").unwrap(), vec!["a", "b"]);
        assert_eq!(json_pointer_path("/a~1b/c~0d").unwrap(), vec!["a/b", "c~d"]);
        assert!(json_pointer_path("a").is_err());
    }
}
