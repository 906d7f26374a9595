//! Client commands: what Redis's own request parser accepts, read the way it
//! reads them (`processMultibulkBuffer` / `processInlineBuffer`), so the proxy
//! sees the very arguments Redis will see — a mirrored push must store what
//! Redis stored.

use bytes::Bytes;

use super::decode::{bulk, parse_int, read_line};
use super::{Limits, ProtocolError};

/// Longer than any Redis command name; longer first arguments are not copied.
const MAX_NAME_LEN: usize = 64;

/// Reads the first client command of `buf`: `Ok(None)` if it is not complete
/// yet, otherwise its arguments and the exact number of bytes it took.
///
/// Like Redis, a buffer starting with `*` holds an array of bulk strings and
/// anything else is an inline command: one line of words separated by spaces,
/// ending in `\n` or `\r\n`, with Redis's double and single quoting. Empty
/// `args` mean bytes Redis skips without replying (a blank line, `*0`, `*-1`):
/// forward or drop them, but expect no reply for them.
pub fn parse_command(
    buf: &[u8],
    limits: &Limits,
) -> Result<Option<(Vec<Bytes>, usize)>, ProtocolError> {
    match buf.first() {
        None => Ok(None),
        Some(b'*') => multibulk(buf, limits),
        Some(_) => inline(buf, limits),
    }
}

/// The command's name (its first argument) in ASCII upper case, for matching
/// against names like `LPUSH`. `None` for an empty command, or a first argument
/// that cannot be a command name (not ASCII, or longer than any command).
pub fn command_name(args: &[Bytes]) -> Option<String> {
    let name = args.first()?;
    if name.len() > MAX_NAME_LEN || !name.is_ascii() {
        return None;
    }
    Some(
        name.iter()
            .map(|&b| char::from(b.to_ascii_uppercase()))
            .collect(),
    )
}

fn multibulk(buf: &[u8], limits: &Limits) -> Result<Option<(Vec<Bytes>, usize)>, ProtocolError> {
    let Some((line, mut pos)) = read_line(buf, 1, limits.max_inline_len)? else {
        return Ok(None);
    };
    let count = match parse_int(line) {
        // Redis reads these as an empty request and carries on.
        Some(-1 | 0) => return Ok(Some((Vec::new(), pos))),
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|&n| n <= limits.max_elements)
            .ok_or(ProtocolError::InvalidMultibulkLength)?,
        None => return Err(ProtocolError::InvalidMultibulkLength),
    };
    // Only spans of arguments already complete are recorded, so a huge count
    // reserves nothing up front.
    let mut spans = Vec::new();
    for _ in 0..count {
        match buf.get(pos) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&other) => return Err(ProtocolError::ExpectedBulk(other)),
        }
        let Some((body, next)) = bulk(buf, pos + 1, limits, false)? else {
            return Ok(None);
        };
        let len = body.map_or(0, <[u8]>::len);
        spans.push((next - 2 - len, next - 2));
        pos = next;
    }
    // One copy of the whole command; the arguments are slices of it.
    let src = Bytes::copy_from_slice(&buf[..pos]);
    let args = spans.into_iter().map(|(s, e)| src.slice(s..e)).collect();
    Ok(Some((args, pos)))
}

fn inline(buf: &[u8], limits: &Limits) -> Result<Option<(Vec<Bytes>, usize)>, ProtocolError> {
    let max = limits.max_inline_len;
    // Search no further than the longest legal line plus its CRLF.
    let window = &buf[..buf.len().min(max.saturating_add(2))];
    let Some(newline) = window.iter().position(|&b| b == b'\n') else {
        // A trailing CR may be the start of the line ending, not content.
        let pending = buf.len() - usize::from(buf.last() == Some(&b'\r'));
        return if pending > max {
            Err(ProtocolError::InlineTooLong)
        } else {
            Ok(None)
        };
    };
    let mut line = &buf[..newline];
    if let [rest @ .., b'\r'] = line {
        line = rest;
    }
    if line.len() > max {
        return Err(ProtocolError::InlineTooLong);
    }
    // Redis splits the line as a C string: a NUL ends it early.
    if let Some(nul) = line.iter().position(|&b| b == 0) {
        line = &line[..nul];
    }
    let args = split_args(line).ok_or(ProtocolError::UnbalancedQuotes)?;
    Ok(Some((
        args.into_iter().map(Bytes::from).collect(),
        newline + 1,
    )))
}

/// C's `isspace` in the C locale.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn hex_digit(b: Option<&u8>) -> Option<u8> {
    char::from(*b?)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Splits an inline command into arguments exactly like Redis's
/// `sdssplitargs`: words separated by blanks; `"..."` with `\xHH`, `\n`, `\r`,
/// `\t`, `\b`, `\a` and `\<any>` escapes; `'...'` with only `\'`. A closing
/// quote must be followed by a blank or the end. `None` for unbalanced quotes.
fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while line.get(i).copied().is_some_and(is_space) {
            i += 1;
        }
        if i >= line.len() {
            return Some(args);
        }
        let mut arg = Vec::new();
        let (mut in_double, mut in_single, mut done) = (false, false, false);
        while !done {
            let c = line.get(i).copied();
            let next = line.get(i + 1).copied();
            if in_double {
                let hex = match (c, next) {
                    (Some(b'\\'), Some(b'x')) => hex_digit(line.get(i + 2))
                        .zip(hex_digit(line.get(i + 3)))
                        .map(|(hi, lo)| hi << 4 | lo),
                    _ => None,
                };
                match (c, next, hex) {
                    (_, _, Some(byte)) => {
                        arg.push(byte);
                        i += 3;
                    }
                    (Some(b'\\'), Some(escaped), None) => {
                        arg.push(match escaped {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                        i += 1;
                    }
                    (Some(b'"'), next, None) if next.is_none_or(is_space) => done = true,
                    (Some(b'"'), _, None) | (None, _, _) => return None,
                    (Some(other), _, None) => arg.push(other),
                }
            } else if in_single {
                match (c, next) {
                    (Some(b'\\'), Some(b'\'')) => {
                        arg.push(b'\'');
                        i += 1;
                    }
                    (Some(b'\''), next) if next.is_none_or(is_space) => done = true,
                    (Some(b'\''), _) | (None, _) => return None,
                    (Some(other), _) => arg.push(other),
                }
            } else {
                match c {
                    None | Some(b' ' | b'\n' | b'\r' | b'\t') => done = true,
                    Some(b'"') => in_double = true,
                    Some(b'\'') => in_single = true,
                    Some(other) => arg.push(other),
                }
            }
            // As in the C original: step past the current byte, including the
            // closing quote or the blank that ended the word.
            if i < line.len() {
                i += 1;
            }
        }
        args.push(arg);
    }
}
