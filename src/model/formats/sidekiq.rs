//! The `sidekiq` format: the job hash Sidekiq pushes as JSON onto
//! `queue:<name>` (`jid`, `class`, `args`, `queue`, `retry`, `created_at`,
//! `enqueued_at`, …).

use serde_json::Value;

use super::{non_empty_str, Flag, KeySource, Parts};

/// Classes Sidekiq runs on behalf of ActiveJob. Their `class` is the same for
/// every job, so the real job class (in `wrapped`) is the useful kind. The
/// first name is what Rails' adapter and Sidekiq's own up to 7.3 push; from
/// Sidekiq 8.0 jobs name the second (the first stays an alias of it).
const ACTIVE_JOB_WRAPPERS: [&str; 2] = [
    "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper",
    "Sidekiq::ActiveJob::Wrapper",
];

/// Key = `jid`; kind = `class`, or the wrapped ActiveJob class; payload = the
/// job hash as parsed (queue, class and args untouched).
pub(super) fn decode(item: &[u8]) -> Result<Parts, Flag> {
    let payload: Value = serde_json::from_slice(item).map_err(|_| "sidekiq: not valid JSON")?;
    let job = payload.as_object().ok_or("sidekiq: not a JSON object")?;
    // Sidekiq itself refuses to push a job without both.
    let jid = non_empty_str(job.get("jid")).ok_or("sidekiq: no jid string")?;
    let class = non_empty_str(job.get("class")).ok_or("sidekiq: no class string")?;
    let kind = if ACTIVE_JOB_WRAPPERS.contains(&class) {
        // Older producers may lack `wrapped`; the ActiveJob payload in the
        // first argument names the class too (as Sidekiq's web UI reads it).
        non_empty_str(job.get("wrapped"))
            .or_else(|| non_empty_str(job.get("args")?.get(0)?.get("job_class")))
            .unwrap_or(class)
    } else {
        class
    };
    Ok(Parts {
        key: KeySource::Id(jid.to_string()),
        kind: Some(kind.to_string()),
        payload,
    })
}

#[cfg(test)]
mod tests {
    use crate::model::formats::{decode, Format, KeySource};
    use serde_json::json;

    /// A plain Sidekiq job as `Sidekiq::Client#push` writes it.
    const JOB: &[u8] = br#"{"retry":true,"queue":"default","class":"HardWorker","args":[1234,"bob@example.com",{"notify":true}],"jid":"b4a577edbccf1d805744efa2","created_at":1712345678.123456,"enqueued_at":1712345678.1239}"#;

    /// A Rails mailer delivery through the ActiveJob adapter.
    const ACTIVE_JOB: &[u8] = br#"{"retry":true,"queue":"mailers","class":"ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper","wrapped":"ActionMailer::MailDeliveryJob","args":[{"job_class":"ActionMailer::MailDeliveryJob","job_id":"5f0d6a3e-0a4b-4f2a-9a57-2d3b1f8c9e10","provider_job_id":null,"queue_name":"mailers","priority":null,"arguments":["UserMailer","welcome","deliver_now",{"args":[{"_aj_globalid":"gid://shop/User/42"}],"_aj_ruby2_keywords":["args"]}],"executions":0,"exception_executions":{},"locale":"en","timezone":"UTC","enqueued_at":"2024-04-05T12:34:56.789012345Z","scheduled_at":null}],"jid":"0f3a1c2b4d5e6f708192a3b4","created_at":1712320496.789,"enqueued_at":1712320496.79}"#;

    #[test]
    fn plain_job() {
        let d = decode(&Format::Sidekiq, JOB);
        assert_eq!(d.flagged, None);
        assert_eq!(d.key, KeySource::Id("b4a577edbccf1d805744efa2".into()));
        assert_eq!(d.kind.as_deref(), Some("HardWorker"));
        assert_eq!(d.payload["queue"], json!("default"));
        assert_eq!(
            d.payload["args"],
            json!([1234, "bob@example.com", {"notify": true}])
        );
        assert_eq!(d.payload["retry"], json!(true));
        assert_eq!(&d.original[..], JOB);
    }

