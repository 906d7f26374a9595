//! The layout of framework structures per route: which keys a route owns.

use super::*;

/// Sidekiq's scores carry microseconds (Ruby's Float#to_s of
/// `Time.now.to_f + interval`); they were once cut to milliseconds.
#[test]
fn a_score_is_a_time_to_the_microsecond() {
    let at = score_time(1_795_893_361.260_772_7).unwrap();
    assert_eq!(at.timestamp_micros(), 1_795_893_361_260_773);
    assert_eq!(score_time(1.5).unwrap().timestamp_micros(), 1_500_000);
    assert_eq!(score_time(f64::NAN), None);
    assert_eq!(score_time(f64::INFINITY), None);
    assert_eq!(score_time(1e300), None);
}

#[test]
fn sidekiq_queues_own_their_members_of_the_shared_sets() {
    let sets = of_route(&Format::Sidekiq, b"queue:mailers", &KeyNames::default());
    let keys: Vec<&str> = sets.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "schedule",
            "retry",
            "dead",
            "queue:sq|*|mailers",
            "working:queue:mailers:*"
        ]
    );
    assert!(sets[3].owns(b"anything") && !sets[3].carried());
    let odd = of_route(&Format::Sidekiq, b"queue:a*b", &KeyNames::default());
    assert_eq!(odd[4].key, "working:queue:a\\*b:*");
    assert!(sets[0].owns(br#"{"class":"Mail","queue":"mailers","jid":"a"}"#));
    assert!(!sets[0].owns(br#"{"class":"Mail","queue":"default","jid":"b"}"#));
    assert!(!sets[0].owns(b"not json"));
}

#[test]
fn a_namespace_prefixes_the_sets_and_other_keys_have_none() {
    let sets = of_route(&Format::Sidekiq, b"app:queue:default", &KeyNames::default());
    assert_eq!(sets[1].key, "app:retry");
    assert_eq!(sets[1].queue, "default");
    assert!(of_route(&Format::Sidekiq, b"jobs", &KeyNames::default()).is_empty());
    assert!(of_route(&Format::Sidekiq, b"myqueue:x", &KeyNames::default()).is_empty());
    assert!(of_route(&Format::Raw, b"queue:default", &KeyNames::default()).is_empty());
}

#[test]
fn rq_queues_have_their_own_scheduled_and_failed_registries() {
    let sets = of_route(&Format::Rq, b"rq:queue:reports", &KeyNames::default());
    let keys: Vec<&str> = sets.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["rq:scheduled:reports", "rq:failed:reports"]);
    assert!(sets[0].owns(b"any-job-id"));
    assert!(of_route(&Format::Rq, b"reports", &KeyNames::default()).is_empty());
}

#[test]
fn resque_failed_entries_are_the_queues_until_requeued() {
    let sets = of_route(&Format::Resque, b"resque:queue:mail", &KeyNames::default());
    let keys: Vec<&str> = sets.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["resque:delayed_queue_schedule", "resque:failed"]);
    let failed = &sets[1];
    assert_eq!(failed.shape, Shape::List);
    assert!(failed.owns(br#"{"payload":{"class":"M","args":[]},"queue":"mail","failed_at":"x"}"#));
    assert!(!failed.owns(
        br#"{"payload":{"class":"M","args":[]},"queue":"mail","retried_at":"2026/11/26 01:00:00"}"#
    ));
    assert!(!failed.owns(br#"{"payload":{},"queue":"other"}"#));
    assert!(!sets[0].carried() && failed.carried());
    assert_eq!(
        sets[0].shape,
        Shape::DelayedIndex {
            lists: "resque:delayed:".into()
        }
    );
    assert!(sets[0].owns(br#"{"class":"M","args":[1],"queue":"mail"}"#));
}

#[test]
fn celery_entries_taken_by_a_worker_are_owned_by_routing_key() {
    let sets = of_route(&Format::Celery, b"reports", &KeyNames::default());
    assert_eq!(sets.len(), 1);
    let unacked = &sets[0];
    assert_eq!(unacked.holding, Holding::Held);
    assert!(unacked.owns(br#"[{"body":"e30="}, "", "reports"]"#));
    assert!(!unacked.owns(br#"[{"body":"e30="}, "", "celery"]"#));
    assert!(!unacked.owns(b"not json"));
    assert!(!unacked.carried());
}
