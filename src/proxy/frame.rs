//! RESP2/RESP3 frame codec for the transparent proxy.
//!
//! The proxy forwards every byte exactly as it arrived; it parses only to find
//! where each command and each reply ends (pipelining pairs the n-th reply with
//! the n-th command) and to read the arguments of the pushes it mirrors. So the
//! codec keeps three promises:
//!
//! - **Exact boundaries.** `consumed` is the length of the frame's original
//!   bytes. Lengths and integers are accepted only in their canonical spelling
//!   (as Redis's `string2ll` does) and doubles and big numbers keep their text,
//!   so [`encode`] of any parsed frame gives back the very same bytes.
//! - **Bounded memory.** A length header is checked against [`Limits`] as soon
//!   as it is read, and nothing is allocated for a frame until all of its bytes
//!   are in the buffer: an incomplete frame is only scanned, never built.
//! - **No recursion on input.** Nesting is tracked on an explicit stack and
//!   capped by [`Limits::max_depth`], so a depth bomb is an error, not a stack
//!   overflow.
//!
//! Parsing is incremental: `Ok(None)` means "read more, then call again". The
//! stateless [`parse`] rescans from the start each time; a [`Decoder`] resumes
//! where it stopped, which keeps a large reply that arrives in many reads
//! linear instead of quadratic. Client commands go through [`parse_command`],
//! which also accepts the inline form Redis accepts from telnet.

mod command;
mod decode;
mod encode;
#[cfg(test)]
mod tests;

pub use command::{command_name, parse_command};
pub use decode::{parse, Decoder};
pub use encode::encode;

use bytes::Bytes;
use thiserror::Error;

/// Nesting is never allowed deeper than this, whatever [`Limits::max_depth`]
/// says: parsed frames are encoded, compared and dropped recursively, and this
/// many levels stay far inside a 2 MiB thread stack.
pub const DEPTH_CAP: usize = 1024;

/// One RESP value. Payloads are [`Bytes`] because nothing in RESP promises
/// UTF-8 and job payloads must survive byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `+OK` — a status line (never contains CR).
    Simple(Bytes),
    /// `-ERR message` — an error line, code included.
    Error(Bytes),
    /// `:42`
    Integer(i64),
    /// `$3\r\nfoo` — a binary-safe string.
    Bulk(Bytes),
    /// `$-1` — RESP2's nil string (GET of a missing key).
    NullBulk,
    /// `*2 ...`
    Array(Vec<Frame>),
    /// `*-1` — RESP2's nil array (BLPOP timing out).
    NullArray,
    /// `_` — RESP3's null.
    Null,
    /// `#t` / `#f`
    Boolean(bool),
    /// `,3.14` — kept as the text the server sent, so it re-encodes exactly.
    Double(Bytes),
    /// `(12345678901234567890` — kept as text, like [`Frame::Double`].
    BigNumber(Bytes),
    /// `!21\r\nSYNTAX invalid syntax` — a binary-safe error.
    BulkError(Bytes),
    /// `=15\r\ntxt:Some string` — `format` is the three bytes before the `:`.
    Verbatim { format: [u8; 3], text: Bytes },
    /// `%2 ...` — key/value pairs in wire order (order matters for re-encoding).
    Map(Vec<(Frame, Frame)>),
    /// `~3 ...`
    Set(Vec<Frame>),
    /// `|1 key value` and the frame it annotates. Kept as one frame because an
    /// attribute is not a reply by itself: counting it as one would shift every
    /// later reply onto the wrong command.
    Attribute {
        attrs: Vec<(Frame, Frame)>,
        frame: Box<Frame>,
    },
    /// `>3 ...` — out-of-band data (pub/sub messages, tracking invalidations).
    Push(Vec<Frame>),
}

impl Frame {
    /// Whether this is an error reply (`-` or `!`), looking through attributes.
    pub fn is_error(&self) -> bool {
        match self {
            Frame::Error(_) | Frame::BulkError(_) => true,
            Frame::Attribute { frame, .. } => frame.is_error(),
            _ => false,
        }
    }

    /// The value of an integer reply (such as LPUSH's new list length),
    /// looking through attributes.
    pub fn as_integer(&self) -> Option<i64> {
        match self {
            Frame::Integer(n) => Some(*n),
            Frame::Attribute { frame, .. } => frame.as_integer(),
            _ => None,
        }
    }

