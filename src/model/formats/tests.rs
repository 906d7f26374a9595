//! Tests across formats: format names, the never-fails and byte-exact
//! guarantees (property tests), and payload recovery.

use proptest::prelude::*;
use serde_json::json;

use super::*;

fn all_formats() -> Vec<Format> {
    vec![
        Format::json("/id").expect("valid pointer"),
        Format::Sidekiq,
        Format::Celery,
        Format::Resque,
        Format::Rq,
        Format::Raw,
    ]
}

#[test]
fn names_parse_and_print_back() {
    for text in [
        "json:/id",
        "json:/meta/job~1id",
        "sidekiq",
        "celery",
        "resque",
        "rq",
        "raw",
    ] {
        let format: Format = text.parse().expect(text);
        assert_eq!(format.to_string(), text);
    }
    assert_eq!(
        "json:/id".parse::<Format>(),
        Ok(Format::Json {
            key_pointer: "/id".into()
        })
    );
    assert_eq!(Format::json("/id").map(|f| f.name()), Ok("json"));
}

#[test]
fn bad_names_and_pointers_are_config_errors() {
    assert_eq!(
        "json".parse::<Format>(),
        Err(FormatError::MissingKeyPointer)
    );
    assert!(matches!(
        "Sidekiq".parse::<Format>(),
        Err(FormatError::Unknown(_))
    ));
    assert!(matches!(
        "json:id".parse::<Format>(),
        Err(FormatError::InvalidKeyPointer { .. })
    ));
    assert!(matches!(
        "json:".parse::<Format>(),
        Err(FormatError::InvalidKeyPointer { .. })
    ));
    assert!(matches!(
        Format::json("/a~2"),
        Err(FormatError::InvalidKeyPointer { .. })
    ));
    assert!(matches!(
        Format::json("/a~"),
        Err(FormatError::InvalidKeyPointer { .. })
    ));
    assert_eq!(
        Format::from_parts("rq", Some("/id")),
        Err(FormatError::UnexpectedKeyPointer("rq"))
    );
    assert_eq!(
        Format::from_parts("json", Some("/job_id")),
        Format::json("/job_id")
    );
}

#[test]
fn serde_uses_the_text_form() {
    let formats: Vec<Format> =
        serde_json::from_value(json!(["json:/id", "celery"])).expect("parses");
    assert_eq!(formats[1], Format::Celery);
    assert_eq!(
        serde_json::to_value(&formats[0]).ok(),
        Some(json!("json:/id"))
    );
    assert!(serde_json::from_value::<Format>(json!("json")).is_err());
}

#[test]
fn debug_never_shows_the_payload() {
    let d = decode(&Format::Raw, b"card=4111111111111111");
    let shown = format!("{d:?}");
    assert!(!shown.contains("4111"), "{shown}");
    assert!(!shown.contains("Y2FyZD"), "{shown}");
    assert!(shown.contains("original_len: 21"), "{shown}");
}

#[test]
fn encode_original_is_the_item_bytes() {
    let item = br#"{ "retry": true, "class": "W", "args": [], "jid": "j" }"#;
    let d = decode(&Format::Sidekiq, item);
    assert_eq!(d.flagged, None);
    assert_eq!(encode_original(&d), item);
}

#[test]
fn decode_bytes_keeps_the_buffer() {
    let item = Bytes::from_static(b"2c7b5e0e");
    let d = decode_bytes(&Format::Rq, item.clone());
    assert_eq!(d.original.as_ptr(), item.as_ptr());
}

#[test]
fn flagged_payload_shape() {
    let d = decode(&Format::Sidekiq, b"\xffnope");
    let reason = d.flagged.clone().expect("flagged");
    assert_eq!(d.payload, json!({"raw_b64": "/25vcGU=", "flagged": reason}));
    assert_eq!(d.key, content_hash(b"\xffnope"));
}

#[test]
fn payload_recovery_only_accepts_the_raw_shape() {
    assert_eq!(
        original_from_payload(&json!({"raw_b64": "aGk="})),
        Some(b"hi".to_vec())
    );
    assert_eq!(
        original_from_payload(&json!({"raw_b64": "aGk=", "flagged": "x"})),
        Some(b"hi".to_vec())
    );
    // A JSON job that merely has a raw_b64 member is not a raw payload.
    assert_eq!(
        original_from_payload(&json!({"id": 1, "raw_b64": "aGk="})),
        None
    );
    assert_eq!(original_from_payload(&json!({"raw_b64": "!!"})), None);
    assert_eq!(original_from_payload(&json!({"raw_b64": 1})), None);
    assert_eq!(original_from_payload(&json!({"rq_job_id": "x"})), None);
    assert_eq!(original_from_payload(&json!("aGk=")), None);
}

