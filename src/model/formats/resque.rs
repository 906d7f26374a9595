//! The `resque` format: `{"class": …, "args": […]}` as Resque pushes onto
//! `resque:queue:<name>`. A Resque job carries no id, so its key is the hash
//! of its bytes; the caller numbers occurrences so that two identical pushes
//! stay two jobs.

use serde_json::Value;

use super::{content_hash, non_empty_str, Flag, Parts};

/// Key = content hash; kind = `class`; payload = the job as parsed.
pub(super) fn decode(item: &[u8]) -> Result<Parts, Flag> {
    let payload: Value = serde_json::from_slice(item).map_err(|_| "resque: not valid JSON")?;
    let job = payload.as_object().ok_or("resque: not a JSON object")?;
    let class = non_empty_str(job.get("class")).ok_or("resque: no class string")?;
    // Resque always writes args (an empty array for none); requiring it keeps
    // other JSON objects that merely have a `class` out of the route.
    if !job.get("args").is_some_and(Value::is_array) {
        return Err("resque: no args array");
    }
    let kind = Some(class.to_string());
    Ok(Parts {
        key: content_hash(item),
        kind,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use crate::model::formats::{decode, Format, KeySource};
    use serde_json::json;

    /// `Resque.enqueue(Archive, 35, "tar")`.
    const JOB: &[u8] = br#"{"class":"Archive","args":[35,"tar"]}"#;

    #[test]
    fn kind_is_class_and_key_is_content_hash() {
        let d = decode(&Format::Resque, JOB);
        assert_eq!(d.flagged, None);
        assert_eq!(d.kind.as_deref(), Some("Archive"));
        assert_eq!(d.payload, json!({"class": "Archive", "args": [35, "tar"]}));
        assert!(matches!(&d.key, KeySource::ContentHash(h) if h.len() == 64));
        assert_eq!(&d.original[..], JOB);
    }

    #[test]
    fn identical_pushes_share_a_hash_but_not_a_key() {
        let first = decode(&Format::Resque, JOB);
        let second = decode(&Format::Resque, JOB);
        assert_eq!(first.key, second.key);
        let (k1, k2) = (first.key.with_occurrence(1), second.key.with_occurrence(2));
        assert_ne!(k1, k2);
        assert!(k1.starts_with("sha256:") && k1.ends_with(":1"));
        assert!(k2.ends_with(":2"));
    }

    #[test]
    fn different_spelling_is_a_different_hash() {
        // Same JSON value, other bytes: the hash is over the bytes, as pushed.
        let spaced = decode(
            &Format::Resque,
            br#"{"class": "Archive", "args": [35, "tar"]}"#,
        );
        assert_ne!(spaced.key, decode(&Format::Resque, JOB).key);
    }

    #[test]
    fn wrong_format_items_are_flagged_and_kept() {
        for item in [
            &br#"{"class":"Archive"}"#[..],
            br#"{"args":[1]}"#,
            br#"{"class":"Archive","args":"35"}"#,
            b"Archive 35 tar",
        ] {
            let d = decode(&Format::Resque, item);
            assert!(d.flagged.is_some());
            assert_eq!(d.kind, None);
            assert_eq!(&d.original[..], item);
        }
    }
}
