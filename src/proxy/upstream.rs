//! The proxy's way to its upstream Redis: plain TCP for `redis://`, TLS
//! (rustls) for `rediss://`, trusting `[proxy] upstream_ca_file` (default
//! `redis_ca_file`) or else the operating system's store, and nothing at all
//! with `#insecure`. The URL is parsed and the TLS settings built once, at
//! start-up; each client connection then only connects and shakes hands.
//!
//! The two kinds of stream stay distinct types ([`Stream`]) so the plain
//! splice keeps tokio's lock-free TCP halves; only a TLS stream is split
//! with `tokio::io::split`, which it needs because one TLS session carries
//! both directions.

mod insecure;

use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::config::tls::{is_insecure, RedisTls};
use crate::error::ProxyError;

/// Where each client connection's upstream connection goes.
pub(super) struct Upstream {
    /// `host:port`, as `TcpStream::connect` takes it.
    addr: String,
    /// Set for `rediss://`.
    tls: Option<Tls>,
}

/// A `rediss://` upstream's handshake settings.
struct Tls {
    connector: TlsConnector,
    /// The name the certificate must carry: the URL's host.
    name: ServerName<'static>,
}

/// One open upstream connection.
pub(super) enum Stream {
    Plain(TcpStream),
    /// Boxed: a TLS session is large and only this variant carries it.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Upstream {
    /// The upstream of `url` (`shown` is the URL with its password
    /// redacted, for errors), trusting `tls` on `rediss://`.
    pub(super) fn new(url: &str, shown: &str, tls: &RedisTls) -> Result<Upstream, ProxyError> {
        let bad = |reason: String| ProxyError::UpstreamUrl {
            url: shown.to_string(),
            reason,
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let secure = match parsed.scheme() {
            "redis" => false,
            "rediss" => true,
            _ => return Err(bad("must start with redis:// or rediss://".into())),
        };
        let host = parsed
            .host()
            .filter(|h| !matches!(h, url::Host::Domain("")))
            .ok_or_else(|| bad("has no host".into()))?;
        let port = parsed.port().unwrap_or(6379);
        let (addr, name) = match host {
            url::Host::Domain(d) => (
                format!("{d}:{port}"),
                ServerName::try_from(d.to_string()).map_err(|e| bad(e.to_string()))?,
            ),
            url::Host::Ipv4(ip) => (format!("{ip}:{port}"), ServerName::from(ip)),
            url::Host::Ipv6(ip) => (format!("[{ip}]:{port}"), ServerName::from(ip)),
        };
        let tls = match secure {
            false => None,
            true => {
                let config = client_config(tls, is_insecure(url)).map_err(bad)?;
                Some(Tls {
                    connector: TlsConnector::from(Arc::new(config)),
                    name,
                })
            }
        };
        Ok(Upstream { addr, tls })
    }

    /// Connects (and shakes hands, for TLS). Nagle is off: both directions
    /// carry small request/reply exchanges, where it only adds delay.
    pub(super) async fn connect(&self) -> std::io::Result<Stream> {
        let tcp = TcpStream::connect(&self.addr).await?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => Ok(Stream::Plain(tcp)),
            Some(tls) => {
                let stream = tls.connector.connect(tls.name.clone(), tcp).await?;
                Ok(Stream::Tls(Box::new(stream)))
            }
        }
    }
}

/// The rustls settings: the CA file's certificates, else the operating
/// system's; `insecure` accepts any certificate.
fn client_config(tls: &RedisTls, insecure: bool) -> Result<ClientConfig, String> {
    // Explicitly ring, the provider sqlx and reqwest use too, rather than a
    // process default another dependency could make ambiguous.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    if insecure {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(insecure::AcceptAny::new(provider)))
            .with_no_client_auth());
    }
    let roots = match tls.roots() {
        Some(roots) => roots.clone(),
        None => system_roots()?,
    };
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// The operating system's trust store; unreadable entries are skipped as
/// long as some certificate loads.
fn system_roots() -> Result<RootCertStore, String> {
    let loaded = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(loaded.certs);
    if roots.is_empty() {
        let why = loaded
            .errors
            .first()
            .map_or_else(|| "it is empty".to_string(), |e| e.to_string());
        return Err(format!(
            "cannot load the system's CA certificates ({why}); set [proxy] upstream_ca_file"
        ));
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(url: &str) -> Result<String, ProxyError> {
        Upstream::new(url, "shown", &RedisTls::default()).map(|u| u.addr)
    }

    #[test]
    fn urls_become_addresses() {
        assert_eq!(addr("redis://h").unwrap(), "h:6379");
        assert_eq!(addr("redis://:pw@h:7000/2").unwrap(), "h:7000");
        assert_eq!(addr("redis://[::1]:7000").unwrap(), "[::1]:7000");
        let err = addr("http://h").unwrap_err().to_string();
        assert!(err.starts_with("upstream shown: must start with"), "{err}");
    }

    #[test]
    fn rediss_gets_a_handshake_for_the_host_name() {
        let up = Upstream::new("rediss://10.0.0.1:6380/#insecure", "", &RedisTls::default())
            .expect("insecure needs no store");
        let tls = up.tls.expect("rediss is TLS");
        assert_eq!(tls.name.to_str(), "10.0.0.1");
        assert_eq!(up.addr, "10.0.0.1:6380");
    }
}
