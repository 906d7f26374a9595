//! The layer check: every module of `src/` imports only from layers below
//! its own, so the graph of top-level modules has no loop and nothing runs
//! back up (ARCHITECTURE.md draws the same table). It reads the source as
//! text: every `crate::<module>` path outside comments counts, whether in a
//! `use` line or written inline.
//!
//! When you add a top-level module, give it a layer here and in
//! ARCHITECTURE.md; a module missing from the table fails the check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bottom first. A module may use modules of lower layers only (never one
/// of its own layer: two modules that need each other are one module).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "plumbing",
        &[
            "error", "redact", "output", "shutdown", "periodic", "metrics",
        ],
    ),
    ("plumbing, second floor", &["secret", "telemetry"]),
    ("queue core", &["queue"]),
    ("schema", &["db"]),
    ("model", &["model"]),
    ("config", &["config"]),
    ("phase flag and outcomes", &["cutover", "shadow"]),
    ("routes and handlers", &["routes", "handler"]),
    ("routed items into jobs", &["ingest"]),
    ("Redis side", &["redis"]),
    ("mirror writer", &["mirror"]),
    (
        "operators, proxy, Postgres consumer",
        &["ops", "proxy", "worker"],
    ),
    ("HTTP", &["http"]),
    ("process assembly", &["app"]),
    ("the drill", &["demo"]),
    ("benchmarks and the fault suite", &["bench", "chaos"]),
    ("command line", &["cli"]),
    ("subcommands", &["commands"]),
];

/// Names the crate root re-exports, and the module each comes from.
const ROOT_REEXPORTS: &[(&str, &str)] = &[
    ("Error", "error"),
    ("Result", "error"),
    ("MIGRATOR", "queue"),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, mods)| mods.contains(&module))
}

/// The source with comments removed and string literals emptied (so a
/// URL's `//` is not taken for a comment, and a path in a string or an SQL
/// text is not taken for code).
fn strip_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) {
            // A raw string: r"…", r#"…"#, …
            let start = i;
            i += 1;
            let mut hashes = 0;
            while b.get(i) == Some(&b'#') {
                hashes += 1;
                i += 1;
            }
            if b.get(i) != Some(&b'"') {
                out.push_str(&src[start..i]);
                continue;
            }
            i += 1;
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            match src[i..].find(&close) {
                Some(end) => i += end + close.len(),
                None => i = b.len(),
            }
            let _ = start;
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            let start = i;
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            let _ = start;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A char literal such as '"' must not open a string.
            out.push_str(&src[i..i + 3]);
            i += 3;
        } else {
            let c = src[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The top-level modules a file's code names through `crate::`.
fn uses(src: &str) -> Vec<String> {
    let code = strip_comments(src);
    let mut found = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `qbridge_crate::`, `$crate::` and the like
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            // `use crate::{a, b}`: every name of the group.
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for part in group[..end].split(',') {
                    let first: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !first.is_empty() {
                        found.push(first);
                    }
                }
            }
            continue;
        }
        found.push(name);
    }
    found
        .into_iter()
        .map(|n| {
            ROOT_REEXPORTS
                .iter()
                .find(|(name, _)| *name == n)
                .map_or(n.clone(), |(_, module)| module.to_string())
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`src/redis/consumer/slot.rs` →
/// `redis`); `None` for the crate root and the binary.
fn module_of(src_dir: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src_dir).unwrap();
    let first = rel
        .components()
        .next()?
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    let name = first.trim_end_matches(".rs").to_string();
    (!matches!(name.as_str(), "lib" | "main")).then_some(name)
}

#[test]
fn every_module_imports_only_from_layers_below_it() {
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src_dir, &mut files);
    files.sort();
    let mut unplaced = BTreeMap::new();
    let mut upward = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src_dir, file) else {
            continue;
        };
        let Some(mine) = layer_of(&module) else {
            unplaced.insert(module, file.display().to_string());
            continue;
        };
        let src = std::fs::read_to_string(file).unwrap();
        for used in uses(&src) {
            if used == module {
                continue;
            }
            match layer_of(&used) {
                Some(theirs) if theirs < mine => {}
                Some(theirs) => upward.push(format!(
                    "{} ({}, layer {mine} \"{}\") uses crate::{used} (layer {theirs} \"{}\")",
                    file.strip_prefix(&src_dir).unwrap().display(),
                    module,
                    LAYERS[mine].0,
                    LAYERS[theirs].0
                )),
                None => unplaced
                    .insert(used, file.display().to_string())
                    .map_or((), |_| ()),
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules with no layer (add them to LAYERS and ARCHITECTURE.md): {unplaced:?}"
    );
    assert!(
        upward.is_empty(),
        "imports that do not run down the layers:\n{}",
        upward.join("\n")
    );
}

/// The check itself: it sees grouped and inline paths, and ignores
/// comments and strings.
#[test]
fn the_scanner_reads_paths_not_comments() {
    let src = r#"
        use crate::{queue::claim, error::Result};
        // crate::http in a comment
        /// [`crate::app`] in a doc comment
        let url = "redis://host/crate::nothing";
        let x = crate::metrics::QUEUE_LAG;
        let q = '"'; let y = crate::routes::Routes::default();
    "#;
    assert_eq!(uses(src), ["queue", "error", "metrics", "routes"]);
}

/// The queue core stays free of Redis, HTTP and the migration: the one
/// promise the rest of the layout is built around.
#[test]
fn the_queue_core_imports_no_redis_side() {
    let core = layer_of("queue").unwrap();
    for module in [
        "redis", "proxy", "http", "routes", "ingest", "mirror", "cutover", "model",
    ] {
        assert!(
            layer_of(module).unwrap() > core,
            "{module} must sit above the queue core"
        );
    }
}

/// ARCHITECTURE.md, "Long files and functions": no source file outside
/// tests is over 500 lines; an exception must be listed there by path.
#[test]
fn no_source_file_is_over_500_lines_unless_listed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut long = Vec::new();
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        if name == "tests.rs"
            || name.ends_with("_tests.rs")
            || file.components().any(|c| c.as_os_str() == "tests")
        {
            continue;
        }
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        let rel = file.strip_prefix(root).unwrap().display().to_string();
        if lines > 500 && !design.contains(&format!("`{rel}`")) {
            long.push(format!("{rel} ({lines} lines)"));
        }
    }
    assert!(
        long.is_empty(),
        "split these or list them in ARCHITECTURE.md: {long:?}"
    );
}
