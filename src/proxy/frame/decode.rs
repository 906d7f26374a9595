//! Parsing: a scanner that finds where a frame ends without building it, and
//! a builder that runs once the whole frame is in the buffer. Both walk the
//! same tokens with an explicit stack, never recursion.

use bytes::Bytes;

use super::{Frame, Limits, ProtocolError};

/// What reading one piece of input at a position gives: the piece and the
/// index just past it, or `None` while its bytes have not all arrived.
pub(super) type Step<T> = Result<Option<(T, usize)>, ProtocolError>;

/// Parses the first frame of `buf`: `Ok(None)` if it is not complete yet,
/// otherwise the frame and the exact number of bytes it took.
pub fn parse(buf: &[u8], limits: &Limits) -> Result<Option<(Frame, usize)>, ProtocolError> {
    Decoder::new(*limits).decode(buf)
}

/// An incremental parser that remembers how far it got, so each call scans
/// only the bytes that arrived since the last one.
///
/// Contract: until a call returns a frame (or an error), every call must be
/// given the same buffer with bytes appended at the end. After a frame is
/// returned the decoder starts afresh, so the caller drops the consumed bytes
/// and passes what follows.
#[derive(Debug, Clone)]
pub struct Decoder {
    limits: Limits,
    /// Bytes of the current frame scanned so far; always at a token boundary.
    pos: usize,
    /// Child frames still expected by each open aggregate, innermost last; its
    /// length is the current depth, so it never outgrows the depth limit.
    open: Vec<usize>,
}

impl Decoder {
    /// A decoder enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        Decoder {
            limits,
            pos: 0,
            open: Vec::new(),
        }
    }

    /// The length of the first frame of `buf` once it is complete, validating
    /// it but building nothing. Enough for forwarding replies that are not
    /// inspected, however large.
    pub fn frame_len(&mut self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        let result = if self.pos > buf.len() {
            Err(ProtocolError::Desync)
        } else {
            self.scan(buf)
        };
        if !matches!(result, Ok(None)) {
            self.pos = 0;
            self.open.clear();
        }
        result
    }

    /// Like [`parse`], resuming the scan where the last call stopped.
    pub fn decode(&mut self, buf: &[u8]) -> Result<Option<(Frame, usize)>, ProtocolError> {
        let Some(len) = self.frame_len(buf)? else {
            return Ok(None);
        };
        // Copy the frame once; its payloads are slices of that one copy.
        let src = Bytes::copy_from_slice(buf.get(..len).ok_or(ProtocolError::Desync)?);
        match build(&src, &self.limits)? {
            Some((frame, n)) if n == len => Ok(Some((frame, len))),
            _ => Err(ProtocolError::Desync),
        }
    }

    fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        loop {
            let Some((token, next)) = token(buf, self.pos, &self.limits)? else {
                return Ok(None);
            };
            self.pos = next;
            if let Token::Open(_, children) = token {
                if self.open.len() >= self.limits.depth() {
                    return Err(ProtocolError::TooDeep);
                }
                if children > 0 {
                    self.open.push(children);
                    continue;
                }
            }
            // A frame just ended: it fills one slot of each parent it completes.
            loop {
                match self.open.pop() {
                    None => return Ok(Some(self.pos)),
                    Some(1) => continue,
                    Some(left) => {
                        self.open.push(left - 1);
                        break;
                    }
                }
            }
        }
    }
}

/// Builds the frame at the start of `src`, which the scanner has already found
/// complete; the same checks run again, so it is safe on any input.
fn build(src: &Bytes, limits: &Limits) -> Result<Option<(Frame, usize)>, ProtocolError> {
    struct Open {
        agg: Agg,
        want: usize,
        items: Vec<Frame>,
    }
    let mut open: Vec<Open> = Vec::new();
    let mut pos = 0;
    loop {
        let Some((token, next)) = token(src, pos, limits)? else {
            return Ok(None);
        };
        pos = next;
        let mut frame = match token {
            Token::Leaf(leaf) => leaf.into_frame(src),
            Token::Open(agg, want) => {
                if open.len() >= limits.depth() {
                    return Err(ProtocolError::TooDeep);
                }
                // Every child takes at least 3 bytes ("_\r\n"), so a header can
                // never reserve more than the bytes present could fill.
                let items = Vec::with_capacity(want.min((src.len() - pos) / 3));
                if want > 0 {
                    open.push(Open { agg, want, items });
                    continue;
                }
                agg.finish(items)
            }
        };
        loop {
            let Some(mut parent) = open.pop() else {
                return Ok(Some((frame, pos)));
            };
            parent.items.push(frame);
            if parent.items.len() < parent.want {
                open.push(parent);
                break;
            }
            frame = parent.agg.finish(parent.items);
        }
    }
}