    #[test]
    fn active_job_kind_is_the_wrapped_class() {
        let d = decode(&Format::Sidekiq, ACTIVE_JOB);
        assert_eq!(d.flagged, None);
        assert_eq!(d.key, KeySource::Id("0f3a1c2b4d5e6f708192a3b4".into()));
        assert_eq!(d.kind.as_deref(), Some("ActionMailer::MailDeliveryJob"));
        assert_eq!(
            d.payload["class"],
            json!("ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper")
        );
    }

    /// A Rails mailer delivery as Sidekiq 8.0's ActiveJob adapter pushes it:
    /// the wrapper's new name and integer-millisecond times.
    #[test]
    fn sidekiq_8_active_job_kind_is_the_wrapped_class() {
        let item = br#"{"retry":true,"queue":"mailers","class":"Sidekiq::ActiveJob::Wrapper","wrapped":"ActionMailer::MailDeliveryJob","args":[{"job_class":"ActionMailer::MailDeliveryJob","job_id":"7c1e","arguments":["UserMailer","welcome","deliver_now"],"executions":0}],"jid":"9a8b7c6d5e4f3a2b1c0d9e8f","created_at":1764355200123,"enqueued_at":1764355200125}"#;
        let d = decode(&Format::Sidekiq, item);
        assert_eq!(d.flagged, None);
        assert_eq!(d.key, KeySource::Id("9a8b7c6d5e4f3a2b1c0d9e8f".into()));
        assert_eq!(d.kind.as_deref(), Some("ActionMailer::MailDeliveryJob"));
        assert_eq!(d.payload["created_at"], json!(1764355200123_i64));
        assert_eq!(&d.original[..], &item[..]);
    }

    #[test]
    fn wrapper_without_wrapped_falls_back_to_job_class() {
        let item = br#"{"class":"Sidekiq::ActiveJob::Wrapper","args":[{"job_class":"CleanupJob","arguments":[]}],"jid":"j1","queue":"low"}"#;
        let d = decode(&Format::Sidekiq, item);
        assert_eq!(d.kind.as_deref(), Some("CleanupJob"));
        let bare = br#"{"class":"Sidekiq::ActiveJob::Wrapper","args":[],"jid":"j2"}"#;
        let d = decode(&Format::Sidekiq, bare);
        assert_eq!(d.kind.as_deref(), Some("Sidekiq::ActiveJob::Wrapper"));
    }

    #[test]
    fn wrong_format_items_are_flagged_and_kept() {
        for item in [
            &br#"{"class":"Archive","args":[35,"tar"]}"#[..], // resque: no jid
            br#"{"jid":"abc","args":[]}"#,                    // no class
            br#"{"jid":42,"class":"W","args":[]}"#,           // jid not a string
            br#"["HardWorker",1]"#,
            b"2c7b5e0e-4f6a-4c1d-9b1e-3a8f5d6c7b9a",
            b"\x00\x01",
        ] {
            let d = decode(&Format::Sidekiq, item);
            assert!(d.flagged.is_some());
            assert!(d.key.is_content_hash());
            assert_eq!(d.kind, None);
            assert_eq!(&d.original[..], item);
        }
    }

    #[test]
    fn nul_in_args_is_kept_raw_because_jsonb_cannot_hold_it() {
        let item = br#"{"class":"W","args":["a\u0000b"],"jid":"j3"}"#;
        let d = decode(&Format::Sidekiq, item);
        assert!(d.flagged.as_deref().is_some_and(|r| r.contains("NUL")));
        assert!(d.payload["raw_b64"].is_string());
    }

    #[test]
    fn overlong_jid_is_flagged() {
        let item = format!(r#"{{"class":"W","args":[],"jid":"{}"}}"#, "j".repeat(2000));
        let d = decode(&Format::Sidekiq, item.as_bytes());
        assert!(d.flagged.is_some());
        assert!(d.key.is_content_hash());
    }
}
