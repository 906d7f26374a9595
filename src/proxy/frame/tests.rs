//! Tests of the frame codec: exact round trips, incremental parsing at every
//! split point, limits enforced without large allocations, and properties over
//! arbitrary frames and arbitrary bytes.

use super::*;

mod fuzz;
mod limits;
mod props;

fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

fn lim() -> Limits {
    Limits::default()
}

/// Canonical encodings of every frame type and the frames they stand for.
fn samples() -> Vec<(&'static [u8], Frame)> {
    use Frame::*;
    vec![
        (b"+OK\r\n", Simple(b(b"OK"))),
        (b"+\r\n", Simple(Bytes::new())),
        (
            b"-ERR unknown command 'FOO'\r\n",
            Error(b(b"ERR unknown command 'FOO'")),
        ),
        (b":0\r\n", Integer(0)),
        (b":-9223372036854775808\r\n", Integer(i64::MIN)),
        (b":9223372036854775807\r\n", Integer(i64::MAX)),
        (b"$5\r\nhello\r\n", Bulk(b(b"hello"))),
        (b"$0\r\n\r\n", Bulk(Bytes::new())),
        (b"$4\r\n\r\n\r\n\r\n", Bulk(b(b"\r\n\r\n"))),
        (b"$3\r\n\xff\xfe\x00\r\n", Bulk(b(b"\xff\xfe\x00"))),
        (b"$-1\r\n", NullBulk),
        (b"*-1\r\n", NullArray),
        (b"*0\r\n", Array(vec![])),
        (
            b"*2\r\n$5\r\nLPUSH\r\n:1\r\n",
            Array(vec![Bulk(b(b"LPUSH")), Integer(1)]),
        ),
        (b"_\r\n", Null),
        (b"#t\r\n", Boolean(true)),
        (b"#f\r\n", Boolean(false)),
        (b",3.14\r\n", Double(b(b"3.14"))),
        (b",-inf\r\n", Double(b(b"-inf"))),
        (b",nan\r\n", Double(b(b"nan"))),
        (b",1e+300\r\n", Double(b(b"1e+300"))),
        (
            b"(-3492890328409238509324850943850943825024385\r\n",
            BigNumber(b(b"-3492890328409238509324850943850943825024385")),
        ),
        (
            b"!21\r\nSYNTAX invalid syntax\r\n",
            BulkError(b(b"SYNTAX invalid syntax")),
        ),
        (
            b"=15\r\ntxt:Some string\r\n",
            Verbatim {
                format: *b"txt",
                text: b(b"Some string"),
            },
        ),
        (
            b"%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n",
            Map(vec![
                (Simple(b(b"first")), Integer(1)),
                (Simple(b(b"second")), Integer(2)),
            ]),
        ),
        (b"~2\r\n+a\r\n_\r\n", Set(vec![Simple(b(b"a")), Null])),
        (
            b">3\r\n$7\r\nmessage\r\n$4\r\nchan\r\n$2\r\nhi\r\n",
            Push(vec![Bulk(b(b"message")), Bulk(b(b"chan")), Bulk(b(b"hi"))]),
        ),
        (
            b"|1\r\n+key-popularity\r\n*1\r\n,0.19\r\n*1\r\n:2\r\n",
            Attribute {
                attrs: vec![(
                    Simple(b(b"key-popularity")),
                    Array(vec![Double(b(b"0.19"))]),
                )],
                frame: Box::new(Array(vec![Integer(2)])),
            },
        ),
        // An attribute inside an array annotates one element and is not an
        // element itself: the array still has three.
        (
            b"*3\r\n:1\r\n|1\r\n+ttl\r\n:3600\r\n:2\r\n:3\r\n",
            Array(vec![
                Integer(1),
                Attribute {
                    attrs: vec![(Simple(b(b"ttl")), Integer(3600))],
                    frame: Box::new(Integer(2)),
                },
                Integer(3),
            ]),
        ),
        (
            b"*2\r\n*1\r\n%1\r\n+k\r\n~0\r\n$-1\r\n",
            Array(vec![
                Array(vec![Map(vec![(Simple(b(b"k")), Set(vec![]))])]),
                NullBulk,
            ]),
        ),
    ]
}

#[test]
fn every_frame_type_round_trips_byte_for_byte() {
    for (bytes, frame) in samples() {
        let mut followed = bytes.to_vec();
        followed.extend_from_slice(b"+NEXT\r\n");
        let parsed = parse(&followed, &lim());
        assert_eq!(parsed, Ok(Some((frame.clone(), bytes.len()))), "{bytes:?}");
        assert_eq!(frame.to_bytes(), bytes, "{frame:?}");
    }
}

