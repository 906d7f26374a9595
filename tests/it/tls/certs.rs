//! Certificates made for one test: a private CA, a server certificate it
//! signed for `localhost` and 127.0.0.1, and an unrelated CA (the "wrong CA"
//! an operator might point qbridge at). Generated fresh, so nothing secret or
//! expiring lives in the repository.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

use crate::servers::ServerTls;

/// The files of one test's certificates; removed when dropped.
pub struct Certs {
    _dir: tempfile::TempDir,
    /// Certificate, key and signing CA of the servers.
    pub server: ServerTls,
    /// A CA that signed nothing the servers present.
    pub wrong_ca: PathBuf,
}

impl Certs {
    pub fn generate() -> Certs {
        let dir = tempfile::Builder::new()
            .prefix("qbridge-tls-")
            .tempdir()
            .expect("temp dir");
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).expect("write a PEM file");
            path
        };
        let (ca_pem, issuer) = ca("qbridge test CA");
        let (wrong_pem, _) = ca("some other CA");
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).expect("names");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let cert = params.signed_by(&key, &issuer).expect("signed");
        let server = ServerTls {
            cert: write("server.crt", cert.pem()),
            key: write("server.key", key.serialize_pem()),
            ca: write("ca.crt", ca_pem),
        };
        let wrong_ca = write("wrong-ca.crt", wrong_pem);
        Certs {
            _dir: dir,
            server,
            wrong_ca,
        }
    }

    /// The CA file's path as text, for URLs and config.
    pub fn ca(&self) -> String {
        self.server.ca.to_string_lossy().into_owned()
    }
}

/// A self-signed CA: its PEM certificate and what signs with it.
fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-signed");
    (cert.pem(), Issuer::new(params, key))
}
