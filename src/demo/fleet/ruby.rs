//! Which Sidekiq the Sidekiq drill runs: the system Ruby's (Debian's
//! `ruby-sidekiq`, `sidekiq` on PATH), or the one `--ruby-lib` names — a
//! Sidekiq's `lib` directory and its dependencies', or a directory holding
//! such libraries (`vendor/ruby`) — whose `bin/sidekiq` then runs the fleet.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The Ruby load path and the Sidekiq server the drill's processes use.
#[derive(Debug, Clone, Default)]
pub(in crate::demo) struct Ruby {
    /// Library directories from `--ruby-lib`, absolute (the processes run in
    /// the drill's temporary directory).
    libs: Vec<PathBuf>,
    /// `bin/sidekiq` beside the `lib` that holds `sidekiq.rb`, when
    /// `--ruby-lib` was given.
    sidekiq: Option<PathBuf>,
}

impl Ruby {
    /// Reads `--ruby-lib` (`:`-separated); `None` is the system Ruby's.
    pub(in crate::demo) fn from_option(ruby_lib: Option<&str>) -> Result<Ruby> {
        let Some(list) = ruby_lib else {
            return Ok(Ruby::default());
        };
        let mut libs = Vec::new();
        for entry in list.split(':').filter(|e| !e.is_empty()) {
            let dir = std::path::absolute(entry).map_err(|e| bad(entry, &e.to_string()))?;
            libs.extend(library_dirs(&dir).ok_or_else(|| {
                bad(
                    entry,
                    "is neither a Ruby library directory nor a directory of libraries (each with lib/)",
                )
            })?);
        }
        let lib = libs
            .iter()
            .find(|l| l.join("sidekiq.rb").is_file())
            .ok_or_else(|| bad(list, "holds no sidekiq.rb (give Sidekiq's lib directory)"))?;
        let server = lib.parent().unwrap_or(lib).join("bin/sidekiq");
        if !server.is_file() {
            return Err(bad(
                list,
                &format!("has no {} to run the fleet with", server.display()),
            ));
        }
        Ok(Ruby {
            sidekiq: Some(server),
            libs,
        })
    }

    /// `RUBYLIB`: `first` (the adapters), then `--ruby-lib`'s directories,
    /// then the caller's own `RUBYLIB`.
    pub(in crate::demo) fn rubylib(&self, first: Option<&Path>) -> OsString {
        let caller = std::env::var_os("RUBYLIB").filter(|p| !p.is_empty());
        let dirs = first
            .map(|p| p.as_os_str().to_os_string())
            .into_iter()
            .chain(self.libs.iter().map(|l| l.as_os_str().to_os_string()))
            .chain(caller);
        let mut path = OsString::new();
        for (i, dir) in dirs.enumerate() {
            if i > 0 {
                path.push(":");
            }
            path.push(dir);
        }
        path
    }

    /// The fleet's worker: that Sidekiq's server, or `sidekiq` on PATH.
    pub(in crate::demo) fn sidekiq_server(&self) -> tokio::process::Command {
        match &self.sidekiq {
            Some(server) => {
                let mut cmd = tokio::process::Command::new("ruby");
                cmd.arg(server);
                cmd
            }
            None => tokio::process::Command::new("sidekiq"),
        }
    }

    /// How to get a Sidekiq the drill runs, for the refusal's one line.
    pub(in crate::demo) fn install_hint(&self) -> &'static str {
        if self.sidekiq.is_some() {
            "Ruby with Sidekiq 6 or 7 (--ruby-lib gave another Sidekiq, or one whose dependencies are missing: Sidekiq 7 needs apt-get install ruby-rack ruby-concurrent)"
        } else {
            "Ruby with Sidekiq 6 or 7: apt-get install ruby-sidekiq (6.4), or --ruby-lib with Sidekiq 7's libraries (the repository's vendor/ruby, after apt-get install ruby-rack ruby-concurrent)"
        }
    }
}

/// `dir` itself when it is a library directory (named `lib`, or holding
/// `.rb` files), else the `lib` directories of its subdirectories, sorted;
/// `None` when it is neither.
fn library_dirs(dir: &Path) -> Option<Vec<PathBuf>> {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let holds_ruby = entries
        .iter()
        .any(|p| p.extension().is_some_and(|x| x == "rb"));
    if dir.file_name().is_some_and(|n| n == "lib") || holds_ruby {
        return Some(vec![dir.to_path_buf()]);
    }
    let mut libs: Vec<PathBuf> = entries
        .iter()
        .map(|p| p.join("lib"))
        .filter(|l| l.is_dir())
        .collect();
    libs.sort();
    (!libs.is_empty()).then_some(libs)
}

fn bad(entry: &str, why: &str) -> Error {
    Error::Environment(format!("--ruby-lib {entry} {why}"))
}

#[cfg(test)]
mod tests {
    use super::Ruby;

    const REPO: &str = env!("CARGO_MANIFEST_DIR");

    #[test]
    fn a_directory_of_libraries_and_a_list_of_lib_dirs_name_the_same_sidekiq() {
        let whole = Ruby::from_option(Some(&format!("{REPO}/vendor/ruby"))).unwrap();
        let listed = Ruby::from_option(Some(&format!(
            "{REPO}/vendor/ruby/connection_pool-2.5.4/lib:{REPO}/vendor/ruby/redis-client-0.26.4/lib:{REPO}/vendor/ruby/sidekiq-7.3.10/lib"
        )))
        .unwrap();
        assert_eq!(whole.libs, listed.libs);
        assert_eq!(whole.libs.len(), 3);
        assert_eq!(
            whole.sidekiq.as_deref(),
            Some(std::path::Path::new(&format!(
                "{REPO}/vendor/ruby/sidekiq-7.3.10/bin/sidekiq"
            )))
        );
    }

    #[test]
    fn a_path_without_sidekiq_is_refused_in_one_line() {
        for path in [
            format!("{REPO}/adapters/ruby/lib"),
            format!("{REPO}/nowhere"),
        ] {
            let e = Ruby::from_option(Some(&path)).unwrap_err().to_string();
            assert!(e.starts_with("--ruby-lib "), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
}