/// A pipelined stream cut anywhere parses into a prefix of its frames, with
/// the remainder reported incomplete; whole, it parses into all of them.
#[test]
fn every_split_point_of_a_pipeline_parses_to_a_prefix() {
    let samples = samples();
    let stream: Vec<u8> = samples
        .iter()
        .flat_map(|(bytes, _)| bytes.iter().copied())
        .collect();
    let ends: Vec<usize> = samples
        .iter()
        .scan(0, |end, (bytes, _)| {
            *end += bytes.len();
            Some(*end)
        })
        .collect();
    for cut in 0..=stream.len() {
        let (mut at, mut seen) = (0, 0);
        while let Some((frame, used)) = parse(&stream[at..cut], &lim()).unwrap() {
            assert_eq!(frame, samples[seen].1, "cut at {cut}");
            at += used;
            assert_eq!(at, ends[seen]);
            seen += 1;
        }
        assert!(seen == samples.len() || cut < ends[seen], "cut at {cut}");
    }
}

/// A decoder fed one more byte at a time finds the same frames.
#[test]
fn decoder_resumes_byte_by_byte() {
    let samples = samples();
    let stream: Vec<u8> = samples
        .iter()
        .flat_map(|(bytes, _)| bytes.iter().copied())
        .collect();
    let mut decoder = Decoder::new(lim());
    let (mut at, mut frames) = (0, Vec::new());
    for end in 0..=stream.len() {
        while let Some((frame, used)) = decoder.decode(&stream[at..end]).unwrap() {
            frames.push(frame);
            at += used;
        }
    }
    let expected: Vec<Frame> = samples.into_iter().map(|(_, f)| f).collect();
    assert_eq!(frames, expected);
}

#[test]
fn decoder_given_a_shorter_buffer_reports_desync() {
    let mut decoder = Decoder::new(lim());
    assert_eq!(decoder.frame_len(b"*2\r\n:1\r\n"), Ok(None));
    assert_eq!(decoder.frame_len(b"*2"), Err(ProtocolError::Desync));
    // ...and starts afresh afterwards.
    assert_eq!(decoder.frame_len(b"*2\r\n:1\r\n:2\r\n"), Ok(Some(12)));
}

#[test]
fn negative_and_non_canonical_numbers_are_errors() {
    use ProtocolError::*;
    let cases: &[(&[u8], ProtocolError)] = &[
        (b"$-2\r\n", InvalidBulkLength),
        (b"!-1\r\n", InvalidBulkLength),
        (b"=-1\r\n", InvalidBulkLength),
        (b"$+1\r\na\r\n", InvalidBulkLength),
        (b"$01\r\na\r\n", InvalidBulkLength),
        (b"$\r\n", InvalidBulkLength),
        (b"*-2\r\n", InvalidMultibulkLength),
        (b"%-1\r\n", InvalidMultibulkLength),
        (b"~-1\r\n", InvalidMultibulkLength),
        (b">-1\r\n", InvalidMultibulkLength),
        (b"|-1\r\n", InvalidMultibulkLength),
        (b":-0\r\n", InvalidInteger),
        (b":+1\r\n", InvalidInteger),
        (b":01\r\n", InvalidInteger),
        (b": 1\r\n", InvalidInteger),
        (b":\r\n", InvalidInteger),
        (b":9223372036854775808\r\n", InvalidInteger),
    ];
    for (input, expected) in cases {
        assert_eq!(parse(input, &lim()).as_ref(), Err(expected), "{input:?}");
    }
}

#[test]
fn malformed_frames_are_errors() {
    use ProtocolError::*;
    let cases: &[(&[u8], ProtocolError)] = &[
        (b"?x\r\n", UnexpectedType(b'?')),
        (b"\r\n", UnexpectedType(b'\r')),
        (b"\xff", UnexpectedType(0xff)),
        (b"$3\r\nfooXY", ExpectedCrlf),
        (b"+OK\rX", ExpectedCrlf),
        (b"#x\r\n", InvalidBoolean),
        (b"_x\r\n", InvalidNull),
        (b",abc\r\n", InvalidDouble),
        (b",\r\n", InvalidDouble),
        (b"(12a\r\n", InvalidBigNumber),
        (b"=3\r\nabc\r\n", InvalidVerbatim),
        (b"=4\r\ntxtx\r\n", InvalidVerbatim),
    ];
    for (input, expected) in cases {
        assert_eq!(parse(input, &lim()).as_ref(), Err(expected), "{input:?}");
    }
}

