//! The `celery` format: a Celery message as kombu's Redis transport pushes
//! it, a JSON envelope
//! `{"body", "content-encoding", "content-type", "headers", "properties"}`
//! whose `body` is usually base64 (`properties.body_encoding == "base64"`).
//!
//! Payload shape: `{"envelope": <the envelope as parsed, body still encoded>,
//! "body": <the decoded body as JSON, or null>}`. The envelope is kept whole
//! so nothing the worker reads is lost; `body` is there so the task's
//! arguments can be read and queried without decoding base64 in SQL. It is
//! null when the body is not JSON (a pickle, yaml or msgpack serializer, or
//! bytes that do not parse) or holds a NUL character (jsonb cannot store
//! one); the envelope still holds it.

use std::borrow::Cow;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::{holds_nul, non_empty_str, Flag, KeySource, Parts};

/// Key = `headers.id` (protocol 2), else the body's `id` (protocol 1, whose
/// headers carry no id); kind = `headers.task`, else the body's `task`.
pub(super) fn decode(item: &[u8]) -> Result<Parts, Flag> {
    let envelope: Value = serde_json::from_slice(item).map_err(|_| "celery: not valid JSON")?;
    let fields = envelope.as_object().ok_or("celery: not a JSON object")?;
    let body_text = fields
        .get("body")
        .and_then(Value::as_str)
        .ok_or("celery: no body string")?;
    let empty = Map::new();
    let headers =
        object_or_empty(fields.get("headers"), &empty).ok_or("celery: headers is not an object")?;
    let properties = object_or_empty(fields.get("properties"), &empty)
        .ok_or("celery: properties is not an object")?;

    let body_bytes: Cow<'_, [u8]> = match properties.get("body_encoding") {
        None | Some(Value::Null) => Cow::Borrowed(body_text.as_bytes()),
        Some(Value::String(enc)) if enc == "base64" => Cow::Owned(
            BASE64
                .decode(body_text)
                .map_err(|_| "celery: body is not valid base64")?,
        ),
        // kombu registers no other body codec: a worker could not read it.
        Some(_) => return Err("celery: unknown body_encoding"),
    };
    let body = if is_json(fields.get("content-type")) {
        serde_json::from_slice::<Value>(&body_bytes).ok()
    } else {
        None
    };

    // Protocol 1 bodies are a dict holding id and task; protocol 2 bodies are
    // an [args, kwargs, embed] array and the ids live in the headers.
    let body_field = |name| non_empty_str(body.as_ref()?.get(name));
    let key = non_empty_str(headers.get("id"))
        .or_else(|| body_field("id"))
        .ok_or("celery: no task id in headers or body")?
        .to_string();
    let kind = non_empty_str(headers.get("task"))
        .or_else(|| body_field("task"))
        .map(str::to_string);

    // A body holding U+0000 cannot be stored as jsonb. Leave it out rather
    // than flag the message: the envelope still carries it, and the task id
    // stays the key the Redis side reports outcomes under.
    let body = body.filter(|body| !holds_nul(body));
    Ok(Parts {
        key: KeySource::Id(key),
        kind,
        payload: json!({ "envelope": envelope, "body": body }),
    })
}

/// The job priority of a decoded Celery payload: kombu's Redis transport
/// runs a lower `properties.priority` first (0 before 9), qbridge a larger
/// priority first, so it is the negated message priority (0 when absent).
pub(super) fn job_priority(payload: &Value) -> i32 {
    payload
        .pointer("/envelope/properties/priority")
        .and_then(Value::as_i64)
        .map_or(0, |p| -(p.clamp(0, 255) as i32))
}

/// The message's `eta` header (ISO 8601, as Celery writes it; one without
/// an offset read as UTC, Celery's default `timezone`); `None` when absent,
/// null or not a time.
pub(super) fn eta(payload: &Value) -> Option<chrono::DateTime<chrono::Utc>> {
    let text = payload.pointer("/envelope/headers/eta")?.as_str()?;
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&chrono::Utc));
    }
    text.parse::<chrono::NaiveDateTime>()
        .ok()
        .map(|t| t.and_utc())
}

/// The member as an object; a missing or null member as `empty` (kombu
/// always writes both, but hand-rolled producers may not); `None` if it is
/// something else.
fn object_or_empty<'a>(
    value: Option<&'a Value>,
    empty: &'a Map<String, Value>,
) -> Option<&'a Map<String, Value>> {
    match value {
        None | Some(Value::Null) => Some(empty),
        Some(Value::Object(map)) => Some(map),
        Some(_) => None,
    }
}

/// True when the body is declared JSON (or undeclared, as with producers
/// that only ever send JSON); other serializers are not parsed, so a pickle
/// that happens to look like JSON is not mistaken for it.
fn is_json(content_type: Option<&Value>) -> bool {
    match content_type {
        None | Some(Value::Null) => true,
        Some(Value::String(ct)) => ct
            .split(';')
            .next()
            .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json")),
        Some(_) => false,
    }
}

