//! Shared secrets qbridge checks callers against: the admin API's bearer
//! token and the RESP proxy's own password.
//!
//! A [`Secret`] keeps only the SHA-256 digest of the value, so the value
//! itself is never in memory longer than loading takes, never in a `Debug`
//! print, and never in an error. Checking hashes the offered value too and
//! compares the two digests in constant time: hashing first makes both
//! sides the same length, so neither the position of the first wrong byte
//! nor the secret's length shows in the time an answer takes.
//!
//! Values come from an environment variable or a file (never from the TOML
//! itself, which tends to end up in repositories and bug reports); the
//! config decides which wins. A file is read once at start-up and trimmed of
//! trailing newlines; one that every user can read loads with a warning.

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{Error, Result};

/// Shortest secret accepted: 16 characters is what a random token from
/// `openssl rand -hex 8` gives, and anything shorter is guessable online.
pub const MIN_LEN: usize = 16;

/// A secret to check callers against; see the module docs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    digest: [u8; 32],
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Secret {
    /// A secret from its value. `what` names it in the error (never the value).
    pub fn new(what: &str, value: &str) -> Result<Secret> {
        if value.chars().count() < MIN_LEN {
            return Err(Error::Config(format!(
                "{what} must be at least {MIN_LEN} characters (e.g. `openssl rand -hex 32`)"
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(Error::Config(format!(
                "{what} contains control characters (a stray newline inside the value?)"
            )));
        }
        Ok(Secret {
            digest: Sha256::digest(value.as_bytes()).into(),
        })
    }

    /// Whether `offered` is the secret, in time independent of both values.
    pub fn matches(&self, offered: &[u8]) -> bool {
        let offered: [u8; 32] = Sha256::digest(offered).into();
        self.digest.ct_eq(&offered).into()
    }

    /// The secret in the environment variable `var`; `None` when it is
    /// unset or empty. Errors name the variable, never the value.
    pub fn from_env(var: &str) -> Result<Option<Secret>> {
        match std::env::var(var) {
            Ok(value) if !value.is_empty() => Secret::new(var, &value).map(Some),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(Error::Config(format!("{var} is not valid UTF-8")))
            }
        }
    }

    /// The secret in `path` (trailing newlines trimmed). `key` names the
    /// config key in errors; the file's contents never appear in them.
    pub fn from_file(key: &str, path: &Path) -> Result<Secret> {
        let what = format!("{key} {}", path.display());
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("{what}: cannot read it: {e}")))?;
        let value = text.trim_end_matches(['\r', '\n']);
        if value.is_empty() {
            return Err(Error::Config(format!("{what}: the file is empty")));
        }
        let secret = Secret::new(&what, value)?;
        if let Some(mode) = readable_by_others(path) {
            // A warning, not a refusal: Kubernetes mounts secrets 0644 by
            // default, and refusing would break those set-ups on upgrade.
            tracing::warn!(
                "{what} can be read by every user on this machine (mode {mode:o}); chmod 600 it"
            );
        }
        Ok(secret)
    }
}

/// The file's permission bits when users other than its owner and group can
/// read it (Unix only; elsewhere the answer is always `None`).
fn readable_by_others(path: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o004 != 0).then_some(mode)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123";

    #[cfg(unix)]
    #[test]
    fn world_readable_files_are_noticed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
        for (mode, noticed) in [(0o644, Some(0o644)), (0o640, None), (0o600, None)] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(readable_by_others(&path), noticed, "{mode:o}");
            // A loose mode warns but still loads the secret.
            assert!(Secret::from_file("admin_token_file", &path)
                .unwrap()
                .matches(TOKEN.as_bytes()));
        }
    }

    #[test]
    fn equal_values_match() {
        let s = Secret::new("token", TOKEN).unwrap();
        assert!(s.matches(TOKEN.as_bytes()));
    }

    #[test]
    fn a_different_value_of_the_same_length_does_not_match() {
        let s = Secret::new("token", TOKEN).unwrap();
        let mut other = TOKEN.as_bytes().to_vec();
        *other.last_mut().unwrap() ^= 1;
        assert_eq!(other.len(), TOKEN.len());
        assert!(!s.matches(&other));
    }

    #[test]
    fn prefixes_extensions_and_empty_values_do_not_match() {
        let s = Secret::new("token", TOKEN).unwrap();
        assert!(!s.matches(&TOKEN.as_bytes()[..TOKEN.len() - 1]));
        assert!(!s.matches(format!("{TOKEN}x").as_bytes()));
        assert!(!s.matches(b""));
    }

    #[test]
    fn short_or_multi_line_values_are_refused_without_echoing_them() {
        let e = Secret::new("QBRIDGE_ADMIN_TOKEN", "short-secret").unwrap_err();
        assert!(e.to_string().contains("QBRIDGE_ADMIN_TOKEN"), "{e}");
        assert!(!e.to_string().contains("short-secret"), "{e}");
        let e = Secret::new("t", "0123456789\nabcdef0123").unwrap_err();
        assert!(e.to_string().contains("control characters"), "{e}");
    }

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new("token", TOKEN).unwrap();
        assert_eq!(format!("{s:?}"), "Secret(***)");
    }

    #[test]
    fn files_are_trimmed_and_an_empty_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
        let from_file = Secret::from_file("http.admin_token_file", &path).unwrap();
        assert!(from_file.matches(TOKEN.as_bytes()));
        std::fs::write(&path, "\n").unwrap();
        let e = Secret::from_file("http.admin_token_file", &path).unwrap_err();
        assert!(e.to_string().contains("http.admin_token_file"), "{e}");
        assert!(e.to_string().ends_with("the file is empty"), "{e}");
        let e = Secret::from_file("k", &dir.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("cannot read it"), "{e}");
    }
}
