//! Fuzz-style properties (proptest stands in for cargo-fuzz, which needs a
//! nightly toolchain): hostile length headers, every cut point of a valid
//! frame, nesting on both sides of the depth limit, and an allocation bound
//! proportional to the input. Run more cases with
//! `PROPTEST_CASES=100000 cargo test --lib proxy::frame`.

use super::limits::counting::allocated_by;
use super::props::{arb_frame, resp_soup};
use super::*;
use proptest::prelude::*;

/// Errors are sent to clients as one RESP error line and logged as one line:
/// no CR or LF may hide in them, and the reply is exactly one line.
pub(super) fn assert_one_line(e: &ProtocolError) -> Result<(), TestCaseError> {
    let text = e.to_string();
    prop_assert!(!text.contains(['\r', '\n']), "{:?}", text);
    let reply = e.reply();
    prop_assert!(reply.starts_with(b"-ERR Protocol error: "));
    prop_assert_eq!(reply.iter().filter(|&&b| b == b'\n').count(), 1);
    prop_assert!(reply.ends_with(b"\r\n"));
    Ok(())
}

/// Length texts no frame may declare: negative, past the limits, past i64,
/// or not in the canonical spelling Redis accepts.
fn hostile_length() -> impl Strategy<Value = String> {
    prop_oneof![
        (i64::MIN..-1).prop_map(|n| n.to_string()),
        (1_048_577i64..=i64::MAX).prop_map(|n| n.to_string()),
        Just("2147483648".to_string()),
        Just("9223372036854775807".to_string()),
        Just("9223372036854775808".to_string()),
        Just("-9223372036854775809".to_string()),
        "[1-9][0-9]{19,40}",
        "\\+[0-9]{1,5}",
        "0[0-9]{1,5}",
        Just("-0".to_string()),
        Just(String::new()),
        " [0-9]{1,3}",
        "[0-9]{1,3}[a-z ]",
        "[^0-9\r\n-][^\r\n]{0,8}",
    ]
}

/// One level of nesting for each aggregate type: a map's key and an
/// attribute's pair come first, so the nested frame is the last child.
const LEVELS: &[&[u8]] = &[
    b"*1\r\n",
    b"~1\r\n",
    b">1\r\n",
    b"%1\r\n:0\r\n",
    b"|1\r\n:0\r\n:0\r\n",
];

