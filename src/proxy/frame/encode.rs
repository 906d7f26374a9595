//! Encoding: the canonical RESP spelling of a [`Frame`].

use super::Frame;

/// Appends the canonical RESP encoding of `frame` to `out`. For any frame
/// [`parse`](super::parse) returned, this reproduces the parsed bytes exactly. Frames built
/// by hand must respect RESP: no CR in simple strings, errors, doubles or big
/// numbers.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    match frame {
        Frame::Simple(s) => put_line(out, b'+', s),
        Frame::Error(s) => put_line(out, b'-', s),
        Frame::Integer(n) => {
            out.push(b':');
            put_int(out, *n);
            out.extend_from_slice(b"\r\n");
        }
        Frame::Bulk(b) => put_bulk(out, b'$', b"", b),
        Frame::NullBulk => out.extend_from_slice(b"$-1\r\n"),
        Frame::Array(items) => put_items(out, b'*', items),
        Frame::NullArray => out.extend_from_slice(b"*-1\r\n"),
        Frame::Null => out.extend_from_slice(b"_\r\n"),
        Frame::Boolean(true) => out.extend_from_slice(b"#t\r\n"),
        Frame::Boolean(false) => out.extend_from_slice(b"#f\r\n"),
        Frame::Double(s) => put_line(out, b',', s),
        Frame::BigNumber(s) => put_line(out, b'(', s),
        Frame::BulkError(b) => put_bulk(out, b'!', b"", b),
        Frame::Verbatim { format, text } => {
            let [f0, f1, f2] = *format;
            put_bulk(out, b'=', &[f0, f1, f2, b':'], text);
        }
        Frame::Map(entries) => put_pairs(out, b'%', entries),
        Frame::Set(items) => put_items(out, b'~', items),
        Frame::Attribute { attrs, frame } => {
            put_pairs(out, b'|', attrs);
            encode(frame, out);
        }
        Frame::Push(items) => put_items(out, b'>', items),
    }
}

fn put_line(out: &mut Vec<u8>, kind: u8, s: &[u8]) {
    out.push(kind);
    out.extend_from_slice(s);
    out.extend_from_slice(b"\r\n");
}

fn put_header(out: &mut Vec<u8>, kind: u8, len: usize) {
    out.push(kind);
    put_int(out, i64::try_from(len).unwrap_or(i64::MAX));
    out.extend_from_slice(b"\r\n");
}

fn put_bulk(out: &mut Vec<u8>, kind: u8, prefix: &[u8], body: &[u8]) {
    put_header(out, kind, prefix.len() + body.len());
    out.extend_from_slice(prefix);
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
}

fn put_items(out: &mut Vec<u8>, kind: u8, items: &[Frame]) {
    put_header(out, kind, items.len());
    for item in items {
        encode(item, out);
    }
}

fn put_pairs(out: &mut Vec<u8>, kind: u8, pairs: &[(Frame, Frame)]) {
    put_header(out, kind, pairs.len());
    for (key, value) in pairs {
        encode(key, out);
        encode(value, out);
    }
}

/// Writes `n` in decimal without going through `format!` (no allocation).
fn put_int(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}
