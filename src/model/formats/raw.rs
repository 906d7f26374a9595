//! The `raw` format, and the raw form of flagged items: any bytes, kept as
//! base64 so they survive jsonb untouched (jsonb holds only valid UTF-8
//! without NUL; base64 text is always both).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{json, Value};

use super::{content_hash, Flag, Parts};

/// Payload member holding the item bytes as standard, padded base64.
pub(super) const RAW_FIELD: &str = "raw_b64";
/// Payload member holding why an item was stored raw.
pub(super) const FLAGGED_FIELD: &str = "flagged";

/// Key = content hash (raw items carry no id); payload = `{"raw_b64": …}`.
pub(super) fn decode(item: &[u8]) -> Parts {
    Parts {
        key: content_hash(item),
        kind: None,
        payload: json!({ RAW_FIELD: BASE64.encode(item) }),
    }
}

/// The payload of an item that did not parse as its format:
/// `{"raw_b64": …, "flagged": reason}`.
pub(super) fn flagged_payload(item: &[u8], reason: Flag) -> Value {
    json!({ RAW_FIELD: BASE64.encode(item), FLAGGED_FIELD: reason })
}

#[cfg(test)]
mod tests {
    use crate::model::formats::{decode, original_from_payload, Format, KeySource};
    use serde_json::json;

    /// Binary with invalid UTF-8 (a lone continuation byte, an overlong
    /// encoding, 0xFF) and NULs, the kind of item only `raw` can take.
    const BINARY: &[u8] = b"\x00\x80\xc0\xaf\xff\xfeMZ\x90\x00\x03\x00job\x00";

    #[test]
    fn binary_item_round_trips_through_base64() {
        let d = decode(&Format::Raw, BINARY);
        assert_eq!(d.flagged, None);
        assert_eq!(d.kind, None);
        assert_eq!(&d.original[..], BINARY);
        assert_eq!(original_from_payload(&d.payload).as_deref(), Some(BINARY));
        assert!(d.key.is_content_hash());
    }

    #[test]
    fn text_item_is_raw_too() {
        let d = decode(&Format::Raw, b"send-invoice 42");
        assert_eq!(d.payload, json!({"raw_b64": "c2VuZC1pbnZvaWNlIDQy"}));
    }

    #[test]
    fn content_hash_is_hex_sha256_of_the_bytes() {
        let d = decode(&Format::Raw, b"");
        assert_eq!(
            d.key,
            KeySource::ContentHash(
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into()
            )
        );
        assert_eq!(
            d.key.with_occurrence(1),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855:1"
        );
    }

    #[test]
    fn empty_item_is_kept() {
        let d = decode(&Format::Raw, b"");
        assert!(d.original.is_empty());
        assert_eq!(original_from_payload(&d.payload), Some(Vec::new()));
    }
}