#[test]
fn flag_reasons_never_quote_the_item() {
    let secret = "hunter2-secret";
    let items = [
        format!(r#"{{"password":"{secret}"}}"#),
        format!(r#"{{"id":"{secret}\u0000"}}"#),
        format!("{secret} {secret}"),
        format!(r#"{{"body":"{secret}","properties":{{"body_encoding":"base64"}}}}"#),
    ];
    for format in all_formats() {
        for item in &items {
            let d = decode(&format, item.as_bytes());
            if let Some(reason) = &d.flagged {
                assert!(!reason.contains(secret), "{format}: {reason}");
            }
        }
    }
}

/// Checks the guarantees every decoded item keeps, whatever its format.
fn assert_invariants(format: &Format, item: &[u8], d: &Decoded) {
    assert_eq!(&d.original[..], item, "{format}: original changed");
    assert_eq!(encode_original(d), item);
    assert!(!holds_nul(&d.payload), "{format}: payload not storable");
    if d.flagged.is_some() || *format == Format::Raw {
        assert_eq!(d.key, content_hash(item));
        assert_eq!(d.kind, None);
        assert_eq!(original_from_payload(&d.payload).as_deref(), Some(item));
    }
    if let KeySource::Id(id) = &d.key {
        assert!(!id.is_empty() && id.len() <= MAX_FIELD_LEN && !id.contains('\0'));
    }
}

/// Strings that stress JSON escaping: quotes, backslashes, controls, NUL,
/// non-ASCII and astral characters.
fn tricky_string() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just('"'),
            Just('\\'),
            Just('\0'),
            Just('\n'),
            Just('é'),
            Just('😀'),
            any::<char>(),
            prop::char::range('a', 'z'),
        ],
        0..24,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_and_round_trip(
        item in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        for format in all_formats() {
            let d = decode(&format, &item);
            assert_invariants(&format, &item, &d);
        }
        let raw = decode(&Format::Raw, &item);
        prop_assert_eq!(original_from_payload(&raw.payload), Some(item.clone()));
    }

    #[test]
    fn json_shaped_items_keep_their_ids(jid in tricky_string(), class in tricky_string()) {
        let job = json!({"class": class, "args": [jid.clone()], "jid": jid, "queue": "q"});
        let item = serde_json::to_vec(&job).expect("serializes");
        for format in all_formats() {
            let d = decode(&format, &item);
            assert_invariants(&format, &item, &d);
        }
        let d = decode(&Format::Sidekiq, &item);
        if d.flagged.is_none() {
            prop_assert_eq!(d.key, KeySource::Id(jid.clone()));
            prop_assert_eq!(d.kind, Some(class.clone()));
        } else {
            // Only unusable ids or NULs (which jsonb cannot hold) are flagged.
            prop_assert!(jid.is_empty() || class.is_empty() || jid.contains('\0') || class.contains('\0'));
        }
    }

    #[test]
    fn celery_envelopes_with_any_body_bytes(
        body in prop::collection::vec(any::<u8>(), 0..128),
        id in "[a-f0-9-]{1,36}",
    ) {
        use base64::engine::general_purpose::STANDARD;
        use base64::Engine as _;
        let envelope = json!({
            "body": STANDARD.encode(&body),
            "content-type": "application/json",
            "headers": {"id": id, "task": "t"},
            "properties": {"body_encoding": "base64"},
        });
        let item = serde_json::to_vec(&envelope).expect("serializes");
        let d = decode(&Format::Celery, &item);
        assert_invariants(&Format::Celery, &item, &d);
        if d.flagged.is_none() {
            prop_assert_eq!(d.key, KeySource::Id(id));
        }
    }

    /// Any format text (a name, `json:` with any pointer) is a format or a
    /// one-line error; a `json:<pointer>` format then keys arbitrary items
    /// without panicking and keeps their bytes.
    #[test]
    fn any_format_text_is_a_format_or_a_one_line_error(
        text in prop_oneof![
            any::<String>(),
            "json:[/~0-9a-z\\n\"]{0,12}",
            "(json|sidekiq|celery|resque|rq|raw|Sidekiq|json:)",
        ],
        item in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        match text.parse::<Format>() {
            Ok(format) => {
                let d = decode(&format, &item);
                assert_invariants(&format, &item, &d);
            }
            Err(e) => {
                let message = e.to_string();
                prop_assert!(!message.contains(['\r', '\n']), "{:?}", message);
            }
        }
    }

    /// JSON items whose key sits at an arbitrary (valid) pointer: found when
    /// it is a usable string, otherwise the item is stored raw and flagged.
    #[test]
    fn keys_at_arbitrary_pointers(
        path in prop::collection::vec("[a-z~/0-9]{1,6}", 1..4),
        id in tricky_string(),
    ) {
        let pointer: String = path
            .iter()
            .map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1")))
            .collect();
        let format = Format::json(&pointer).expect("escaped pointer is valid");
        let mut doc = json!(id.clone());
        for p in path.iter().rev() {
            doc = json!({ p.as_str(): doc });
        }
        let item = serde_json::to_vec(&doc).expect("serializes");
        let d = decode(&format, &item);
        assert_invariants(&format, &item, &d);
        if d.flagged.is_none() {
            prop_assert_eq!(d.key, KeySource::Id(id));
        }
    }
}

#[test]
fn attempts_so_far_come_from_the_frameworks_retry_counters() {
    use super::attempts_so_far;
    let sidekiq: Format = "sidekiq".parse().unwrap();
    let retried = serde_json::json!({"jid": "a", "retry_count": 2, "class": "Mail"});
    assert_eq!(attempts_so_far(&sidekiq, &retried), Some(3));
    let fresh = serde_json::json!({"jid": "a", "class": "Mail"});
    assert_eq!(attempts_so_far(&sidekiq, &fresh), None);
    let celery: Format = "celery".parse().unwrap();
    let twice = serde_json::json!({"envelope": {"headers": {"retries": 2}}});
    assert_eq!(attempts_so_far(&celery, &twice), Some(2));
    let first = serde_json::json!({"envelope": {"headers": {"retries": 0}}});
    assert_eq!(attempts_so_far(&celery, &first), None);
    assert_eq!(attempts_so_far(&"resque".parse().unwrap(), &retried), None);
}

#[test]
fn a_key_names_the_bytes_of_its_id_or_text_only() {
    let text = KeySource::ContentHash("ab12".into());
    assert!(text.names("sha256:ab12:1"));
    assert!(text.names("sha256:ab12:pg3"));
    assert!(!text.names("sha256:ab123:1"), "another text's hash");
    assert!(!text.names("sha256:ab1:1"));
    assert!(!text.names("ab12"));
    let id = KeySource::Id("job-1".into());
    assert!(id.names("job-1"));
    assert!(!id.names("job-10"));
}
