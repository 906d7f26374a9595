//! The JSON-lines reader on hostile files: arbitrary bytes never panic, every
//! error is one line naming the line number, and a file without line breaks
//! is refused after `limit` bytes rather than read whole.

use super::{parse_jsonl, JSON_WHITESPACE};
use proptest::prelude::*;

const LIMIT: usize = 64;

fn one_line(e: &crate::error::Error) -> Result<String, TestCaseError> {
    let text = e.to_string();
    prop_assert!(!text.contains(['\r', '\n']), "{:?}", text);
    prop_assert!(text.contains(" line "), "{:?}", text);
    prop_assert!(text.ends_with("nothing was enqueued"), "{:?}", text);
    Ok(text)
}

/// Bytes made of JSON and line-ending fragments.
fn jsonl_soup() -> impl Strategy<Value = Vec<u8>> {
    const FRAGMENTS: &[&[u8]] = &[
        b"{",
        b"}",
        b"[",
        b"]",
        b"\"",
        b"\\",
        b":",
        b",",
        b"1",
        b"-",
        b"e",
        b"null",
        b"true",
        b"\n",
        b"\r\n",
        b"\r",
        b" ",
        b"\\u0000",
        b"\xff",
        b"\xc3\xa9",
        b"\"k\":",
        b"x",
    ];
    proptest::collection::vec(proptest::sample::select(FRAGMENTS), 0..60)
        .prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn arbitrary_files_never_panic_and_fail_in_one_line(
        file in prop_oneof![proptest::collection::vec(any::<u8>(), 0..300), jsonl_soup()],
    ) {
        match parse_jsonl(&file[..], "jobs.jsonl", LIMIT) {
            Ok(values) => {
                // Every value came from a non-blank line within the limit.
                let lines = file.split(|&b| b == b'\n')
                    .filter(|l| !l.iter().all(|&b| JSON_WHITESPACE.contains(&(b as char))))
                    .count();
                prop_assert_eq!(values.len(), lines);
            }
            Err(e) => { one_line(&e)?; }
        }
    }

    #[test]
    fn good_lines_come_back_in_order(values in proptest::collection::vec(any::<i64>(), 0..20), crlf in any::<bool>()) {
        let end = if crlf { "\r\n" } else { "\n" };
        let file: String = values.iter().map(|v| format!("{{\"n\":{v}}}{end}")).collect();
        let got = parse_jsonl(file.as_bytes(), "jobs.jsonl", LIMIT).unwrap();
        let want: Vec<_> = values.iter().map(|v| serde_json::json!({"n": v})).collect();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn a_line_of_other_whitespace_is_refused_not_skipped() {
    // Found by the property above: a vertical tab is Unicode whitespace but
    // not JSON whitespace, so the line is bad input, not a blank line.
    for line in ["\u{b}\n", "\u{c}\n", "\u{a0}\n"] {
        let e = parse_jsonl(line.as_bytes(), "f", LIMIT)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f line 1: "), "{e}");
    }
    assert!(parse_jsonl(&b" \t\r\n\n"[..], "f", LIMIT)
        .unwrap()
        .is_empty());
}

#[test]
fn a_payload_exactly_at_the_limit_passes_and_one_byte_more_fails() {
    let at = format!("\"{}\"", "a".repeat(LIMIT - 2));
    assert_eq!(
        parse_jsonl(format!("{at}\r\n").as_bytes(), "f", LIMIT)
            .unwrap()
            .len(),
        1
    );
    let over = format!("\"{}\"\n", "a".repeat(LIMIT - 1));
    let e = parse_jsonl(over.as_bytes(), "f", LIMIT)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("f line 1: "), "{e}");
}

/// A reader that never ends and never sends a line break: refused once the
/// line passes the limit, which is what keeps memory bounded.
#[test]
fn an_endless_line_is_refused_without_reading_it_all() {
    let endless = std::io::BufReader::new(std::io::repeat(b'7'));
    let e = parse_jsonl(endless, "-", LIMIT).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("- line 1: longer than the payload limit of {LIMIT} bytes; nothing was enqueued")
    );
}

#[test]
fn the_line_number_of_the_first_bad_line_is_named() {
    let file = b"{\"a\":1}\n\n{\"b\":\n\xff\n";
    let e = parse_jsonl(&file[..], "jobs.jsonl", LIMIT)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("jobs.jsonl line 3: "), "{e}");
}