/// One step of the scanner: a whole leaf frame, or the header of an aggregate
/// followed by that many child frames.
enum Token<'a> {
    Leaf(Leaf<'a>),
    Open(Agg, usize),
}

/// A leaf frame whose payloads still borrow from the input.
enum Leaf<'a> {
    Simple(&'a [u8]),
    Error(&'a [u8]),
    Integer(i64),
    Bulk(&'a [u8]),
    NullBulk,
    NullArray,
    Null,
    Boolean(bool),
    Double(&'a [u8]),
    BigNumber(&'a [u8]),
    BulkError(&'a [u8]),
    Verbatim([u8; 3], &'a [u8]),
}

impl Leaf<'_> {
    /// `src` must be the buffer the leaf was read from (payloads are slices of it).
    fn into_frame(self, src: &Bytes) -> Frame {
        match self {
            Leaf::Simple(s) => Frame::Simple(src.slice_ref(s)),
            Leaf::Error(s) => Frame::Error(src.slice_ref(s)),
            Leaf::Integer(n) => Frame::Integer(n),
            Leaf::Bulk(s) => Frame::Bulk(src.slice_ref(s)),
            Leaf::NullBulk => Frame::NullBulk,
            Leaf::NullArray => Frame::NullArray,
            Leaf::Null => Frame::Null,
            Leaf::Boolean(b) => Frame::Boolean(b),
            Leaf::Double(s) => Frame::Double(src.slice_ref(s)),
            Leaf::BigNumber(s) => Frame::BigNumber(src.slice_ref(s)),
            Leaf::BulkError(s) => Frame::BulkError(src.slice_ref(s)),
            Leaf::Verbatim(format, s) => Frame::Verbatim {
                format,
                text: src.slice_ref(s),
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Agg {
    Array,
    Map,
    Set,
    Attribute,
    Push,
}

impl Agg {
    fn finish(self, items: Vec<Frame>) -> Frame {
        match self {
            Agg::Array => Frame::Array(items),
            Agg::Set => Frame::Set(items),
            Agg::Push => Frame::Push(items),
            Agg::Map => Frame::Map(pairs(items).0),
            Agg::Attribute => {
                let (attrs, last) = pairs(items);
                // An attribute header always asks for 2n+1 children, so the
                // annotated frame is there; Null only guards against a bug.
                let frame = Box::new(last.unwrap_or(Frame::Null));
                Frame::Attribute { attrs, frame }
            }
        }
    }
}

/// Pairs up `items`; an odd last item is returned apart.
fn pairs(items: Vec<Frame>) -> (Vec<(Frame, Frame)>, Option<Frame>) {
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    loop {
        match (it.next(), it.next()) {
            (Some(k), Some(v)) => out.push((k, v)),
            (last, _) => return (out, last),
        }
    }
}

/// Reads the token at `pos`, or `None` if its bytes are not all there yet.
fn token<'a>(buf: &'a [u8], pos: usize, limits: &Limits) -> Step<Token<'a>> {
    let Some(&kind) = buf.get(pos) else {
        return Ok(None);
    };
    let start = pos + 1;
    match kind {
        b'$' | b'!' | b'=' => {
            let Some((body, next)) = bulk(buf, start, limits, kind == b'$')? else {
                return Ok(None);
            };
            let leaf = match (kind, body) {
                (_, None) => Leaf::NullBulk,
                (b'$', Some(body)) => Leaf::Bulk(body),
                (b'!', Some(body)) => Leaf::BulkError(body),
                (_, Some([f0, f1, f2, b':', text @ ..])) => Leaf::Verbatim([*f0, *f1, *f2], text),
                (_, Some(_)) => return Err(ProtocolError::InvalidVerbatim),
            };
            Ok(Some((Token::Leaf(leaf), next)))
        }
        b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' | b'*' | b'%' | b'~' | b'|' | b'>' => {
            let Some((line, next)) = read_line(buf, start, limits.max_inline_len)? else {
                return Ok(None);
            };
            let leaf = match kind {
                b'+' => Leaf::Simple(line),
                b'-' => Leaf::Error(line),
                b':' => Leaf::Integer(parse_int(line).ok_or(ProtocolError::InvalidInteger)?),
                b'_' if line.is_empty() => Leaf::Null,
                b'_' => return Err(ProtocolError::InvalidNull),
                b'#' => match line {
                    b"t" => Leaf::Boolean(true),
                    b"f" => Leaf::Boolean(false),
                    _ => return Err(ProtocolError::InvalidBoolean),
                },
                b',' if is_double(line) => Leaf::Double(line),
                b',' => return Err(ProtocolError::InvalidDouble),
                b'(' if is_big_number(line) => Leaf::BigNumber(line),
                b'(' => return Err(ProtocolError::InvalidBigNumber),
                _ => return Ok(Some((aggregate(kind, line, limits)?, next))),
            };
            Ok(Some((Token::Leaf(leaf), next)))
        }
        other => Err(ProtocolError::UnexpectedType(other)),
    }
}

/// Reads an aggregate header's count, checked against the element limit.
fn aggregate<'a>(kind: u8, line: &[u8], limits: &Limits) -> Result<Token<'a>, ProtocolError> {
    let count = parse_int(line).ok_or(ProtocolError::InvalidMultibulkLength)?;
    if kind == b'*' && count == -1 {
        return Ok(Token::Leaf(Leaf::NullArray));
    }
    let (agg, per_entry) = match kind {
        b'*' => (Agg::Array, 1),
        b'~' => (Agg::Set, 1),
        b'>' => (Agg::Push, 1),
        b'%' => (Agg::Map, 2),
        _ => (Agg::Attribute, 2),
    };
    let children = usize::try_from(count)
        .ok()
        .and_then(|n| n.checked_mul(per_entry))
        .filter(|&n| n <= limits.max_elements)
        .ok_or(ProtocolError::InvalidMultibulkLength)?;
    // The annotated frame follows an attribute's pairs as one more child.
    let children = children + usize::from(matches!(agg, Agg::Attribute));
    Ok(Token::Open(agg, children))
}

/// Reads a length line at `start` and the payload it announces. The body is
/// `None` for the RESP2 nil `$-1`, accepted only where `nullable`.
pub(super) fn bulk<'a>(
    buf: &'a [u8],
    start: usize,
    limits: &Limits,
    nullable: bool,
) -> Step<Option<&'a [u8]>> {
    let Some((line, body)) = read_line(buf, start, limits.max_inline_len)? else {
        return Ok(None);
    };
    let len = match parse_int(line) {
        Some(-1) if nullable => return Ok(Some((None, body))),
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|&n| n <= limits.max_bulk_len)
            .ok_or(ProtocolError::InvalidBulkLength)?,
        None => return Err(ProtocolError::InvalidBulkLength),
    };
    // Only indexes are computed here: the payload is not touched, let alone
    // copied, until every byte of it has arrived.
    let end = body.saturating_add(len);
    match buf.get(end..end.saturating_add(2)) {
        None => Ok(None),
        Some(b"\r\n") => Ok(Some((Some(&buf[body..end]), end + 2))),
        Some(_) => Err(ProtocolError::ExpectedCrlf),
    }
}

/// Reads the line starting at `start` up to CRLF: the line without its CRLF
/// and the index after it, `None` while no CR has arrived yet.
pub(super) fn read_line(buf: &[u8], start: usize, max: usize) -> Step<&[u8]> {
    let rest = buf.get(start..).unwrap_or_default();
    // Look no further than a legal line could reach, so a stream without line
    // endings is refused once it passes the limit instead of piling up.
    let window = &rest[..rest.len().min(max.saturating_add(1))];
    match window.iter().position(|&b| b == b'\r') {
        Some(cr) => match rest.get(cr + 1) {
            None => Ok(None),
            Some(b'\n') => Ok(Some((&rest[..cr], start + cr + 2))),
            Some(_) => Err(ProtocolError::ExpectedCrlf),
        },
        None if rest.len() > max => Err(ProtocolError::LineTooLong),
        None => Ok(None),
    }
}

/// Parses a decimal i64 the way Redis's `string2ll` does: optional `-`, no `+`,
/// no leading zeros, no `-0`. Only the canonical spelling passes, which is what
/// makes re-encoding exact.
pub(super) fn parse_int(s: &[u8]) -> Option<i64> {
    let (negative, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, s),
    };
    match digits {
        [b'0'] if !negative => return Some(0),
        [b'1'..=b'9', ..] => {}
        _ => return None,
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let d = i64::from(d - b'0');
        // Accumulating negatively reaches i64::MIN without overflowing.
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(d)?
        } else {
            value.checked_add(d)?
        };
    }
    Some(value)
}

fn is_double(s: &[u8]) -> bool {
    std::str::from_utf8(s).is_ok_and(|s| s.parse::<f64>().is_ok())
}

fn is_big_number(s: &[u8]) -> bool {
    let digits = match s {
        [b'-' | b'+', rest @ ..] => rest,
        _ => s,
    };
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
}
