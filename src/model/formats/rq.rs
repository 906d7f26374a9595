//! The `rq` format: RQ pushes only the job id onto `rq:queue:<name>` (the job
//! itself lives in the `rq:job:<id>` hash), so the item is the key.

use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::{Flag, KeySource, Parts};

/// Puts the job's hash (`rq:job:<id>`, read from Redis) into an RQ item's
/// payload as `rq_job`: each field's value as text when it is UTF-8, else
/// `{"base64": …}` (RQ's `data` is a zlib-compressed pickle by default). Byte
/// exact both ways: the hash can be written back as it was.
pub fn with_job(payload: &mut Value, fields: &[(String, Vec<u8>)]) {
    let job: Map<String, Value> = fields
        .iter()
        .map(|(field, value)| {
            let value = match std::str::from_utf8(value) {
                Ok(text) => Value::String(text.to_string()),
                Err(_) => json!({
                    "base64": base64::engine::general_purpose::STANDARD.encode(value)
                }),
            };
            (field.clone(), value)
        })
        .collect();
    if let Value::Object(map) = payload {
        map.insert("rq_job".into(), Value::Object(job));
    }
}

/// Key = the item as text; no kind; payload = `{"rq_job_id": id}`.
pub(super) fn decode(item: &[u8]) -> Result<Parts, Flag> {
    let id = std::str::from_utf8(item).map_err(|_| "rq: job id is not UTF-8")?;
    if id.is_empty() {
        return Err("rq: empty job id");
    }
    // RQ ids are UUIDs or caller-chosen names used inside Redis key names.
    // Whitespace or control characters, or a JSON document, mean another
    // format's item was pushed onto this route's list; keying it by its whole
    // text would hide that.
    if id.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("rq: job id holds whitespace or control characters");
    }
    if id.starts_with(['{', '[', '"']) {
        return Err("rq: item looks like JSON, not a job id");
    }
    Ok(Parts {
        key: KeySource::Id(id.to_string()),
        kind: None,
        payload: json!({ "rq_job_id": id }),
    })
}

#[cfg(test)]
mod tests {
    use crate::model::formats::{decode, original_from_payload, Format, KeySource};
    use serde_json::json;

    #[test]
    fn uuid_job_id() {
        let item = b"2c7b5e0e-4f6a-4c1d-9b1e-3a8f5d6c7b9a";
        let d = decode(&Format::Rq, item);
        assert_eq!(d.flagged, None);
        assert_eq!(
            d.key,
            KeySource::Id("2c7b5e0e-4f6a-4c1d-9b1e-3a8f5d6c7b9a".into())
        );
        assert_eq!(d.kind, None);
        assert_eq!(
            d.payload,
            json!({"rq_job_id": "2c7b5e0e-4f6a-4c1d-9b1e-3a8f5d6c7b9a"})
        );
        assert_eq!(&d.original[..], item);
    }

    #[test]
    fn the_job_hash_rides_in_the_payload_byte_exact() {
        let mut d = decode(&Format::Rq, b"j1");
        let fields = vec![
            ("status".to_string(), b"queued".to_vec()),
            ("data".to_string(), vec![0x78, 0x9c, 0xff, 0x00]),
        ];
        super::with_job(&mut d.payload, &fields);
        assert_eq!(
            d.payload,
            json!({"rq_job_id": "j1", "rq_job": {"status": "queued", "data": {"base64": "eJz/AA=="}}})
        );
    }

    #[test]
    fn custom_job_id() {
        let d = decode(&Format::Rq, "report_2024-04_é".as_bytes());
        assert_eq!(d.key, KeySource::Id("report_2024-04_é".into()));
    }

    #[test]
    fn bad_ids_are_flagged_and_kept() {
        for item in [
            &b""[..],
            b"\xff\xfe2c7b",
            b"id with spaces",
            b"id\n",
            b"a\x00b",
            br#"{"class":"Archive","args":[]}"#,
        ] {
            let d = decode(&Format::Rq, item);
            assert!(d.flagged.is_some(), "{:?}", String::from_utf8_lossy(item));
            assert!(d.key.is_content_hash());
            assert_eq!(original_from_payload(&d.payload).as_deref(), Some(item));
        }
    }
}
