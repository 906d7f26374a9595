//! The fleet adapters (`adapters/` in the repository), embedded in the
//! binary so `qbridge demo --framework` runs them as a team would: written
//! beside the demo's application, the Python package on `PYTHONPATH`, the
//! Ruby library on the load path.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// (path under the adapters' directory, source).
const FILES: &[(&str, &str)] = &[
    (
        "python/qbridge_adapters/__init__.py",
        include_str!("../../../adapters/python/qbridge_adapters/__init__.py"),
    ),
    (
        "python/qbridge_adapters/answer.py",
        include_str!("../../../adapters/python/qbridge_adapters/answer.py"),
    ),
    (
        "python/qbridge_adapters/celery.py",
        include_str!("../../../adapters/python/qbridge_adapters/celery.py"),
    ),
    (
        "python/qbridge_adapters/reporter.py",
        include_str!("../../../adapters/python/qbridge_adapters/reporter.py"),
    ),
    (
        "python/qbridge_adapters/live_guard.py",
        include_str!("../../../adapters/python/qbridge_adapters/live_guard.py"),
    ),
    (
        "python/qbridge_adapters/rq.py",
        include_str!("../../../adapters/python/qbridge_adapters/rq.py"),
    ),
    (
        "python/qbridge_adapters/runner.py",
        include_str!("../../../adapters/python/qbridge_adapters/runner.py"),
    ),
    (
        "python/qbridge_adapters/settings.py",
        include_str!("../../../adapters/python/qbridge_adapters/settings.py"),
    ),
    (
        "python/qbridge_adapters/shadow_mode.py",
        include_str!("../../../adapters/python/qbridge_adapters/shadow_mode.py"),
    ),
    (
        "ruby/lib/qbridge/reporter.rb",
        include_str!("../../../adapters/ruby/lib/qbridge/reporter.rb"),
    ),
    (
        "ruby/lib/qbridge/live_guard.rb",
        include_str!("../../../adapters/ruby/lib/qbridge/live_guard.rb"),
    ),
    (
        "ruby/lib/qbridge/sidekiq.rb",
        include_str!("../../../adapters/ruby/lib/qbridge/sidekiq.rb"),
    ),
    (
        "ruby/lib/qbridge/sidekiq_retry.rb",
        include_str!("../../../adapters/ruby/lib/qbridge/sidekiq_retry.rb"),
    ),
    (
        "ruby/lib/qbridge/version.rb",
        include_str!("../../../adapters/ruby/lib/qbridge/version.rb"),
    ),
    (
        "ruby/lib/qbridge/sidekiq_runner.rb",
        include_str!("../../../adapters/ruby/lib/qbridge/sidekiq_runner.rb"),
    ),
    (
        "ruby/bin/qbridge-sidekiq-runner",
        include_str!("../../../adapters/ruby/bin/qbridge-sidekiq-runner"),
    ),
];

/// Where the written adapters are.
#[derive(Debug, Clone)]
pub(in crate::demo) struct Written {
    /// On `PYTHONPATH`: holds `qbridge_adapters`.
    pub python: PathBuf,
    /// On Ruby's load path: holds `qbridge/`.
    pub ruby_lib: PathBuf,
    /// The Sidekiq runner's script.
    pub sidekiq_runner: PathBuf,
}

/// Writes every adapter file under `dir/adapters`.
pub(in crate::demo) fn write(dir: &Path) -> Result<Written> {
    let root = dir.join("adapters");
    for (path, source) in FILES {
        let file = root.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| cannot(path, e))?;
        }
        std::fs::write(&file, source).map_err(|e| cannot(path, e))?;
    }
    Ok(Written {
        python: root.join("python"),
        ruby_lib: root.join("ruby/lib"),
        sidekiq_runner: root.join("ruby/bin/qbridge-sidekiq-runner"),
    })
}

fn cannot(path: &str, e: std::io::Error) -> Error {
    Error::Environment(format!("cannot write the demo's adapters/{path}: {e}"))
}

#[cfg(test)]
mod tests {
    /// Every adapter source in the repository is embedded: a file added to
    /// `adapters/` and not listed here would be missing from the demo.
    #[test]
    fn every_adapter_file_is_embedded() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("adapters");
        let mut on_disk = Vec::new();
        for sub in ["python/qbridge_adapters", "ruby/lib/qbridge", "ruby/bin"] {
            for entry in std::fs::read_dir(root.join(sub)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "pyc") || path.is_dir() {
                    continue;
                }
                on_disk.push(
                    path.strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
        on_disk.sort();
        let mut embedded: Vec<String> = super::FILES.iter().map(|(p, _)| p.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }
}
