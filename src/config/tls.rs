//! TLS to Redis (`rediss://`): which certificate authorities a connection
//! trusts. Without a CA file, the operating system's trust store (what a
//! managed Redis with a public certificate needs); with one, only the
//! certificates in that PEM file (what a self-hosted Redis with a private CA
//! needs). `rediss://…/#insecure` skips verification altogether (the redis
//! crate's convention, kept by the proxy too).
//!
//! One value serves the redis-crate clients (consumer, producer API, repair,
//! diff, decommission) and the proxy's splice, so every connection to the
//! same Redis trusts the same certificates. The file is read and parsed once,
//! when the config is loaded, so a missing or malformed file is a start-up
//! error naming the key rather than a failure at the first connection.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

/// The CA a Redis connection trusts; see the module docs. The default
/// trusts the operating system's store.
#[derive(Clone, Default)]
pub struct RedisTls {
    ca: Option<Arc<CaFile>>,
}

/// A CA file as read at start-up.
struct CaFile {
    /// For messages: which file an operator has to look at.
    path: PathBuf,
    /// The PEM text, as the redis crate wants it.
    pem: Vec<u8>,
    /// The same certificates, as the proxy's rustls connector wants them.
    roots: RootCertStore,
}

impl RedisTls {
    /// Trusts only the certificates of the PEM file at `path`. Errors (one
    /// line, naming the file) when it cannot be read or holds no certificate.
    pub fn from_ca_file(path: &Path) -> Result<RedisTls, String> {
        let shown = path.display();
        let pem = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| format!("{shown} is not PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("{shown} holds a certificate rustls refuses: {e}"))?;
        }
        if roots.is_empty() {
            return Err(format!(
                "{shown} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            ));
        }
        Ok(RedisTls {
            ca: Some(Arc::new(CaFile {
                path: path.to_path_buf(),
                pem,
                roots,
            })),
        })
    }

    /// The CA file, when one is set.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca.as_deref().map(|ca| ca.path.as_path())
    }

    /// The certificates of the CA file, when one is set (else the caller
    /// uses the operating system's store).
    pub(crate) fn roots(&self) -> Option<&RootCertStore> {
        self.ca.as_deref().map(|ca| &ca.roots)
    }

    /// A redis-crate client for `url` that trusts this CA on `rediss://`.
    /// A `redis://` URL gets a plain client (config validation refuses a CA
    /// file with one, so nothing is silently dropped).
    pub fn client(&self, url: &str) -> ::redis::RedisResult<::redis::Client> {
        match &self.ca {
            Some(ca) if is_tls_url(url) => ::redis::Client::build_with_tls(
                url,
                ::redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.pem.clone()),
                },
            ),
            _ => ::redis::Client::open(url),
        }
    }
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca_file", &self.ca_file())
            .finish()
    }
}

/// Two values are equal when they trust the same file's same contents.
impl PartialEq for RedisTls {
    fn eq(&self, other: &RedisTls) -> bool {
        match (&self.ca, &other.ca) {
            (None, None) => true,
            (Some(a), Some(b)) => a.path == b.path && a.pem == b.pem,
            _ => false,
        }
    }
}

/// Whether `url` is `rediss://` (TLS).
pub fn is_tls_url(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|u| u.scheme() == "rediss")
}

/// Whether `url` asks to skip certificate verification (`rediss://…#insecure`).
pub fn is_insecure(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|u| u.scheme() == "rediss" && u.fragment() == Some("insecure"))
}

/// A hint for a connection error that is about TLS, so the one-line error
/// says what to change rather than only "is it running?"; `ca_key` is the
/// config key of the CA file in play.
pub fn hint(reason: &str, ca_key: &str) -> String {
    let lower = reason.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("unknownissuer") {
        format!(" (check {ca_key}: it must hold the CA that signed the server's certificate)")
    } else if lower.contains("tls") || lower.contains("handshake") {
        " (does the server speak TLS on that port? rediss:// needs a TLS port, redis:// a plain one)"
            .to_string()
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_must_hold_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = RedisTls::from_ca_file(&missing).unwrap_err();
        assert!(
            err.starts_with("cannot read ") && err.contains("missing.pem"),
            "{err}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = RedisTls::from_ca_file(&empty).unwrap_err();
        assert!(err.contains("holds no PEM certificate"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn only_rediss_with_the_fragment_is_insecure() {
        assert!(is_insecure("rediss://h:6380/#insecure"));
        assert!(!is_insecure("rediss://h:6380/"));
        assert!(!is_insecure("redis://h/#insecure"));
    }
}
