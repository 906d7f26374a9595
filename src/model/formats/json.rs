//! The `json` format: any JSON document whose job key sits at a configured
//! JSON pointer (e.g. `/id`).

use serde_json::Value;

use super::{Flag, KeySource, Parts};

/// Key = the string, or integer as decimal text, at `key_pointer`; no kind;
/// payload = the parsed document.
pub(super) fn decode(item: &[u8], key_pointer: &str) -> Result<Parts, Flag> {
    let payload: Value = serde_json::from_slice(item).map_err(|_| "json: not valid JSON")?;
    let key = match payload.pointer(key_pointer) {
        Some(Value::String(s)) if s.is_empty() => return Err("json: empty job key"),
        Some(Value::String(s)) => s.clone(),
        // Only integers: serde_json reads other numbers as f64, and two ids
        // that differ past f64 precision would share a key and be deduplicated
        // into one job. Integers are exact (i64/u64); larger ones parse as f64
        // and are refused for the same reason.
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
        Some(_) => return Err("json: job key is not a string or an integer"),
        None => return Err("json: no job key at the key pointer"),
    };
    Ok(Parts {
        key: KeySource::Id(key),
        kind: None,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use crate::model::formats::{decode, original_from_payload, Format, KeySource};
    use serde_json::json;

    fn by(pointer: &str) -> Format {
        Format::json(pointer).expect("valid pointer")
    }

    #[test]
    fn string_key_at_pointer() {
        let item = br#"{"id":"ord-7f3a","type":"invoice.send","data":{"order":1042,"email":"a@example.com"}}"#;
        let d = decode(&by("/id"), item);
        assert_eq!(d.flagged, None);
        assert_eq!(d.key, KeySource::Id("ord-7f3a".into()));
        assert_eq!(d.kind, None);
        assert_eq!(d.payload["data"]["order"], json!(1042));
        assert_eq!(&d.original[..], item);
    }

    #[test]
    fn integer_key_becomes_decimal_text() {
        let d = decode(
            &by("/meta/seq"),
            br#"{"meta":{"seq":18446744073709551615}}"#,
        );
        assert_eq!(d.key, KeySource::Id("18446744073709551615".into()));
        let d = decode(&by("/n"), br#"{"n":-3}"#);
        assert_eq!(d.key, KeySource::Id("-3".into()));
    }

    #[test]
    fn escaped_pointer_reaches_odd_member_names() {
        let d = decode(&by("/job~1id"), br#"{"job/id":"x1"}"#);
        assert_eq!(d.key, KeySource::Id("x1".into()));
    }

    #[test]
    fn whitespace_is_kept_in_original() {
        let item = b"{ \"id\" : \"a\" ,\n  \"b\":1 }\n";
        let d = decode(&by("/id"), item);
        assert_eq!(d.flagged, None);
        assert_eq!(&d.original[..], item);
        // jsonb-style normalization loses the spelling: only `original` keeps it.
        assert_eq!(original_from_payload(&d.payload), None);
    }

    #[test]
    fn unusable_keys_are_flagged_and_kept() {
        for item in [
            &br#"{"name":"no id here"}"#[..],
            br#"{"id":""}"#,
            br#"{"id":null}"#,
            br#"{"id":1.5}"#,
            br#"{"id":1e400}"#,
            br#"{"id":123456789012345678901234567890}"#,
            br#"{"id":{"nested":true}}"#,
            br#"["id"]"#,
            b"not json",
            b"\xff\xfe{}",
        ] {
            let d = decode(&by("/id"), item);
            assert!(d.flagged.is_some(), "{:?}", String::from_utf8_lossy(item));
            assert!(d.key.is_content_hash());
            assert_eq!(original_from_payload(&d.payload).as_deref(), Some(item));
        }
    }
}
