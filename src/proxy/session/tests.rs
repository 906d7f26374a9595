//! The pairing rules of [`Session`], one Redis behaviour per test.

use bytes::Bytes;

use super::*;

fn bulk(s: &str) -> Frame {
    Frame::Bulk(Bytes::from(s.to_string()))
}

fn confirmation(kind: &str, channel: &str, count: i64) -> Frame {
    Frame::Array(vec![bulk(kind), bulk(channel), Frame::Integer(count)])
}

fn simple(s: &str) -> Frame {
    Frame::Simple(Bytes::from(s.to_string()))
}

#[test]
fn unsubscribe_all_expects_one_confirmation_per_channel_or_one() {
    let mut s = Session::default();
    let none = Cmd::Unsubscribe {
        family: Family::Channel,
        count: 0,
    };
    assert_eq!(
        s.start(&none).0,
        Expect::Confirmations {
            family: Family::Channel,
            subscribe: false,
            left: 1
        }
    );
    assert!(s.confirm(&confirmation("subscribe", "a", 1), Family::Channel, true));
    assert!(s.confirm(&confirmation("subscribe", "b", 2), Family::Channel, true));
    // Patterns are a separate set.
    assert!(s.confirm(&confirmation("psubscribe", "p*", 3), Family::Pattern, true));
    assert_eq!(
        s.start(&none).0,
        Expect::Confirmations {
            family: Family::Channel,
            subscribe: false,
            left: 2
        }
    );
    assert!(s.confirm(&confirmation("unsubscribe", "a", 2), Family::Channel, false));
    assert_eq!(
        s.start(&none).0,
        Expect::Confirmations {
            family: Family::Channel,
            subscribe: false,
            left: 1
        }
    );
}

#[test]
fn resp2_messages_are_out_of_band_only_while_subscribed() {
    let mut s = Session::default();
    let message = Frame::Array(vec![bulk("message"), bulk("a"), bulk("hi")]);
    // An LRANGE reply that happens to look like a message.
    assert!(!s.out_of_band(&message, None));
    assert!(!s.maybe_out_of_band(b'*'));
    s.confirm(&confirmation("subscribe", "a", 1), Family::Channel, true);
    assert!(s.maybe_out_of_band(b'*'));
    assert!(s.out_of_band(&message, None));
    // PING in subscribe mode answers ["pong", ""]: in band.
    let pong = Frame::Array(vec![bulk("pong"), bulk("")]);
    assert!(!s.out_of_band(&pong, None));
}

#[test]
fn resp3_confirmations_pair_with_their_command_and_other_pushes_do_not() {
    let mut s = Session::default();
    s.on_reply(Cmd::Hello, Some(&Frame::Map(Vec::new())));
    assert!(s.resp3());
    let push = Frame::Push(vec![bulk("subscribe"), bulk("a"), Frame::Integer(1)]);
    assert!(!s.out_of_band(&push, Some((Family::Channel, true))));
    let message = Frame::Push(vec![bulk("message"), bulk("a"), bulk("x")]);
    assert!(s.out_of_band(&message, Some((Family::Channel, true))));
    // A confirmation nobody waits for is out of band but still tracked.
    let other = Frame::Push(vec![bulk("psubscribe"), bulk("p*"), Frame::Integer(2)]);
    assert!(s.out_of_band(&other, Some((Family::Channel, true))));
    let all = Cmd::Unsubscribe {
        family: Family::Pattern,
        count: 0,
    };
    assert!(matches!(
        s.start(&all).0,
        Expect::Confirmations { left: 1, .. }
    ));
}