proptest! {
    /// `*-5`, `$9223372036854775807`, `*2147483648`, `%-1`, `$+3`...: refused
    /// as soon as the header line is complete, in one line, by both parsers.
    #[test]
    fn hostile_length_headers_are_refused(kind in proptest::sample::select(&b"*%~>|$!="[..]), len in hostile_length(), tail in proptest::collection::vec(any::<u8>(), 0..16)) {
        // 64 MiB is the default bulk limit; only aggregates stop at 1,048,576.
        let aggregate = b"*%~>|".contains(&kind);
        let allowed = |n: i64| if aggregate { (0..=1_048_576).contains(&n) } else { (0..=64 << 20).contains(&n) };
        prop_assume!(!len.parse::<i64>().is_ok_and(|n| n.to_string() == len && allowed(n)));
        let buf = [vec![kind], len.clone().into_bytes(), b"\r\n".to_vec(), tail].concat();
        match parse(&buf, &lim()) {
            // The RESP2 nils are frames, not errors.
            Ok(Some((Frame::NullArray, 5))) => prop_assert_eq!(&buf[..5], b"*-1\r\n"),
            Ok(Some((Frame::NullBulk, 5))) => prop_assert_eq!(&buf[..5], b"$-1\r\n"),
            Err(e) => assert_one_line(&e)?,
            other => prop_assert!(false, "{:?} accepted: {:?}", len, other),
        }
        // The same header inside a command: the count, or an argument's length.
        let in_command = if kind == b'*' {
            buf.clone()
        } else {
            [b"*2\r\n$5\r\nLPUSH\r\n".to_vec(), vec![b'$'], len.into_bytes(), b"\r\n".to_vec()].concat()
        };
        match parse_command(&in_command, &lim()) {
            Ok(Some((args, _))) => prop_assert!(args.is_empty(), "{:?}", args),
            Ok(None) => prop_assert!(false, "a hostile header waits for more input"),
            Err(e) => assert_one_line(&e)?,
        }
    }

    /// A frame cut anywhere short of its end is "read more", never an error
    /// and never a different frame; the resumable decoder agrees.
    #[test]
    fn every_cut_point_is_incomplete(frame in arb_frame()) {
        let bytes = frame.to_bytes();
        for cut in 0..bytes.len() {
            prop_assert_eq!(parse(&bytes[..cut], &lim()), Ok(None), "cut at {}", cut);
        }
        let mut decoder = Decoder::new(lim());
        for cut in 0..bytes.len() {
            prop_assert_eq!(decoder.frame_len(&bytes[..cut]), Ok(None), "cut at {}", cut);
        }
        prop_assert_eq!(decoder.frame_len(&bytes), Ok(Some(bytes.len())));
    }

    /// The same for client commands with arbitrary (non-UTF-8) arguments.
    #[test]
    fn every_cut_point_of_a_command_is_incomplete(args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 1..6)) {
        let frame = Frame::Array(args.iter().map(|a| Frame::Bulk(Bytes::from(a.clone()))).collect());
        let bytes = frame.to_bytes();
        for cut in 0..bytes.len() {
            prop_assert_eq!(parse_command(&bytes[..cut], &lim()), Ok(None), "cut at {}", cut);
        }
        let want: Vec<Bytes> = args.into_iter().map(Bytes::from).collect();
        prop_assert_eq!(parse_command(&bytes, &lim()), Ok(Some((want, bytes.len()))));
    }

    /// Nesting of any aggregate mix is accepted up to `max_depth` and refused
    /// one level past it, with the scanner and the builder agreeing.
    #[test]
    fn nesting_is_cut_exactly_at_the_limit(levels in proptest::collection::vec(proptest::sample::select(LEVELS), 0..80), max_depth in 0usize..80) {
        let buf = [levels.concat(), b"#t\r\n".to_vec()].concat();
        let limits = Limits { max_depth, ..lim() };
        let got = parse(&buf, &limits);
        if levels.len() <= max_depth {
            prop_assert_eq!(got.map(|r| r.map(|(_, n)| n)), Ok(Some(buf.len())));
        } else {
            prop_assert_eq!(got, Err(ProtocolError::TooDeep));
            prop_assert_eq!(Decoder::new(limits).frame_len(&buf), Err(ProtocolError::TooDeep));
        }
    }

    /// Whatever the input, parsing allocates at most a fixed multiple of the
    /// input's length (plus a constant): memory follows the bytes present,
    /// never the lengths they declare.
    #[test]
    fn allocation_follows_the_input_not_its_headers(buf in prop_oneof![
        arb_frame().prop_map(|f| f.to_bytes()),
        resp_soup(),
        (proptest::sample::select(&b"*%~>|$!="[..]), 0u64..u64::MAX, resp_soup())
            .prop_map(|(k, n, rest)| [vec![k], n.to_string().into_bytes(), b"\r\n".to_vec(), rest].concat()),
    ]) {
        let open = Limits { max_bulk_len: usize::MAX, max_elements: usize::MAX, ..lim() };
        let bound = 128 * buf.len() + 4096;
        let (_, bytes) = allocated_by(|| parse(&buf, &open));
        prop_assert!(bytes <= bound, "parse: {} bytes for {} input bytes", bytes, buf.len());
        let (_, bytes) = allocated_by(|| parse_command(&buf, &open));
        prop_assert!(bytes <= bound, "parse_command: {} bytes for {} input bytes", bytes, buf.len());
        let (_, bytes) = allocated_by(|| Decoder::new(open).frame_len(&buf));
        prop_assert!(bytes <= bound, "frame_len: {} bytes for {} input bytes", bytes, buf.len());
    }
}

/// The hard cap holds whatever the configured limit: 1024 levels parse,
/// 1025 do not, with no stack overflow on the way.
#[test]
fn the_depth_cap_is_exact() {
    let open = Limits {
        max_depth: usize::MAX,
        ..lim()
    };
    let nested = |depth: usize| [b"*1\r\n".repeat(depth), b"_\r\n".to_vec()].concat();
    let ok = nested(DEPTH_CAP);
    assert_eq!(parse(&ok, &open).unwrap().map(|(_, n)| n), Some(ok.len()));
    assert_eq!(
        parse(&nested(DEPTH_CAP + 1), &open),
        Err(ProtocolError::TooDeep)
    );
}
