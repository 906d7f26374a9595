//! The access-control keys: the HTTP listener's loopback default, the admin
//! token and the proxy password (from a file, or the environment winning).

use std::net::SocketAddr;

use super::{Config, Overrides};
use crate::secret::Secret;

const TOKEN: &str = "admin-token-0123456789abcdef";

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn the_default_http_listener_is_loopback_and_the_admin_api_is_off() {
    let cfg = Config::from_toml("", &Overrides::default()).unwrap();
    let addr: SocketAddr = cfg.http.listen.parse().unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
    assert!(cfg.admin_token.is_none());
    assert!(!cfg.http.enqueue_requires_token);
    assert!(cfg.proxy.password.is_none());
}

#[test]
fn the_admin_token_comes_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "token", &format!("{TOKEN}\n"));
    let text = format!("[http]\nadmin_token_file = {path:?}\nenqueue_requires_token = true\n");
    let cfg = Config::from_toml(&text, &Overrides::default()).unwrap();
    assert!(cfg.admin_token.unwrap().matches(TOKEN.as_bytes()));
    assert!(cfg.http.enqueue_requires_token);
}

#[test]
fn the_environment_wins_over_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let token = write(&dir, "token", TOKEN);
    let password = write(&dir, "pw", "proxy-password-from-file");
    let text =
        format!("[http]\nadmin_token_file = {token:?}\n[proxy]\npassword_file = {password:?}\n");
    let overrides = Overrides {
        admin_token: Some(
            Secret::new("QBRIDGE_ADMIN_TOKEN", "token-from-the-environment").unwrap(),
        ),
        proxy_password: Some(Secret::new("QBRIDGE_PROXY_PASSWORD", "password-from-env-1").unwrap()),
        ..Overrides::default()
    };
    let cfg = Config::from_toml(&text, &overrides).unwrap();
    let admin = cfg.admin_token.unwrap();
    assert!(admin.matches(b"token-from-the-environment"));
    assert!(!admin.matches(TOKEN.as_bytes()));
    assert!(cfg.proxy.password.unwrap().matches(b"password-from-env-1"));
    let cfg = Config::from_toml(&text, &Overrides::default()).unwrap();
    assert!(cfg
        .proxy
        .password
        .unwrap()
        .matches(b"proxy-password-from-file"));
}

#[test]
fn bad_secret_files_are_one_line_errors_naming_the_key_not_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let short = write(&dir, "short", "tooshort-secret");
    let text = format!("[proxy]\npassword_file = {short:?}\n");
    let e = Config::from_toml(&text, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("proxy.password_file"), "{e}");
    assert!(e.contains("at least 16 characters"), "{e}");
    assert!(!e.contains("tooshort-secret"), "{e}");
    let missing = dir.path().join("missing").display().to_string();
    let text = format!("[http]\nadmin_token_file = {missing:?}\n");
    let e = Config::from_toml(&text, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("http.admin_token_file"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn a_token_written_into_the_toml_is_refused() {
    let e = Config::from_toml("[http]\nadmin_token = \"x\"\n", &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("admin_token"), "{e}");
}

#[test]
fn enqueue_requires_token_without_a_token_is_refused() {
    let e = Config::from_toml(
        "[http]\nenqueue_requires_token = true\n",
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("http.enqueue_requires_token"), "{e}");
}

#[test]
fn the_scoped_tokens_come_from_their_files_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let report = write(&dir, "report", "report-token-0123456789\n");
    let enqueue = write(&dir, "enqueue", "enqueue-token-0123456789\n");
    let text = format!(
        "[http]\nreport_token_file = {report:?}\nenqueue_token_file = {enqueue:?}\nenqueue_queues = [\"emails\"]\n"
    );
    let cfg = Config::from_toml(&text, &Overrides::default()).unwrap();
    assert!(cfg
        .report_token
        .unwrap()
        .matches(b"report-token-0123456789"));
    assert!(cfg
        .enqueue_token
        .unwrap()
        .matches(b"enqueue-token-0123456789"));
    assert_eq!(cfg.http.enqueue_queues, ["emails"]);
    let env = Overrides {
        report_token: Some(Secret::new("env", "from-the-environment-1").unwrap()),
        ..Overrides::default()
    };
    let cfg = Config::from_toml(&text, &env).unwrap();
    assert!(cfg.report_token.unwrap().matches(b"from-the-environment-1"));
}

#[test]
fn enqueue_queues_without_an_enqueue_token_is_refused() {
    let e = Config::from_toml(
        "[http]\nenqueue_queues = [\"emails\"]\n",
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("http.enqueue_queues"), "{e}");
    assert!(e.contains("QBRIDGE_ENQUEUE_TOKEN"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn a_scoped_token_equal_to_the_admin_token_is_refused() {
    let same = Secret::new("t", "the-same-token-0123456789").unwrap();
    let env = Overrides {
        admin_token: Some(same.clone()),
        report_token: Some(same),
        ..Overrides::default()
    };
    let e = Config::from_toml("", &env).unwrap_err().to_string();
    assert!(e.contains("admin and report tokens are the same"), "{e}");
    assert!(!e.contains("the-same-token"), "{e}");
}