#[cfg(test)]
mod priority_tests {
    use serde_json::json;

    #[test]
    fn a_lower_celery_priority_runs_first() {
        let at = |p: serde_json::Value| {
            super::job_priority(&json!({"envelope": {"properties": {"priority": p}}}))
        };
        assert!(at(json!(0)) > at(json!(3)));
        assert_eq!(at(json!(9)), -9);
        assert_eq!(at(json!(null)), 0);
        assert_eq!(super::job_priority(&json!({"body": null})), 0);
    }

    #[test]
    fn eta_is_the_header_as_celery_writes_it() {
        let at =
            |eta: serde_json::Value| super::eta(&json!({"envelope": {"headers": {"eta": eta}}}));
        let got = at(json!("2026-11-26T10:00:00.250000+00:00")).unwrap();
        assert_eq!(got.to_rfc3339(), "2026-11-26T10:00:00.250+00:00");
        let naive = at(json!("2026-11-26T10:00:00.250000")).unwrap();
        assert_eq!(naive, got, "an eta without an offset is UTC");
        assert_eq!(at(json!(null)), None);
        assert_eq!(at(json!("tomorrow")), None);
    }
}

#[cfg(test)]
mod tests {
    use crate::model::formats::{decode, original_from_payload, Format, KeySource};
    use serde_json::json;

    /// `add.delay(2, 3)` with Celery 5 (task protocol 2) as kombu 5 pushes it:
    /// `json.dumps` spacing, body base64 of
    /// `[[2, 3], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`.
    const PROTOCOL_2: &[u8] = br#"{"body": "W1syLCAzXSwge30sIHsiY2FsbGJhY2tzIjogbnVsbCwgImVycmJhY2tzIjogbnVsbCwgImNoYWluIjogbnVsbCwgImNob3JkIjogbnVsbH1d", "content-encoding": "utf-8", "content-type": "application/json", "headers": {"lang": "py", "task": "proj.tasks.add", "id": "d0b5a1f2-3c4e-4b6a-9f8e-7a6b5c4d3e2f", "shadow": null, "eta": null, "expires": null, "group": null, "group_index": null, "retries": 0, "timelimit": [null, null], "root_id": "d0b5a1f2-3c4e-4b6a-9f8e-7a6b5c4d3e2f", "parent_id": null, "argsrepr": "(2, 3)", "kwargsrepr": "{}", "origin": "gen4242@worker-1", "ignore_result": false, "replaced_task_nesting": 0, "stamped_headers": null, "stamps": {}}, "properties": {"correlation_id": "d0b5a1f2-3c4e-4b6a-9f8e-7a6b5c4d3e2f", "reply_to": "8d7c6b5a-4e3f-4a2b-9c1d-0e9f8a7b6c5d", "delivery_mode": 2, "delivery_info": {"exchange": "", "routing_key": "celery"}, "priority": 0, "body_encoding": "base64", "delivery_tag": "6a1e2f3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b"}}"#;

    /// The same call with task protocol 1 (`task_protocol = 1`): empty
    /// headers, id and task inside the base64 body.
    const PROTOCOL_1: &[u8] = br#"{"body": "eyJ0YXNrIjogInByb2oudGFza3MuYWRkIiwgImlkIjogIjljNGY4ZTJhLTFiM2QtNGU1Zi04YTZiLTdjOGQ5ZTBmMWEyYiIsICJhcmdzIjogWzIsIDNdLCAia3dhcmdzIjoge30sICJncm91cCI6IG51bGwsICJyZXRyaWVzIjogMCwgImV0YSI6IG51bGwsICJleHBpcmVzIjogbnVsbCwgInV0YyI6IHRydWUsICJjYWxsYmFja3MiOiBudWxsLCAiZXJyYmFja3MiOiBudWxsLCAidGltZWxpbWl0IjogW251bGwsIG51bGxdLCAidGFza3NldCI6IG51bGwsICJjaG9yZCI6IG51bGx9", "content-encoding": "utf-8", "content-type": "application/json", "headers": {}, "properties": {"correlation_id": "9c4f8e2a-1b3d-4e5f-8a6b-7c8d9e0f1a2b", "reply_to": "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9", "delivery_mode": 2, "delivery_info": {"exchange": "celery", "routing_key": "celery"}, "priority": 0, "body_encoding": "base64", "delivery_tag": "0a9b8c7d-6e5f-4a3b-2c1d-0e9f8a7b6c5d"}}"#;

