//! Postgres over TLS: `sslmode` and `sslrootcert` in `database_url` are all
//! it takes, for the pool and for the LISTEN connection; a server without
//! TLS or a certificate from another CA is a one-line error that shows no
//! password.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use qbridge::queue::listener::{self, Wakers};

use super::certs::Certs;
use crate::servers::ThrowawayPostgres;
use crate::support::wait_for;

/// `url` with a password (trust auth ignores it; the errors must hide it)
/// and TLS parameters.
fn with_tls(pg: &ThrowawayPostgres, params: &str) -> String {
    format!(
        "postgres://postgres:s3cret-pw@127.0.0.1:{}/postgres?{params}",
        pg.port
    )
}

#[tokio::test]
async fn verify_full_with_the_private_ca_encrypts_the_pool_and_the_listener() {
    let certs = Certs::generate();
    let pg = ThrowawayPostgres::start_tls(&certs.server);
    let url = with_tls(
        &pg,
        &format!("sslmode=verify-full&sslrootcert={}", certs.ca()),
    );
    let db = qbridge::db::connect(&url, 2)
        .await
        .expect("connects over TLS");
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&db)
        .await
        .unwrap();
    assert!(ssl, "the pool's connection is encrypted");

    // The LISTEN connection is built from the same URL.
    let token = CancellationToken::new();
    let task = tokio::spawn(listener::run(url.clone(), Wakers::default(), token.clone()));
    let listen_ssl = "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                       WHERE a.query LIKE 'LISTEN%'";
    wait_for("the LISTEN connection", Duration::from_secs(10), || async {
        sqlx::query_scalar::<_, bool>(listen_ssl)
            .fetch_optional(&db)
            .await
            .unwrap()
            .is_some()
    })
    .await;
    let ssl: bool = sqlx::query_scalar(listen_ssl).fetch_one(&db).await.unwrap();
    assert!(ssl, "the LISTEN connection is encrypted");
    token.cancel();
    task.await.unwrap();

    // Without sslmode the same server is reached in plain text (sqlx's
    // default, prefer, would use TLS): the proof above is the URL's doing.
    let plain = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port
    );
    let db = qbridge::db::connect(&plain, 1).await.unwrap();
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&db)
        .await
        .unwrap();
    assert!(!ssl);
}

#[tokio::test]
async fn sslmode_require_against_a_server_without_tls_is_a_one_line_error() {
    let pg = ThrowawayPostgres::start();
    let url = with_tls(&pg, "sslmode=require");
    let err = qbridge::db::connect(&url, 1).await.unwrap_err().to_string();
    assert!(
        err.starts_with("cannot connect to Postgres at postgres://postgres:***@127.0.0.1:"),
        "{err}"
    );
    assert!(
        err.contains("server does not support TLS (the server has ssl = off"),
        "says why: {err}"
    );
    assert!(!err.contains("s3cret-pw") && !err.contains('\n'), "{err}");
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_a_one_line_error_without_the_password() {
    let certs = Certs::generate();
    let pg = ThrowawayPostgres::start_tls(&certs.server);
    let url = with_tls(
        &pg,
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            certs.wrong_ca.display()
        ),
    );
    let err = qbridge::db::connect(&url, 1).await.unwrap_err().to_string();
    assert!(
        err.starts_with("cannot connect to Postgres at postgres://postgres:***@127.0.0.1:"),
        "{err}"
    );
    assert!(
        err.contains("UnknownIssuer (check sslrootcert"),
        "says why: {err}"
    );
    assert!(!err.contains("s3cret-pw") && !err.contains('\n'), "{err}");
}
