//! Every relative link in the documentation points at something that
//! exists: the book (`docs/src`), README.md, ARCHITECTURE.md, CHANGELOG.md
//! and the adapters' docs. A link to a file must find the file (or folder);
//! a `#anchor` must name a heading of the target page, slugged the way
//! mdBook (and GitHub) slug them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    // A folder that cannot be read is a failure: a link check over nothing
    // would pass without checking a link.
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            // Build output and installed packages are not ours to check.
            if !["build", "book", "node_modules", "vendor"].contains(&name.as_str())
                && !name.starts_with('.')
                && !name.ends_with(".egg-info")
            {
                markdown_under(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

fn documents() -> Vec<PathBuf> {
    let mut docs = Vec::new();
    markdown_under(&root().join("docs/src"), &mut docs);
    markdown_under(&root().join("adapters"), &mut docs);
    for file in ["README.md", "ARCHITECTURE.md", "CHANGELOG.md"] {
        docs.push(root().join(file));
    }
    docs
}

/// The text outside fenced code blocks and inline code spans.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || line.starts_with("    ") && !line.trim_start().starts_with(['-', '*', '|']) {
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// The targets of inline links `[text](target)` and images.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut found = Vec::new();
    let mut rest = prose.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        found.push(target.to_string());
    }
    found
}

/// mdBook's heading ids: lowercase letters, digits, `_` and `-` kept,
/// whitespace made `-`, everything else dropped; repeats get `-1`, `-2`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim();
        // Link text only: `[text](target)` becomes `text`.
        let mut plain = String::new();
        let mut chars = heading.chars().peekable();
        while let Some(c) = chars.next() {
            if c == ']' && chars.peek() == Some(&'(') {
                for c in chars.by_ref() {
                    if c == ')' {
                        break;
                    }
                }
            } else {
                plain.push(c);
            }
        }
        let id: String = plain
            .chars()
            .filter_map(|c| {
                if c.is_alphanumeric() || c == '_' || c == '-' {
                    Some(c.to_lowercase().next().unwrap())
                } else if c.is_whitespace() {
                    Some('-')
                } else {
                    None
                }
            })
            .collect();
        let mut unique = id.clone();
        let mut n = 1;
        while ids.contains(&unique) {
            unique = format!("{id}-{n}");
            n += 1;
        }
        ids.insert(unique);
    }
    ids
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let docs = documents();
    assert!(docs.len() > 30, "found only {} documents", docs.len());
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let shown = doc.strip_prefix(root()).unwrap().display().to_string();
        for target in links(&text) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            if !path.exists() {
                broken.push(format!("{shown}: {target} (no such file)"));
                continue;
            }
            if let Some(anchor) = anchor {
                if path.extension().is_some_and(|e| e == "md") {
                    let ids = anchors(&std::fs::read_to_string(&path).unwrap());
                    if !ids.contains(anchor) {
                        broken.push(format!("{shown}: {target} (no such heading)"));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_book_page_is_in_the_summary() {
    let summary = std::fs::read_to_string(root().join("docs/src/SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    let mut pages = Vec::new();
    markdown_under(&root().join("docs/src"), &mut pages);
    let src = root().join("docs/src");
    let missing: Vec<String> = pages
        .iter()
        .map(|p| p.strip_prefix(&src).unwrap().display().to_string())
        .filter(|p| p != "SUMMARY.md" && !listed.contains(p))
        .collect();
    assert!(
        missing.is_empty(),
        "pages missing from SUMMARY.md: {missing:?}"
    );
}
