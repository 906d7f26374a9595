//! The entries of a route's gap list (`qbridge:gap:<route>`): an item whose
//! mirror write failed, with the write id it was given before its first
//! attempt. Writing the entry again (gap repair's trim failed, the failed
//! commit had in fact committed) then finds the same write in
//! `qbridge.numbered_writes` instead of numbering the bytes again.
//!
//! An entry is `MAGIC`, the write id, a newline, then the item's bytes
//! unchanged. An entry without `MAGIC` is an item parked by a version before
//! write ids (the item as it is, no id).

use bytes::Bytes;

/// Starts every entry written by this version. A NUL byte first: no JSON
/// item (Sidekiq, Celery, RQ, Resque) can begin with it.
const MAGIC: &[u8] = b"\0qbridge-write:";

/// One parked item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapEntry {
    /// Its write id, when it has one.
    pub write: Option<String>,
    /// The item's bytes, as Redis holds them.
    pub item: Bytes,
}

/// The entry of `item` written as `write`.
pub fn encode(write: &str, item: &[u8]) -> Vec<u8> {
    let mut entry = Vec::with_capacity(MAGIC.len() + write.len() + 1 + item.len());
    entry.extend_from_slice(MAGIC);
    entry.extend_from_slice(write.as_bytes());
    entry.push(b'\n');
    entry.extend_from_slice(item);
    entry
}

/// Reads an entry back (see the module docs for entries without an id).
pub fn decode(entry: Bytes) -> GapEntry {
    if let Some(rest) = entry.strip_prefix(MAGIC) {
        if let Some(end) = rest.iter().position(|&b| b == b'\n') {
            if let Ok(write) = std::str::from_utf8(&rest[..end]) {
                let start = MAGIC.len() + end + 1;
                return GapEntry {
                    write: Some(write.to_string()),
                    item: entry.slice(start..),
                };
            }
        }
    }
    GapEntry {
        write: None,
        item: entry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_as_written() {
        let entry = encode("w1.0", b"{\"class\":\"A\",\"args\":[]}\n");
        let read = decode(Bytes::from(entry));
        assert_eq!(read.write.as_deref(), Some("w1.0"));
        assert_eq!(&read.item[..], b"{\"class\":\"A\",\"args\":[]}\n");
    }

    #[test]
    fn an_item_parked_before_write_ids_is_the_item() {
        let read = decode(Bytes::from_static(b"plain bytes"));
        assert_eq!(read.write, None);
        assert_eq!(&read.item[..], b"plain bytes");
    }
}