/// A push of one item on a route in `dual_write`.
fn mirror_push() -> MirrorPush {
    let toml = "[[routes]]\nname = \"r\"\nredis_key = \"q\"\nqueue = \"r\"\n\
                format = \"json:/id\"\nphase = \"dual_write\"\n";
    let config = crate::config::Config::from_toml(toml, &Default::default()).expect("config");
    let routes = crate::routes::Routes::from_config(&config.routes);
    let route = std::sync::Arc::clone(routes.by_name("r").expect("route"));
    let item = Bytes::from_static(br#"{"id":"k"}"#);
    let routed = crate::model::PhaseView::default().route_push();
    MirrorPush::new(route, vec![item], crate::model::Phase::DualWrite, routed)
}

/// Redis's answer to a CLIENT REPLY command (sent to Redis as ON), taken.
fn took_reply(s: &mut Session, mode: ReplyMode) -> Action {
    let cmd = Cmd::ClientReply(mode);
    s.start(&cmd);
    s.on_reply(cmd, Some(&simple("OK")))
}

/// Whether the answer to a plain command now would reach the client.
fn answered(s: &mut Session) -> bool {
    let (expect, silent) = s.start(&Cmd::Plain);
    assert_eq!(expect, Expect::One, "Redis answers every command");
    !silent
}

#[test]
fn client_reply_skip_silences_exactly_the_next_command() {
    let mut s = Session::default();
    assert!(matches!(took_reply(&mut s, ReplyMode::Skip), Action::Drop));
    assert!(!answered(&mut s));
    assert!(answered(&mut s));
}

#[test]
fn client_reply_off_silences_all_until_on() {
    let mut s = Session::default();
    assert!(matches!(took_reply(&mut s, ReplyMode::Off), Action::Drop));
    assert!(!answered(&mut s));
    assert!(s.start_local());
    // SKIP while OFF changes nothing; ON answers +OK.
    assert!(matches!(took_reply(&mut s, ReplyMode::Skip), Action::Drop));
    let on = Cmd::ClientReply(ReplyMode::On);
    // Silenced like any command, yet its +OK comes through: Redis turns
    // replies on before it answers.
    assert_eq!(s.start(&on), (Expect::One, true));
    assert!(matches!(
        s.on_reply(on, Some(&simple("OK"))),
        Action::ForwardAlways
    ));
    assert!(answered(&mut s));
    assert!(!s.start_local());
}

#[test]
fn a_refused_client_reply_changes_nothing_and_is_answered() {
    let mut s = Session::new(false);
    let noauth = Frame::Error(Bytes::from_static(b"NOAUTH Authentication required."));
    let off = Cmd::ClientReply(ReplyMode::Off);
    assert_eq!(s.start(&off), (Expect::One, false));
    assert!(matches!(s.on_reply(off, Some(&noauth)), Action::Forward));
    assert!(answered(&mut s), "replies stay on");
    // A push under replies off is mirrored on Redis's answer, not as sent.
    assert!(matches!(took_reply(&mut s, ReplyMode::Off), Action::Drop));
    let denied = Frame::Error(Bytes::from_static(b"NOPERM this user has no permissions"));
    let push = || Cmd::Push(mirror_push());
    assert_eq!(s.start(&push()), (Expect::One, true));
    assert!(matches!(s.on_reply(push(), Some(&denied)), Action::Forward));
    assert_eq!(s.start(&push()), (Expect::One, true));
    assert!(matches!(
        s.on_reply(push(), Some(&Frame::Integer(1))),
        Action::Mirror(_)
    ));
}

#[test]
fn multi_queues_only_what_redis_queued() {
    let mut s = Session::default();
    s.on_reply(Cmd::Multi, Some(&simple("OK")));
    assert!(s.in_multi());
    // Inside MULTI even SUBSCRIBE is answered once (+QUEUED).
    let sub = Cmd::Subscribe {
        family: Family::Channel,
        count: 3,
    };
    assert_eq!(s.start(&sub).0, Expect::One);
    s.on_reply(Cmd::Plain, Some(&simple("QUEUED")));
    s.on_reply(
        Cmd::Plain,
        Some(&Frame::Error(Bytes::from_static(b"ERR unknown command"))),
    );
    s.on_reply(
        Cmd::Multi,
        Some(&Frame::Error(Bytes::from_static(b"ERR nested"))),
    );
    assert!(s.in_multi());
    match s.on_reply(Cmd::Exec, Some(&Frame::Array(vec![Frame::Integer(1)]))) {
        Action::Exec(entries) => assert_eq!(entries.len(), 1),
        other => panic!("{other:?}"),
    }
    assert!(!s.in_multi());
}

#[test]
fn exec_aborted_settles_nothing_and_a_refused_multi_is_no_multi() {
    let mut s = Session::default();
    s.on_reply(Cmd::Multi, Some(&simple("OK")));
    s.on_reply(Cmd::Plain, Some(&simple("QUEUED")));
    assert!(matches!(
        s.on_reply(Cmd::Exec, Some(&Frame::NullArray)),
        Action::Forward
    ));
    assert!(!s.in_multi());
    s.on_reply(
        Cmd::Multi,
        Some(&Frame::Error(Bytes::from_static(b"NOPERM"))),
    );
    assert!(!s.in_multi());
}

#[test]
fn hello_and_reset_switch_the_protocol() {
    let mut s = Session::default();
    s.on_reply(Cmd::Hello, Some(&Frame::Map(Vec::new())));
    assert!(s.resp3());
    // A failed HELLO changes nothing.
    s.on_reply(
        Cmd::Hello,
        Some(&Frame::Error(Bytes::from_static(b"NOAUTH"))),
    );
    assert!(s.resp3());
    s.confirm(&confirmation("subscribe", "a", 1), Family::Channel, true);
    s.on_reply(Cmd::Reset, Some(&simple("RESET")));
    assert!(!s.resp3());
    assert!(!s.maybe_out_of_band(b'*'));
}

#[test]
fn only_a_positive_length_means_the_push_was_taken() {
    assert!(took(Some(&Frame::Integer(3))));
    // LPUSHX on a missing list.
    assert!(!took(Some(&Frame::Integer(0))));
    assert!(!took(Some(&Frame::Error(Bytes::from_static(b"WRONGTYPE")))));
    assert!(!took(None));
}

#[test]
fn the_database_follows_redis_answers_to_select_reset_and_exec() {
    let mut s = Session::default();
    assert_eq!(s.next_db(), Some(0));
    let ok = simple("OK");
    s.start(&Cmd::Select(Some(2)));
    s.on_reply(Cmd::Select(Some(2)), Some(&ok));
    assert_eq!(s.next_db(), Some(2));
    // Refused (out of range): nothing changes.
    let refused = Frame::Error(Bytes::from_static(b"ERR DB index is out of range"));
    s.on_reply(Cmd::Select(Some(99)), Some(&refused));
    assert_eq!(s.next_db(), Some(2));
    s.on_reply(Cmd::Reset, Some(&simple("RESET")));
    assert_eq!(s.next_db(), Some(0));
    // Queued in MULTI: the commands queued after it run in db 5 ...
    s.on_reply(Cmd::Multi, Some(&ok));
    s.on_reply(Cmd::Select(Some(5)), Some(&simple("QUEUED")));
    assert_eq!(s.next_db(), Some(5));
    // ... but DISCARD drops it ...
    s.on_reply(Cmd::Discard, Some(&ok));
    assert_eq!(s.next_db(), Some(0));
    // ... and EXEC hands it back for the reply side to apply if it ran.
    s.on_reply(Cmd::Multi, Some(&ok));
    s.on_reply(Cmd::Select(Some(5)), Some(&simple("QUEUED")));
    let exec = Frame::Array(vec![ok.clone()]);
    match s.on_reply(Cmd::Exec, Some(&exec)) {
        Action::Exec(entries) => assert!(matches!(entries[..], [Entry::Select(Some(5))])),
        other => panic!("{other:?}"),
    }
    // With replies off, Redis's withheld answer still selects.
    took_reply(&mut s, ReplyMode::Off);
    assert_eq!(s.start(&Cmd::Select(Some(7))), (Expect::One, true));
    s.on_reply(Cmd::Select(Some(7)), Some(&ok));
    assert_eq!(s.next_db(), Some(7));
}

#[test]
fn reset_answers_under_client_reply_off_but_not_after_skip() {
    let mut s = Session::default();
    took_reply(&mut s, ReplyMode::Off);
    assert_eq!(s.start(&Cmd::Reset), (Expect::One, false));
    s.on_reply(Cmd::Reset, Some(&simple("RESET")));
    assert!(answered(&mut s));
    // Skipped, it is still run: back to db 0 with replies on.
    s.on_reply(Cmd::Select(Some(3)), Some(&simple("OK")));
    took_reply(&mut s, ReplyMode::Skip);
    assert_eq!(s.start(&Cmd::Reset), (Expect::One, true));
    s.on_reply(Cmd::Reset, Some(&simple("RESET")));
    assert_eq!(s.next_db(), Some(0));
    assert!(answered(&mut s));
}

#[test]
fn authentication_follows_redis_answers_and_reset_returns_to_the_start() {
    let mut s = Session::new(false);
    assert!(!s.authed());
    let wrong = Frame::Error(Bytes::from_static(
        b"WRONGPASS invalid username-password pair",
    ));
    s.on_reply(Cmd::Auth, Some(&wrong));
    assert!(
        !s.authed(),
        "a refused AUTH leaves the connection as it was"
    );
    let noauth = Frame::Error(Bytes::from_static(b"NOAUTH HELLO must be called ..."));
    s.on_reply(Cmd::Hello, Some(&noauth));
    assert!(!s.authed());
    s.on_reply(Cmd::Auth, Some(&simple("OK")));
    assert!(s.authed());
    s.on_reply(Cmd::Reset, Some(&simple("RESET")));
    assert!(!s.authed(), "RESET logs the connection out");
    s.on_reply(Cmd::Hello, Some(&Frame::Map(vec![])));
    assert!(s.authed() && s.resp3(), "HELLO 3 AUTH … answered");
    // A connection that never needed AUTH stays authenticated after RESET.
    let mut open = Session::new(true);
    open.on_reply(Cmd::Reset, Some(&simple("RESET")));
    assert!(open.authed());
}
