//! Every key a writer builds is found by the pattern its readers scan with,
//! and no other route's keys are.

use super::*;

/// The consumer's key names under the name they had before they moved here.
struct Keys;

impl Keys {
    #[allow(clippy::new_ret_no_self)]
    fn new(route: &str, consumer: &str) -> ConsumerKeys {
        RouteKeys::named(route).consumer(consumer)
    }
}

/// Redis's glob (`*`, `?`, `[...]`, `\` escapes), enough to hold a pattern
/// against the keys it must and must not find.
fn glob(pattern: &[u8], key: &[u8]) -> bool {
    match (pattern.first(), key.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob(&pattern[1..], key) || (!key.is_empty() && glob(pattern, &key[1..]))
        }
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &key[1..]),
        (Some(b'['), Some(&c)) => {
            let end = pattern
                .iter()
                .position(|&b| b == b']')
                .expect("closed class");
            pattern[1..end].contains(&c) && glob(&pattern[end + 1..], &key[1..])
        }
        (Some(b'\\'), Some(&c)) => pattern.get(1) == Some(&c) && glob(&pattern[2..], &key[1..]),
        (Some(&p), Some(&c)) => p == c && glob(&pattern[1..], &key[1..]),
        _ => false,
    }
}

fn finds(pattern: &str, key: &str) -> bool {
    glob(pattern.as_bytes(), key.as_bytes())
}

#[test]
fn names_and_slots_round_trip() {
    let k = Keys::new("emails", "host-1");
    assert_eq!(k.processing(3), "qbridge:processing:emails:host-1:3");
    assert_eq!(k.slot_of(&k.processing(12)), Some(12));
    assert_eq!(k.slot_of("qbridge:processing:emails:host-1:x"), None);
    assert_eq!(k.slot_of("qbridge:processing:emails:host-10:1"), None);
    assert_eq!(
        Keys::new("r", "a*[b]").processing_pattern(),
        r"qbridge:processing:r:a\*\[b\]:*"
    );
}

/// What the consumer writes is what the diff and decommission scan for.
#[test]
fn the_consumers_keys_are_what_the_route_readers_scan() {
    let route = RouteKeys::named("emails");
    for consumer in ["host-1", "host.2", "a_b"] {
        let c = route.consumer(consumer);
        for n in [0, 7, 1000] {
            assert!(finds(&route.any_processing(), &c.processing(n)));
            assert!(finds(&c.processing_pattern(), &c.processing(n)));
            assert!(finds(&route.any_inflight(), &c.inflight(n)));
            assert_eq!(inflight_beside(&c.processing(n)), Some(c.inflight(n)));
            assert!(!finds(&route.any_processing(), &c.inflight(n)));
            assert_eq!(route.processing_owner(&c.processing(n)), Some(consumer));
        }
        // The heartbeat decommission reads, and whose it is.
        assert!(finds(&route.any_heartbeat(), &c.heartbeat()));
        assert_eq!(route.heartbeat_owner(&c.heartbeat()), Some(consumer));
        assert!(!finds(&route.any_heartbeat(), &c.processing(0)));
        assert!(!finds(&route.any_processing(), &c.heartbeat()));
        assert_eq!(route.processing_owner(&c.inflight(0)), None);
        assert_eq!(route.heartbeat_owner(&c.processing(0)), None);
    }
    assert!(finds(&route.any_repushed(), &route.repushed("sha256:ab:1")));
    assert!(finds(&route.any_repushed(), &route.repushed("jid-1")));
    assert!(finds(&route.any_archiving(), &route.new_archiving()));
    assert!(finds(
        &route.any_archiving_gap(),
        &route.new_archiving_gap()
    ));
    assert!(finds(
        &route.any_archiving_dead(),
        &route.new_archiving_dead()
    ));
    // The kinds of archiving lists are archived differently: no pattern
    // finds another kind's lists.
    // A renamed processing list's inflight hash is found by its own
    // pattern, and from the list's name.
    let renamed = route.new_archiving();
    let beside = route
        .archiving_inflight(&renamed)
        .expect("an archiving list");
    assert!(finds(&route.any_archiving_inflight(), &beside));
    assert_eq!(route.archiving_inflight(&route.new_archiving_gap()), None);
    assert_eq!(route.archiving_inflight("queue:default"), None);
    let kinds = [
        (route.any_archiving(), route.new_archiving()),
        (route.any_archiving_gap(), route.new_archiving_gap()),
        (route.any_archiving_dead(), route.new_archiving_dead()),
        (route.any_archiving_inflight(), beside),
    ];
    for (i, (pattern, _)) in kinds.iter().enumerate() {
        for (j, (_, list)) in kinds.iter().enumerate() {
            assert_eq!(finds(pattern, list), i == j, "{pattern} {list}");
        }
    }
    assert_ne!(route.new_archiving(), route.new_archiving());
    assert_eq!(inflight_beside("queue:default"), None);
}

/// Another route's keys, even one whose name extends this one's, are never
/// found by this route's patterns.
#[test]
fn one_routes_patterns_never_find_another_routes_keys() {
    let mine = RouteKeys::named("emails");
    for other in ["emails2", "email", "emails.eu", "x"] {
        let theirs = RouteKeys::named(other);
        let c = theirs.consumer("host-1");
        assert!(!finds(&mine.any_processing(), &c.processing(0)), "{other}");
        assert!(!finds(&mine.any_inflight(), &c.inflight(0)), "{other}");
        assert!(!finds(&mine.any_heartbeat(), &c.heartbeat()), "{other}");
        assert_eq!(mine.heartbeat_owner(&c.heartbeat()), None, "{other}");
        assert_eq!(mine.processing_owner(&c.processing(0)), None, "{other}");
        assert!(
            !finds(&mine.any_repushed(), &theirs.repushed("k")),
            "{other}"
        );
        assert!(
            !finds(&mine.any_archiving(), &theirs.new_archiving()),
            "{other}"
        );
        assert!(
            !finds(&mine.any_archiving_gap(), &theirs.new_archiving_gap()),
            "{other}"
        );
        assert!(
            !finds(&mine.any_archiving_dead(), &theirs.new_archiving_dead()),
            "{other}"
        );
        assert_ne!(mine.gap(), theirs.gap());
        assert_ne!(mine.dead(), theirs.dead());
    }
    // A consumer's own pattern never reaches another consumer's lists.
    let (a, b) = (mine.consumer("host-1"), mine.consumer("host-10"));
    assert!(!finds(&a.processing_pattern(), &b.processing(1)));
}

#[test]
fn glob_characters_in_names_are_escaped() {
    let odd = RouteKeys::named("r*[x]?");
    let c = odd.consumer("c");
    assert!(finds(&odd.any_processing(), &c.processing(1)));
    assert!(!finds(
        &odd.any_processing(),
        &RouteKeys::named("rzxq").consumer("c").processing(1)
    ));
}

#[test]
fn fixed_names() {
    let r = RouteKeys::named("emails");
    assert_eq!(r.gap(), "qbridge:gap:emails");
    assert_eq!(r.gap_lock(), "qbridge:gap:emails:lock");
    assert_eq!(r.dead(), "qbridge:dead:emails");
    assert_eq!(r.repushed("k1"), "qbridge:repushed:emails:k1");
    assert_eq!(r.consumer("h").heartbeat(), "qbridge:consumer:emails:h");
    let token = uuid::Uuid::nil();
    assert_eq!(paid(&token), format!("qbridge:paid:{token}"));
    assert_eq!(
        r.consumer("h").client_name(2),
        "qbridge-consumer:emails:h:2"
    );
}
