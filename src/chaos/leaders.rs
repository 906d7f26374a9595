//! Who led which maintenance pass, read back from the processes' logs:
//! every pass a process leads is logged as `led task=… since=… until=…`
//! (`queue::leader::Led`), the interval lying inside the advisory lock's
//! hold. Two processes' intervals of one task that overlap are two leaders
//! at once, a broken promise.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, Utc};

/// One led pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    pub process: String,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

/// Every led pass in the `*.log` files of `dir`, by task.
pub fn read(dir: &Path) -> BTreeMap<String, Vec<Pass>> {
    let line_re = regex::Regex::new(r#"\bled\b.*task="?([a-z-]+)"?.*since=(\S+).*until=(\S+)"#)
        .expect("a valid regex");
    let colours = regex::Regex::new("\x1b\\[[0-9;]*m").expect("a valid regex");
    let mut by_task: BTreeMap<String, Vec<Pass>> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return by_task;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("log") {
            continue;
        }
        let process = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for line in text.lines() {
            let line = colours.replace_all(line, "");
            let Some(c) = line_re.captures(&line) else {
                continue;
            };
            let (Ok(since), Ok(until)) = (c[2].parse(), c[3].parse()) else {
                continue;
            };
            by_task.entry(c[1].to_string()).or_default().push(Pass {
                process: process.clone(),
                since,
                until,
            });
        }
    }
    by_task
}

/// Per task: the passes and processes that led, and every overlap of two
/// processes' passes (a violation each, with both intervals).
pub fn judge(by_task: &BTreeMap<String, Vec<Pass>>) -> (String, Vec<String>) {
    let mut said = Vec::new();
    let mut violations = Vec::new();
    for (task, passes) in by_task {
        let mut passes = passes.clone();
        passes.sort_by_key(|p| p.since);
        for pair in passes.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if b.since < a.until && a.process != b.process {
                violations.push(format!(
                    "two {task} leaders at once: {} {}..{} and {} {}..{}",
                    a.process, a.since, a.until, b.process, b.since, b.until
                ));
            }
        }
        let mut who: Vec<&str> = passes.iter().map(|p| p.process.as_str()).collect();
        who.sort_unstable();
        who.dedup();
        said.push(format!(
            "{task}: {} passes led by {}",
            passes.len(),
            who.join("/")
        ));
    }
    (said.join(", "), violations)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(process: &str, since: &str, until: &str) -> Pass {
        Pass {
            process: process.into(),
            since: since.parse().unwrap(),
            until: until.parse().unwrap(),
        }
    }

    #[test]
    fn overlapping_leaders_of_one_task_are_a_violation() {
        let mut by_task = BTreeMap::new();
        by_task.insert(
            "reaper".to_string(),
            vec![
                pass("w1", "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z"),
                pass("w2", "2026-01-01T00:00:02Z", "2026-01-01T00:00:03Z"),
            ],
        );
        let (said, violations) = judge(&by_task);
        assert!(violations.is_empty(), "{violations:?}");
        assert_eq!(said, "reaper: 2 passes led by w1/w2");
        by_task.get_mut("reaper").unwrap().push(pass(
            "w3",
            "2026-01-01T00:00:02.5Z",
            "2026-01-01T00:00:04Z",
        ));
        let (_, violations) = judge(&by_task);
        assert_eq!(violations.len(), 1, "{violations:?}");
    }

    #[test]
    fn reads_the_led_lines_of_a_text_log() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("w1.log"),
            "2026-11-26T14:00:00.1Z DEBUG qbridge::queue::leader: led task=\"reaper\" \
             since=2026-11-26T14:00:00.000100Z until=2026-11-26T14:00:00.000900Z\nnoise\n",
        )
        .unwrap();
        let read = read(dir.path());
        assert_eq!(read["reaper"].len(), 1);
        assert_eq!(read["reaper"][0].process, "w1");
    }
}
