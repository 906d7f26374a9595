//! Unit tests of the TLS keys: `redis_ca_file` and `[proxy] upstream_ca_file`
//! are read at load time, only go with `rediss://`, and the proxy inherits
//! `redis_ca_file` for a TLS upstream.
use super::*;

fn load(text: &str) -> Result<Config> {
    Config::from_toml(text, &Overrides::default())
}

/// A directory holding `ca.pem`, a self-signed certificate.
fn ca_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, cert.pem()).unwrap();
    let path = path.to_string_lossy().into_owned();
    (dir, path)
}

#[test]
fn the_ca_file_is_read_at_load_and_inherited_by_a_tls_upstream() {
    let (_dir, ca) = ca_dir();
    let cfg = load(&format!(
        "redis_url = \"rediss://h:6380\"\nredis_ca_file = {ca:?}\n"
    ))
    .unwrap();
    assert_eq!(cfg.redis_tls.ca_file(), Some(Path::new(&ca)));
    assert_eq!(cfg.proxy.upstream_tls, cfg.redis_tls);
    // A plain upstream has no use for it.
    let cfg = load(&format!(
        "redis_url = \"rediss://h:6380\"\nredis_ca_file = {ca:?}\n[proxy]\nupstream = \"redis://h\"\n"
    ))
    .unwrap();
    assert_eq!(cfg.proxy.upstream_tls.ca_file(), None);
    // Nothing set: the system's store.
    let cfg = load("redis_url = \"rediss://h:6380\"").unwrap();
    assert_eq!(cfg.redis_tls.ca_file(), None);
}

#[test]
fn bad_tls_settings_are_one_line_errors_naming_the_key() {
    let (dir, ca) = ca_dir();
    let missing = dir.path().join("nope.pem").to_string_lossy().into_owned();
    let cases = [
        (
            format!("redis_url = \"redis://:pw@h\"\nredis_ca_file = {ca:?}"),
            "redis_ca_file: set, but \"redis://:***@h\" is not a rediss:// URL",
        ),
        (
            format!("redis_url = \"rediss://h\"\nredis_ca_file = {missing:?}"),
            "redis_ca_file: cannot read",
        ),
        (
            format!("[proxy]\nupstream = \"redis://h\"\nupstream_ca_file = {ca:?}"),
            "proxy: upstream_ca_file: set, but",
        ),
        (
            "redis_url = \"rediss://h/#insecur\"".to_string(),
            "redis_url: \"rediss://h/#insecur\": the only fragment understood is #insecure",
        ),
        (
            "redis_url = \"redis://h/#insecure\"".to_string(),
            "with rediss://",
        ),
    ];
    for (text, expected) in cases {
        let err = load(&text).unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "{text:?} gave {err:?}, expected {expected:?}"
        );
        assert!(!err.contains('\n') && !err.contains(":pw@"), "{err}");
    }
    assert!(load("redis_url = \"rediss://h/#insecure\"").is_ok());
}
