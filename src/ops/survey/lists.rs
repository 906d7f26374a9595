//! Plain lists no framework's layout explains: maybe hand-rolled queues
//! (producers LPUSH or RPUSH, workers BRPOP), maybe a capped log or a
//! timeline. Each gets a row and a guess at its format from a sample —
//! `json:/id` when every sampled item is a JSON object with an `id`, else
//! `raw` — and a human decides.
//!
//! qbridge's own lists (`qbridge:…`) are left out: they are not a team's
//! queues. Past [`MAX_ROWS`] plain lists only the longest get a row.

use std::collections::HashSet;

use redis::aio::ConnectionManager;

use super::read;
use super::report::{Found, Framework, QueueRow, Sizes};
use super::scan::Keyspace;
use super::Recognised;
use crate::error::Result;

/// Plain lists given a row (the longest): a keyspace of per-user lists
/// would otherwise print a million rows and sample each.
const MAX_ROWS: usize = 200;

/// Every list not in `taken` (the frameworks' lists, their private and
/// bookkeeping lists), one row each.
pub async fn recognise(
    conn: &mut ConnectionManager,
    space: &Keyspace,
    taken: &HashSet<Vec<u8>>,
) -> Result<Option<Recognised>> {
    let plain: Vec<&[u8]> = space
        .lists
        .iter()
        .filter(|k| !taken.contains(*k) && !k.starts_with(b"qbridge:"))
        .map(Vec::as_slice)
        .collect();
    if plain.is_empty() {
        return Ok(None);
    }
    let lengths = read::lengths(conn, &plain).await?;
    let mut by_length: Vec<(&[u8], u64)> = plain.into_iter().zip(lengths).collect();
    by_length.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let left_out = by_length.len().saturating_sub(MAX_ROWS);
    by_length.truncate(MAX_ROWS);
    by_length.sort();
    let mut rows = Vec::new();
    for (key, len) in by_length {
        let name = super::report::printable(key);
        let mut row = QueueRow::new(Framework::List, "", &name, key.to_vec());
        row.waiting = len;
        let items = read::sample(conn, key, len).await?;
        row.payload = Sizes::of_lengths(items.iter().map(|i| i.len() as u64).collect(), "items");
        row.format_guess = Some(guess_format(&items).into());
        row.notes
            .push("a plain list: check that it is a queue, and which end producers push to".into());
        rows.push(row);
    }
    let mut found = Found::new(Framework::List, "");
    if left_out > 0 {
        found.options.push(format!(
            "{left_out} more plain lists not shown: the {MAX_ROWS} longest are"
        ));
    }
    Ok(Some(Recognised {
        found,
        rows,
        claimed: Vec::new(),
    }))
}

/// `json:/id` when every item is a JSON object with an `id` (a string or a
/// number), else `raw`.
pub(super) fn guess_format(items: &[Vec<u8>]) -> &'static str {
    let has_id = |item: &Vec<u8>| {
        serde_json::from_slice::<serde_json::Value>(item)
            .ok()
            .and_then(|v| {
                v.get("id")
                    .map(|id| id.is_string() || id.is_u64() || id.is_i64())
            })
            .unwrap_or(false)
    };
    if !items.is_empty() && items.iter().all(has_id) {
        "json:/id"
    } else {
        "raw"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_with_an_id_read_as_json_else_raw() {
        let json = vec![br#"{"id":"a","x":1}"#.to_vec(), br#"{"id":7}"#.to_vec()];
        assert_eq!(guess_format(&json), "json:/id");
        let mixed = vec![br#"{"id":"a"}"#.to_vec(), b"plain".to_vec()];
        assert_eq!(guess_format(&mixed), "raw");
        assert_eq!(guess_format(&[]), "raw");
    }
}