#[test]
fn error_replies_use_redis_wording_and_stay_one_line() {
    assert_eq!(
        ProtocolError::InvalidBulkLength.reply(),
        b"-ERR Protocol error: invalid bulk length\r\n"
    );
    assert_eq!(
        ProtocolError::ExpectedBulk(b':').reply(),
        b"-ERR Protocol error: expected '$', got ':'\r\n"
    );
    assert_eq!(
        ProtocolError::InvalidBulkLength.to_string(),
        "protocol error: invalid bulk length"
    );
    for byte in [b'\r', b'\n', 0, 0xff] {
        for err in [
            ProtocolError::UnexpectedType(byte),
            ProtocolError::ExpectedBulk(byte),
        ] {
            let reply = err.reply();
            let body = &reply[..reply.len() - 2];
            assert!(reply.ends_with(b"\r\n") && !body.contains(&b'\r') && !body.contains(&b'\n'));
        }
    }
}

#[test]
fn helpers() {
    let attributed = |frame: Frame| Frame::Attribute {
        attrs: vec![],
        frame: Box::new(frame),
    };
    assert!(Frame::Error(b(b"ERR x")).is_error());
    assert!(Frame::BulkError(b(b"ERR x")).is_error());
    assert!(attributed(Frame::Error(b(b"ERR x"))).is_error());
    assert!(!Frame::Simple(b(b"OK")).is_error());
    assert_eq!(Frame::Integer(3).as_integer(), Some(3));
    assert_eq!(attributed(Frame::Integer(3)).as_integer(), Some(3));
    assert_eq!(Frame::Bulk(b(b"3")).as_integer(), None);

    assert_eq!(
        command_name(&[b(b"lPush"), b(b"q")]).as_deref(),
        Some("LPUSH")
    );
    assert_eq!(command_name(&[]), None);
    assert_eq!(command_name(&[b(b"\xffpush")]), None);
    assert_eq!(command_name(&[Bytes::from(vec![b'a'; 1 << 20])]), None);
}

fn args(list: &[&[u8]]) -> Vec<Bytes> {
    list.iter().map(|a| b(a)).collect()
}

/// Client commands in both forms, with what Redis reads from each.
fn commands() -> Vec<(&'static [u8], Vec<Bytes>)> {
    vec![
        (
            b"*3\r\n$5\r\nLPUSH\r\n$1\r\nq\r\n$3\r\n\xff\x00\n\r\n",
            args(&[b"LPUSH", b"q", b"\xff\x00\n"]),
        ),
        (b"PING\r\n", args(&[b"PING"])),
        (b"\r\n", vec![]),
        (b"   \t\n", vec![]),
        (b"set k \"a b\\x41\\n\"\n", args(&[b"set", b"k", b"a bA\n"])),
        (
            b"rpush q 'it\\'s' \"\"\r\n",
            args(&[b"rpush", b"q", b"it's", b""]),
        ),
        (b"a\"b c\" d\n", args(&[b"ab c", b"d"])),
        (b"echo x\0ignored\r\n", args(&[b"echo", b"x"])),
        (b"*0\r\n", vec![]),
        (b"*-1\r\n", vec![]),
        (b"*1\r\n$4\r\nPING\r\n", args(&[b"PING"])),
    ]
}

#[test]
fn commands_parse_like_redis_at_every_split_point() {
    let commands = commands();
    for (bytes, expected) in &commands {
        assert_eq!(
            parse_command(bytes, &lim()),
            Ok(Some((expected.clone(), bytes.len()))),
            "{bytes:?}"
        );
    }
    let stream: Vec<u8> = commands
        .iter()
        .flat_map(|(bytes, _)| bytes.iter().copied())
        .collect();
    for cut in 0..=stream.len() {
        let (mut at, mut seen) = (0, 0);
        while let Some((got, used)) = parse_command(&stream[at..cut], &lim()).unwrap() {
            assert_eq!(got, commands[seen].1, "cut at {cut}");
            at += used;
            seen += 1;
        }
        assert!(at <= cut);
    }
}

#[test]
fn malformed_commands_are_errors() {
    use ProtocolError::*;
    let cases: &[(&[u8], ProtocolError)] = &[
        (b"*1\r\n:1\r\n", ExpectedBulk(b':')),
        (b"*1\r\n$-1\r\n", InvalidBulkLength),
        (b"*1\r\n$67108865\r\n", InvalidBulkLength),
        (b"*-2\r\n", InvalidMultibulkLength),
        (b"*x\r\n", InvalidMultibulkLength),
        (b"*1048577\r\n", InvalidMultibulkLength),
        (b"*1\r\n$1\r\naXY", ExpectedCrlf),
        (b"set k \"abc\n", UnbalancedQuotes),
        (b"set k \"abc\"d\n", UnbalancedQuotes),
        (b"a\"b c\"d\n", UnbalancedQuotes),
        (b"set k 'abc\n", UnbalancedQuotes),
        (b"set k \"abc\\\"\n", UnbalancedQuotes),
    ];
    for (input, expected) in cases {
        assert_eq!(
            parse_command(input, &lim()).as_ref(),
            Err(expected),
            "{input:?}"
        );
    }
}
