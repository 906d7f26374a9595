//! Response digests for the outcome comparison, with the route's ignore
//! rules applied first: a handler that stamps `"processed_at"` or a random
//! request id into its answer would otherwise differ on every call, and the
//! diff would report noise as mismatches.
//!
//! With no rules the digest is the SHA-256 of the body as received. With
//! rules: a JSON body loses the fields at `ignore_fields` (JSON pointers, `*`
//! matching any key or index) and is re-serialized with sorted keys; then
//! every match of `ignore_patterns` is blanked out of the text.

use regex::Regex;
use serde_json::Value;

use crate::config::DiffConfig;
use crate::shadow::digest_hex;

/// Computes a route's response digests.
#[derive(Debug, Clone, Default)]
pub struct Digester {
    fields: Vec<Vec<String>>,
    patterns: Vec<Regex>,
}

impl Digester {
    /// The digester of a route's `[routes.diff]` (validated at config load,
    /// so a bad pattern cannot reach here; one that does is skipped).
    pub fn new(cfg: &DiffConfig) -> Digester {
        Digester {
            fields: cfg
                .ignore_fields
                .iter()
                .map(|p| p.split('/').skip(1).map(unescape).collect())
                .collect(),
            patterns: cfg
                .ignore_patterns
                .iter()
                .filter_map(|p| Regex::new(p).ok())
                .collect(),
        }
    }

    /// Whether any rule applies (without rules, bodies can be hashed as they stream).
    pub fn has_rules(&self) -> bool {
        !self.fields.is_empty() || !self.patterns.is_empty()
    }

    /// Hex SHA-256 of `body` after the ignore rules.
    pub fn digest(&self, body: &[u8]) -> String {
        if !self.has_rules() {
            return digest_hex(body);
        }
        let mut text: Vec<u8> = body.to_vec();
        if !self.fields.is_empty() {
            if let Ok(mut value) = serde_json::from_slice::<Value>(body) {
                for path in &self.fields {
                    remove(&mut value, path);
                }
                // serde_json's map is ordered by key: the same object always
                // serializes to the same bytes, whatever order it came in.
                text = serde_json::to_vec(&value).unwrap_or(text);
            }
        }
        if !self.patterns.is_empty() {
            let mut s = String::from_utf8_lossy(&text).into_owned();
            for re in &self.patterns {
                s = re.replace_all(&s, "").into_owned();
            }
            text = s.into_bytes();
        }
        digest_hex(&text)
    }
}

/// JSON pointer escapes: `~1` is `/`, `~0` is `~`.
fn unescape(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}

/// Removes what `path` points at; `*` walks every key or index.
fn remove(value: &mut Value, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match value {
        Value::Object(map) if rest.is_empty() && first != "*" => {
            map.remove(first);
        }
        Value::Object(map) if rest.is_empty() => map.clear(),
        Value::Object(map) if first == "*" => map.values_mut().for_each(|v| remove(v, rest)),
        Value::Object(map) => {
            if let Some(v) = map.get_mut(first) {
                remove(v, rest);
            }
        }
        Value::Array(items) if first == "*" && rest.is_empty() => items.clear(),
        Value::Array(items) if first == "*" => items.iter_mut().for_each(|v| remove(v, rest)),
        Value::Array(items) => {
            if let Some(i) = first.parse::<usize>().ok().filter(|i| *i < items.len()) {
                if rest.is_empty() {
                    // Blank rather than shift: later indexes keep their meaning.
                    items[i] = Value::Null;
                } else {
                    remove(&mut items[i], rest);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CutoverConfig;

    fn digester(fields: &[&str], patterns: &[&str]) -> Digester {
        let mut cfg = CutoverConfig::default().diff;
        cfg.ignore_fields = fields.iter().map(|s| s.to_string()).collect();
        cfg.ignore_patterns = patterns.iter().map(|s| s.to_string()).collect();
        Digester::new(&cfg)
    }

    #[test]
    fn without_rules_it_is_the_plain_sha256() {
        assert_eq!(Digester::default().digest(b"abc"), digest_hex(b"abc"));
    }

    #[test]
    fn ignored_fields_and_key_order_do_not_matter() {
        let d = digester(&["/at", "/items/*/id"], &[]);
        let a = br#"{"ok":true,"at":"2026-01-01T00:00:00Z","items":[{"id":"x1","n":1}]}"#;
        let b = br#"{"items":[{"n":1,"id":"y2"}],"at":"2027-05-05T00:00:00Z","ok":true}"#;
        assert_eq!(d.digest(a), d.digest(b));
        let c = br#"{"ok":false,"at":"x","items":[{"id":"x1","n":1}]}"#;
        assert_ne!(d.digest(a), d.digest(c));
    }

    #[test]
    fn patterns_blank_volatile_text() {
        let d = digester(&[], &[r"req-[0-9a-f]+"]);
        assert_eq!(d.digest(b"done req-abc123"), d.digest(b"done req-99ff"));
        assert_ne!(d.digest(b"done req-1"), d.digest(b"failed req-1"));
    }

    #[test]
    fn non_json_bodies_keep_their_bytes_under_field_rules() {
        let d = digester(&["/at"], &[]);
        assert_eq!(d.digest(b"plain text"), digest_hex(b"plain text"));
    }
}
