//! Properties over arbitrary frames and arbitrary bytes.

use super::*;
use proptest::prelude::*;

pub(super) fn arb_frame() -> impl Strategy<Value = Frame> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..12).prop_map(Bytes::from);
    let line = || {
        proptest::collection::vec(any::<u8>().prop_filter("no CR", |&c| c != b'\r'), 0..12)
            .prop_map(Bytes::from)
    };
    let leaf = prop_oneof![
        line().prop_map(Frame::Simple),
        line().prop_map(Frame::Error),
        any::<i64>().prop_map(Frame::Integer),
        bytes().prop_map(Frame::Bulk),
        Just(Frame::NullBulk),
        Just(Frame::NullArray),
        Just(Frame::Null),
        any::<bool>().prop_map(Frame::Boolean),
        any::<f64>().prop_map(|d| Frame::Double(Bytes::from(d.to_string()))),
        "-?[0-9]{1,40}".prop_map(|n| Frame::BigNumber(Bytes::from(n))),
        bytes().prop_map(Frame::BulkError),
        (any::<[u8; 3]>(), bytes()).prop_map(|(format, text)| Frame::Verbatim { format, text }),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        let items = proptest::collection::vec(inner.clone(), 0..5);
        let pairs = proptest::collection::vec((inner.clone(), inner.clone()), 0..3);
        prop_oneof![
            items.clone().prop_map(Frame::Array),
            items.clone().prop_map(Frame::Set),
            items.prop_map(Frame::Push),
            pairs.clone().prop_map(Frame::Map),
            (pairs, inner).prop_map(|(attrs, frame)| Frame::Attribute {
                attrs,
                frame: Box::new(frame)
            }),
        ]
    })
}

/// Bytes made of RESP fragments, so random input reaches past the type byte.
pub(super) fn resp_soup() -> impl Strategy<Value = Vec<u8>> {
    const FRAGMENTS: &[&[u8]] = &[
        b"*", b"$", b"%", b"|", b"~", b">", b"!", b"=", b":", b"+", b"-", b"_", b"#", b",", b"(",
        b"1", b"2", b"0", b"-1", b"\r\n", b"\r", b"\n", b"a", b" ", b"\"", b"'", b"\\", b"t",
        b"txt:", b"inf",
    ];
    let fragment = proptest::sample::select(FRAGMENTS);
    proptest::collection::vec(fragment, 0..40).prop_map(|parts| parts.concat())
}

/// Anything the parser accepts re-encodes to exactly the bytes it consumed,
/// and the resumable scan agrees with the one-shot parse.
fn check_parse_invariants(buf: &[u8]) -> Result<(), TestCaseError> {
    let parsed = parse(buf, &lim());
    if let Err(e) = &parsed {
        super::fuzz::assert_one_line(e)?;
    }
    if let Err(e) = parse_command(buf, &lim()) {
        super::fuzz::assert_one_line(&e)?;
    }
    if let Ok(Some((frame, used))) = &parsed {
        prop_assert_eq!(&frame.to_bytes()[..], &buf[..*used]);
    }
    let scanned = Decoder::new(lim()).frame_len(buf);
    prop_assert_eq!(scanned, parsed.map(|r| r.map(|(_, used)| used)));
    if let Ok(Some((_, used))) = parse_command(buf, &lim()) {
        prop_assert!(used > 0 && used <= buf.len());
    }
    Ok(())
}

proptest! {
    #[test]
    fn arbitrary_frames_round_trip(frame in arb_frame(), chunk in 1usize..9) {
        let bytes = frame.to_bytes();
        prop_assert_eq!(parse(&bytes, &lim()), Ok(Some((frame.clone(), bytes.len()))));
        let mut decoder = Decoder::new(lim());
        let mut got = None;
        for end in (chunk..bytes.len() + chunk).step_by(chunk) {
            got = decoder.decode(&bytes[..end.min(bytes.len())]).unwrap();
            if got.is_some() { break; }
        }
        prop_assert_eq!(got, Some((frame, bytes.len())));
    }

    #[test]
    fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_parse_invariants(&buf)?;
    }

    #[test]
    fn resp_like_bytes_never_panic(buf in resp_soup()) {
        check_parse_invariants(&buf)?;
    }

    #[test]
    fn quoted_inline_arguments_round_trip(list in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..10), 1..5)) {
        let mut line = Vec::new();
        for arg in &list {
            line.extend_from_slice(b" \"");
            for &c in arg {
                match c {
                    b'"' | b'\\' => line.extend_from_slice(&[b'\\', c]),
                    b' '..=b'~' => line.push(c),
                    _ => line.extend_from_slice(format!("\\x{c:02x}").as_bytes()),
                }
            }
            line.push(b'"');
        }
        line.extend_from_slice(b"\r\n");
        let expected: Vec<Bytes> = list.into_iter().map(Bytes::from).collect();
        prop_assert_eq!(parse_command(&line, &lim()), Ok(Some((expected, line.len()))));
    }
}
