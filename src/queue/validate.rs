//! Input checks shared by every producer path (library, CLI, HTTP), so a bad
//! name or payload is refused before anything is written.

use crate::error::{Error, Result};

/// Default payload size limit: 1 MiB of serialized JSON.
pub const DEFAULT_PAYLOAD_LIMIT: usize = 1024 * 1024;

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
    serde_json::from_str(text).map_err(|e| Error::PayloadNotJson(e.to_string()))
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
    Ok(text)
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
    fn pointers() {
        assert_eq!(json_pointer_path("/a/b").unwrap(), vec!["a", "b"]);
        assert_eq!(json_pointer_path("/a~1b/c~0d").unwrap(), vec!["a/b", "c~d"]);
        assert!(json_pointer_path("a").is_err());
    }
}
