//! The route keys that name a framework's keys (`key_prefix`,
//! `priority_steps`, `priority_sep`, `unacked_key`, `unacked_index_key`):
//! each is refused with one line naming it where its framework has no such
//! option or where it does not fit `redis_key`, and a valid set names the
//! route's lists and structures as kombu and RQ name them.

use super::*;
use crate::model::formats::Format;
use crate::model::structures::{of_route, priority_lists, Shape};

fn celery(redis_key: &str, lines: &str) -> String {
    format!("[[routes]]\nredis_key = \"{redis_key}\"\nqueue = \"reports\"\nformat = \"celery\"\n{lines}")
}

fn rq(redis_key: &str, lines: &str) -> String {
    format!(
        "[[routes]]\nredis_key = \"{redis_key}\"\nqueue = \"reports\"\nformat = \"rq\"\n{lines}"
    )
}

#[test]
fn each_key_is_refused_with_one_line_naming_it() {
    let cases = [
        (
            format!("{ROUTE}key_prefix = \"app:\"\n"),
            "key_prefix is kombu's global_keyprefix",
        ),
        (
            celery("reports", "key_prefix = \"app1:\"\n"),
            "key_prefix \"app1:\" must begin redis_key",
        ),
        (
            celery("app1:", "key_prefix = \"app1:\"\n"),
            "must begin redis_key",
        ),
        (
            celery("reports", "key_prefix = \"\"\n"),
            "key_prefix is empty",
        ),
        (
            rq("rq:queue:reports", "key_prefix = \"app1\"\n"),
            "needs redis_key \"app1:queue:<name>\"",
        ),
        (
            rq("app 1:queue:reports", "key_prefix = \"app 1\"\n"),
            "not a prefix RQ accepts",
        ),
        (
            format!("{ROUTE}priority_sep = \":\"\n"),
            "priority_sep is kombu's transport option",
        ),
        (
            celery("reports", "priority_sep = \"\"\n"),
            "priority_sep is empty",
        ),
        (
            format!("{ROUTE}unacked_key = \"held\"\n"),
            "unacked_key is kombu's transport option",
        ),
        (
            celery("reports", "unacked_key = \"\"\n"),
            "unacked_key is empty",
        ),
        (
            rq("rq:queue:reports", "unacked_index_key = \"i\"\n"),
            "unacked_index_key is kombu's transport option",
        ),
        (
            celery("reports", "unacked_index_key = \"\"\n"),
            "unacked_index_key is empty",
        ),
        (
            rq("rq:queue:reports", "priority_steps = [0, 5]\n"),
            "priority_steps is kombu's transport option",
        ),
    ];
    for (text, expected) in cases {
        let err = load(&text).unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "{text:?} gave {err:?}, expected {expected:?}"
        );
        assert!(!err.contains('\n'), "{err}");
    }
}

/// kombu prefixes every key it sends with `global_keyprefix`, `unacked`
/// and its index included, and names a priority list `<queue><sep><step>`
/// before prefixing it; entries in `unacked` name their queue by routing
/// key, which is never prefixed.
#[test]
fn a_celery_route_names_its_lists_and_unacked_hash_as_kombu_does() {
    let cfg = load(&celery(
        "app1:reports",
        "key_prefix = \"app1:\"\npriority_steps = [0, 5, 9]\npriority_sep = \":p\"\nunacked_key = \"held\"\nunacked_index_key = \"held_index\"\n",
    ))
    .unwrap();
    let route = &cfg.routes[0];
    let lists = priority_lists(&route.format, route.redis_key.as_bytes(), &route.keys);
    let expected: Vec<&[u8]> = vec![b"app1:reports:p5", b"app1:reports:p9"];
    assert_eq!(lists, expected);
    let sets = of_route(&route.format, route.redis_key.as_bytes(), &route.keys);
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].key, "app1:held");
    assert_eq!(
        sets[0].shape,
        Shape::UnackedHash {
            index: "app1:held_index".into()
        }
    );
    assert!(sets[0].owns(br#"[{"body":"e30="}, "", "reports"]"#));
    assert!(!sets[0].owns(br#"[{"body":"e30="}, "", "app1:reports"]"#));
    // Without options: kombu's defaults.
    let plain = load(&celery("reports", "")).unwrap();
    let sets = of_route(&Format::Celery, b"reports", &plain.routes[0].keys);
    assert_eq!(sets[0].key, "unacked");
}

/// RQ 3's `RQ_KEY_PREFIX` takes the place of `rq` in the queue, its
/// registries and the job hashes.
#[test]
fn an_rq_route_with_a_key_prefix_names_its_registries_and_job_hashes_with_it() {
    let cfg = load(&rq("app1:queue:reports", "key_prefix = \"app1\"\n")).unwrap();
    let route = &cfg.routes[0];
    let keys: Vec<String> = of_route(&route.format, route.redis_key.as_bytes(), &route.keys)
        .into_iter()
        .map(|s| s.key)
        .collect();
    assert_eq!(keys, ["app1:scheduled:reports", "app1:failed:reports"]);
    assert_eq!(route.keys.rq_job("abc"), "app1:job:abc");
    let plain = load(&rq("rq:queue:reports", "")).unwrap();
    assert_eq!(plain.routes[0].keys.rq_job("abc"), "rq:job:abc");
}