    #[test]
    fn protocol_2_key_kind_and_decoded_body() {
        let d = decode(&Format::Celery, PROTOCOL_2);
        assert_eq!(d.flagged, None);
        assert_eq!(
            d.key,
            KeySource::Id("d0b5a1f2-3c4e-4b6a-9f8e-7a6b5c4d3e2f".into())
        );
        assert_eq!(d.kind.as_deref(), Some("proj.tasks.add"));
        assert_eq!(
            d.payload["body"],
            json!([[2, 3], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}])
        );
        assert_eq!(
            d.payload["envelope"]["properties"]["delivery_info"]["routing_key"],
            json!("celery")
        );
        // The envelope keeps the body exactly as pushed (still base64).
        assert!(d.payload["envelope"]["body"]
            .as_str()
            .is_some_and(|b| b.starts_with("W1sy")));
        assert_eq!(&d.original[..], PROTOCOL_2);
        assert_eq!(original_from_payload(&d.payload), None);
    }

    #[test]
    fn protocol_1_falls_back_to_the_body() {
        let d = decode(&Format::Celery, PROTOCOL_1);
        assert_eq!(d.flagged, None);
        assert_eq!(
            d.key,
            KeySource::Id("9c4f8e2a-1b3d-4e5f-8a6b-7c8d9e0f1a2b".into())
        );
        assert_eq!(d.kind.as_deref(), Some("proj.tasks.add"));
        assert_eq!(d.payload["body"]["args"], json!([2, 3]));
        assert_eq!(&d.original[..], PROTOCOL_1);
    }

    #[test]
    fn unencoded_json_body_is_parsed_as_is() {
        let item = br#"{"body":"[[1],{},{}]","headers":{"id":"t-1","task":"app.ping"},"properties":{},"content-type":"application/json; charset=utf-8"}"#;
        let d = decode(&Format::Celery, item);
        assert_eq!(d.flagged, None);
        assert_eq!(d.key, KeySource::Id("t-1".into()));
        assert_eq!(d.payload["body"], json!([[1], {}, {}]));
    }

    #[test]
    fn pickle_body_keeps_key_and_a_null_body() {
        // base64 of a pickle prefix (\x80\x04\x95...), content-type pickle.
        let item = br#"{"body":"gASVAAAAAAAAAAA=","content-type":"application/x-python-serialize","content-encoding":"binary","headers":{"id":"t-2","task":"app.legacy"},"properties":{"body_encoding":"base64"}}"#;
        let d = decode(&Format::Celery, item);
        assert_eq!(d.flagged, None);
        assert_eq!(d.key, KeySource::Id("t-2".into()));
        assert_eq!(d.kind.as_deref(), Some("app.legacy"));
        assert_eq!(d.payload["body"], json!(null));
    }

    #[test]
    fn body_with_nul_keeps_the_task_id() {
        // base64 of `[["a\u0000b"], {}, {}]`
        let item = br#"{"body":"W1siYVx1MDAwMGIiXSwge30sIHt9XQ==","content-type":"application/json","headers":{"id":"t-3","task":"app.echo"},"properties":{"body_encoding":"base64"}}"#;
        let d = decode(&Format::Celery, item);
        assert_eq!(d.flagged, None);
        assert_eq!(d.key, KeySource::Id("t-3".into()));
        assert_eq!(d.payload["body"], json!(null));
        // Protocol 1 still finds its id in a body it cannot store.
        let item = br#"{"body":"eyJ0YXNrIjogImFwcC5lY2hvIiwgImlkIjogInQtNCIsICJhcmdzIjogWyJhXHUwMDAwYiJdLCAia3dhcmdzIjoge319","headers":{},"properties":{"body_encoding":"base64"}}"#;
        let d = decode(&Format::Celery, item);
        assert_eq!(d.flagged, None);
        assert_eq!(d.key, KeySource::Id("t-4".into()));
        assert_eq!(d.kind.as_deref(), Some("app.echo"));
        assert_eq!(d.payload["body"], json!(null));
    }

    #[test]
    fn broken_messages_are_flagged_and_kept() {
        for item in [
            // base64 declared but the body is not base64
            &br#"{"body":"%%%","headers":{"id":"t"},"properties":{"body_encoding":"base64"}}"#[..],
            // protocol 1 body without an id
            br#"{"body":"{\"task\":\"x\"}","headers":{},"properties":{}}"#,
            // an unknown body codec
            br#"{"body":"x","headers":{"id":"t"},"properties":{"body_encoding":"rot13"}}"#,
            br#"{"body":"x","headers":["id"]}"#,
            // a Sidekiq job on a Celery route
            br#"{"class":"HardWorker","args":[],"jid":"b4a577edbccf1d805744efa2"}"#,
            b"\x80\x04\x95",
        ] {
            let d = decode(&Format::Celery, item);
            assert!(d.flagged.is_some(), "{:?}", String::from_utf8_lossy(item));
            assert!(d.key.is_content_hash());
            assert_eq!(original_from_payload(&d.payload).as_deref(), Some(item));
        }
    }
}
