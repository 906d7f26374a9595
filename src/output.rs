//! Small output helpers: plain text for people, JSON for scripts, progress bars
//! only on a terminal.

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

/// Prints a value as pretty JSON on stdout.
pub fn json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("error: cannot render JSON: {e}"),
    }
}

/// Prints a one-line success message (or `{"ok": true, "message": …}`).
pub fn done(as_json: bool, message: &str) {
    if as_json {
        json(&serde_json::json!({ "ok": true, "message": message }));
    } else {
        println!("{message}");
    }
}

/// A progress bar on stderr, hidden when stderr is not a terminal or output is JSON.
pub fn progress(total: u64, as_json: bool, what: &str) -> ProgressBar {
    use std::io::IsTerminal;
    if as_json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// Formats a table with left-aligned columns.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push('\n');
        out.push_str(&line(row.clone()));
    }
    out
}