    /// The frame's canonical encoding; see [`encode`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        encode(self, &mut out);
        out
    }
}

/// How much one frame may ask for. Every limit is checked when the header
/// that declares it is read, before the bytes it announces arrive.
///
/// The defaults suit client commands. Replies come from Redis, which allows
/// 512 MiB values and lists of any length, so a reader of replies may want
/// looser limits (or only [`Decoder::frame_len`], which builds nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest payload of a bulk string, bulk error or verbatim string. Redis
    /// allows 512 MiB; a job payload has no business near that, and this is
    /// what bounds one argument in memory.
    pub max_bulk_len: usize,
    /// Most frames directly inside one aggregate (a map entry counts as two).
    pub max_elements: usize,
    /// Deepest nesting of aggregates (1 allows a flat array), never more than
    /// [`DEPTH_CAP`].
    pub max_depth: usize,
    /// Longest line without its line ending: an inline command, a simple
    /// string, an error, a number or a length header. Also bounds how long the
    /// parser waits for a line ending before calling the input malformed.
    pub max_inline_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_len: 64 * 1024 * 1024,
            max_elements: 1_048_576,
            max_depth: 64,
            max_inline_len: 64 * 1024,
        }
    }
}

impl Limits {
    fn depth(&self) -> usize {
        self.max_depth.min(DEPTH_CAP)
    }
}

/// Malformed or over-limit input. The connection it came from cannot be
/// resynchronised and must be closed, after sending [`ProtocolError::reply`]
/// when it came from a client. Messages follow Redis's own wording where Redis
/// has one, and never contain CR or LF (bytes are shown escaped).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// An aggregate count that is not a number, is negative (other than the
    /// RESP2 nil `*-1`) or is over [`Limits::max_elements`].
    #[error("protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    /// A bulk length that is not a number, is negative (other than the RESP2
    /// nil `$-1` in a reply) or is over [`Limits::max_bulk_len`].
    #[error("protocol error: invalid bulk length")]
    InvalidBulkLength,
    /// A command argument that is not a bulk string.
    #[error("protocol error: expected '$', got '{}'", char::from(*.0).escape_default())]
    ExpectedBulk(u8),
    /// A frame starting with a byte that is no RESP type.
    #[error("protocol error: unexpected type byte '{}'", char::from(*.0).escape_default())]
    UnexpectedType(u8),
    /// A line or bulk payload not followed by CRLF.
    #[error("protocol error: expected CRLF")]
    ExpectedCrlf,
    /// An inline command longer than [`Limits::max_inline_len`].
    #[error("protocol error: too big inline request")]
    InlineTooLong,
    /// A line of a RESP frame longer than [`Limits::max_inline_len`].
    #[error("protocol error: too big line")]
    LineTooLong,
    /// An inline command with a quote that is not closed, or closed and
    /// directly followed by something other than a space.
    #[error("protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// An integer frame that is not a canonical 64-bit number.
    #[error("protocol error: invalid integer")]
    InvalidInteger,
    /// A double frame that is not a number, `inf` or `nan`.
    #[error("protocol error: invalid double")]
    InvalidDouble,
    /// A boolean frame other than `#t` or `#f`.
    #[error("protocol error: invalid boolean")]
    InvalidBoolean,
    /// A big number frame that is not an optionally signed run of digits.
    #[error("protocol error: invalid big number")]
    InvalidBigNumber,
    /// A null frame with something between `_` and CRLF.
    #[error("protocol error: invalid null")]
    InvalidNull,
    /// A verbatim string without its `xxx:` format prefix.
    #[error("protocol error: invalid verbatim string")]
    InvalidVerbatim,
    /// Aggregates nested deeper than [`Limits::max_depth`].
    #[error("protocol error: nesting too deep")]
    TooDeep,
    /// A [`Decoder`] was handed a buffer that does not extend the one it was
    /// scanning (a bug in the caller, not bad input).
    #[error("protocol error: decoder resumed on a different buffer")]
    Desync,
}

impl ProtocolError {
    /// The error reply to send a client before closing its connection, in the
    /// form Redis itself uses: `-ERR Protocol error: ...\r\n`.
    pub fn reply(&self) -> Vec<u8> {
        let message = self.to_string();
        let detail = message.strip_prefix("protocol error: ").unwrap_or(&message);
        format!("-ERR Protocol error: {detail}\r\n").into_bytes()
    }
}
