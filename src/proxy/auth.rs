//! Authentication through the proxy, in two layers.
//!
//! **Redis's own AUTH/ACL.** AUTH and HELLO … AUTH go through the splice
//! unchanged and Redis decides; [`Session`](super::session) follows its
//! answers (`+OK` to AUTH, a successful HELLO, RESET) to know whether the
//! upstream connection is authenticated. That matters where the proxy
//! answers instead of Redis: a routed push in `postgres_only` or
//! `decommissioned` is never forwarded, so the proxy must refuse it itself
//! (`-NOAUTH`) on a connection Redis would have refused. Whether a fresh
//! connection starts authenticated (the default user has no password) is
//! learned per connection by [`probe`], a PING before the splice starts.
//!
//! **The proxy's own password** (`[proxy] password_file`,
//! `QBRIDGE_PROXY_PASSWORD`). When set, [`Gate::screen`] answers AUTH and
//! HELLO … AUTH itself (user `default` or none, compared in constant time)
//! and refuses every other command before them with `-NOAUTH`. A client that
//! passes is then authenticated upstream with the upstream URL's
//! credentials, not its own: a correct AUTH is rewritten into `AUTH <url
//! user> <url password>` (or answered `+OK` when the URL has none), and
//! HELLO's AUTH option likewise. RESET logs the client out of the proxy too,
//! as it does in Redis.
//!
//! Limits: ACL key permissions cannot be checked where the proxy answers a
//! push itself (Redis never sees the key), so an ACL user authenticated
//! upstream but denied the routed key is refused by Redis in `dual_write`
//! and `shadow` but accepted by the proxy in `postgres_only`. AUTH inside
//! MULTI is answered at once by the proxy's gate (Redis would queue it).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::frame::{self, Frame, Limits};
use crate::secret::Secret;

/// Redis's reply to a command on an unauthenticated connection.
pub(super) const NOAUTH: &[u8] = b"-NOAUTH Authentication required.\r\n";

/// Redis's reply to a wrong user or password.
const WRONGPASS: &[u8] = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";

/// Redis's reply to HELLO without AUTH on an unauthenticated connection.
const HELLO_NOAUTH: &[u8] = b"-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n";

const AUTH_ARITY: &[u8] = b"-ERR wrong number of arguments for 'auth' command\r\n";

/// How long the per-connection probe waits for Redis.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a fresh connection to Redis is authenticated before any AUTH:
/// PING answers `+PONG` then, `-NOAUTH` when a password is required. The
/// reply is read here, so the client never sees it. Anything else (a
/// loading or refusing server) is an error: the connection is not served
/// rather than guessed about.
pub(super) async fn probe<S>(upstream: &mut S) -> Result<bool, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let check = async {
        upstream
            .write_all(b"*1\r\n$4\r\nPING\r\n")
            .await
            .map_err(|e| e.to_string())?;
        match read_reply(upstream).await? {
            Frame::Simple(s) if s.as_ref() == b"PONG" => Ok(true),
            Frame::Error(e) if e.starts_with(b"NOAUTH") => Ok(false),
            Frame::Error(e) => Err(format!("PING answered: {}", String::from_utf8_lossy(&e))),
            _ => Err("PING answered something other than PONG".to_string()),
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, check)
        .await
        .map_err(|_| format!("no answer to PING within {PROBE_TIMEOUT:?}"))?
}

/// The `run_id` of the Redis server on a fresh, authenticated connection
/// (`INFO server`, read here before the splice starts, so the client never
/// sees it): the server that takes the pushes mirrored from this connection.
/// `None` when Redis does not say (an ACL user without INFO, a server that
/// hides it): those copies keep the evidence of observation alone.
pub(super) async fn server_run<S>(upstream: &mut S) -> Option<std::sync::Arc<str>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let ask = async {
        upstream
            .write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
            .await
            .map_err(|e| e.to_string())?;
        read_reply(upstream).await
    };
    match tokio::time::timeout(PROBE_TIMEOUT, ask).await {
        Ok(Ok(Frame::Bulk(info))) => {
            crate::redis::epoch::run_id_of(&String::from_utf8_lossy(&info))
                .map(std::sync::Arc::from)
        }
        _ => None,
    }
}

/// One reply frame from `conn`.
pub(super) async fn read_reply<S>(conn: &mut S) -> Result<Frame, String>
where
    S: AsyncRead + Unpin,
{
    let mut buf = BytesMut::with_capacity(512);
    loop {
        if let Some((frame, _)) =
            frame::parse(&buf, &Limits::default()).map_err(|e| e.to_string())?
        {
            return Ok(frame);
        }
        if conn.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("connection closed".to_string());
        }
    }
}

/// The user and password of a `redis://user:password@host` URL, decoded;
/// `None` when it has no password. The user defaults to `default`.
pub(super) fn url_credentials(url: &str) -> Option<(Bytes, Bytes)> {
    let parsed = url::Url::parse(url).ok()?;
    let password = parsed.password()?;
    let user = match parsed.username() {
        "" => "default",
        user => user,
    };
    Some((
        Bytes::from(percent_decode(user)),
        Bytes::from(percent_decode(password)),
    ))
}

/// URL user info is percent-encoded; Redis wants the raw bytes. A `%` not
/// followed by two hex digits stays as it is, and `+` is not a space here
/// (that is form encoding, not URL user info).
pub(super) fn percent_decode(s: &str) -> Vec<u8> {
    percent_encoding::percent_decode_str(s).collect()
}

/// The proxy's password and what passing it unlocks upstream.
#[derive(Debug)]
pub(super) struct Gate {
    pub password: Secret,
    /// The upstream URL's user and password, sent to Redis in place of the
    /// client's when the client passes the gate.
    pub upstream: Option<(Bytes, Bytes)>,
}

/// What the gate makes of one client command.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Screen {
    /// Forward it as the client sent it.
    Pass,
    /// Answer with these bytes; send Redis nothing.
    Answer(&'static [u8]),
    /// Forward these arguments instead (an AUTH or HELLO carrying the
    /// upstream credentials, or none).
    Rewrite(Vec<Bytes>),
}

impl Gate {
    /// Decides about one command (`name` upper case) of a connection whose
    /// gate state is `passed`, updating it.
    pub(super) fn screen(&self, passed: &mut bool, name: &str, args: &[Bytes]) -> Screen {
        match name {
            "AUTH" => self.auth(passed, args),
            "HELLO" => self.hello(passed, args),
            // RESET logs a Redis client out; the proxy's gate follows.
            "RESET" if *passed => {
                *passed = false;
                Screen::Pass
            }
            _ if *passed => Screen::Pass,
            // Redis lets QUIT through unauthenticated too.
            "QUIT" => Screen::Pass,
            _ => Screen::Answer(NOAUTH),
        }
    }

    fn credentials_ok(&self, user: Option<&Bytes>, password: &Bytes) -> bool {
        // Checked in full either way, so a wrong user takes as long as a
        // wrong password.
        let password_ok = self.password.matches(password);
        let user_ok = user.is_none_or(|u| u.as_ref() == b"default");
        password_ok && user_ok
    }

    fn auth(&self, passed: &mut bool, args: &[Bytes]) -> Screen {
        let (user, password) = match args {
            [_, password] => (None, password),
            [_, user, password] => (Some(user), password),
            _ => return Screen::Answer(AUTH_ARITY),
        };
        if !self.credentials_ok(user, password) {
            return Screen::Answer(WRONGPASS);
        }
        *passed = true;
        match &self.upstream {
            Some((user, password)) => Screen::Rewrite(vec![
                Bytes::from_static(b"AUTH"),
                user.clone(),
                password.clone(),
            ]),
            None => Screen::Answer(b"+OK\r\n"),
        }
    }

    /// `HELLO [protover [AUTH user password] [SETNAME name]]`.
    fn hello(&self, passed: &mut bool, args: &[Bytes]) -> Screen {
        let auth_at = args
            .iter()
            .enumerate()
            .skip(2)
            .find(|(_, a)| a.eq_ignore_ascii_case(b"AUTH"))
            .map(|(i, _)| i);
        let Some(at) = auth_at else {
            return if *passed {
                Screen::Pass
            } else {
                Screen::Answer(HELLO_NOAUTH)
            };
        };
        let (Some(user), Some(password)) = (args.get(at + 1), args.get(at + 2)) else {
            // Let Redis word the syntax error (it needs no authentication
            // to refuse a malformed HELLO).
            return Screen::Pass;
        };
        if !self.credentials_ok(Some(user), password) {
            return Screen::Answer(WRONGPASS);
        }
        *passed = true;
        let mut rewritten: Vec<Bytes> = args[..at].to_vec();
        if let Some((user, password)) = &self.upstream {
            rewritten.extend([Bytes::from_static(b"AUTH"), user.clone(), password.clone()]);
        }
        rewritten.extend_from_slice(&args[at + 3..]);
        Screen::Rewrite(rewritten)
    }
}

/// `args` as a RESP command.
pub(super) fn encode(args: &[Bytes]) -> Vec<u8> {
    Frame::Array(args.iter().cloned().map(Frame::Bulk).collect()).to_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PW: &str = "proxy-password-0123";

    fn args(parts: &[&str]) -> Vec<Bytes> {
        parts.iter().map(|p| Bytes::from(p.to_string())).collect()
    }

    fn gate(upstream: Option<(&str, &str)>) -> Gate {
        Gate {
            password: Secret::new("test", PW).unwrap(),
            upstream: upstream
                .map(|(u, p)| (Bytes::from(u.to_string()), Bytes::from(p.to_string()))),
        }
    }

    #[test]
    fn nothing_but_auth_hello_and_quit_passes_before_the_password() {
        let g = gate(None);
        let mut passed = false;
        assert_eq!(
            g.screen(&mut passed, "GET", &args(&["GET", "k"])),
            Screen::Answer(NOAUTH)
        );
        assert_eq!(
            g.screen(&mut passed, "LPUSH", &args(&["LPUSH", "k", "v"])),
            Screen::Answer(NOAUTH)
        );
        assert_eq!(
            g.screen(&mut passed, "HELLO", &args(&["HELLO", "3"])),
            Screen::Answer(HELLO_NOAUTH)
        );
        assert_eq!(
            g.screen(&mut passed, "QUIT", &args(&["QUIT"])),
            Screen::Pass
        );
        assert!(!passed);
    }

    #[test]
    fn wrong_passwords_and_users_are_refused_like_redis_does() {
        let g = gate(None);
        let mut passed = false;
        for a in [
            args(&["AUTH", "proxy-password-0124"]),
            args(&["AUTH", "alice", PW]),
            args(&["AUTH", ""]),
        ] {
            assert_eq!(g.screen(&mut passed, "AUTH", &a), Screen::Answer(WRONGPASS));
        }
        assert_eq!(
            g.screen(
                &mut passed,
                "HELLO",
                &args(&["HELLO", "3", "AUTH", "default", "nope"])
            ),
            Screen::Answer(WRONGPASS)
        );
        assert_eq!(
            g.screen(&mut passed, "AUTH", &args(&["AUTH"])),
            Screen::Answer(AUTH_ARITY)
        );
        assert!(!passed);
    }

    #[test]
    fn the_right_password_is_answered_or_turned_into_the_upstream_credentials() {
        let mut passed = false;
        assert_eq!(
            gate(None).screen(&mut passed, "AUTH", &args(&["AUTH", PW])),
            Screen::Answer(b"+OK\r\n")
        );
        assert!(passed);
        let g = gate(Some(("svc", "upstream-pw")));
        let mut passed = false;
        assert_eq!(
            g.screen(&mut passed, "AUTH", &args(&["AUTH", "default", PW])),
            Screen::Rewrite(args(&["AUTH", "svc", "upstream-pw"]))
        );
        assert!(passed);
        assert_eq!(
            g.screen(&mut passed, "GET", &args(&["GET", "k"])),
            Screen::Pass
        );
        // RESET logs the client out of the proxy as well.
        assert_eq!(
            g.screen(&mut passed, "RESET", &args(&["RESET"])),
            Screen::Pass
        );
        assert!(!passed);
    }

    #[test]
    fn hello_auth_is_rewritten_keeping_its_other_options() {
        let mut passed = false;
        let hello = args(&["HELLO", "3", "auth", "default", PW, "SETNAME", "worker"]);
        assert_eq!(
            gate(Some(("svc", "up"))).screen(&mut passed, "HELLO", &hello),
            Screen::Rewrite(args(&[
                "HELLO", "3", "AUTH", "svc", "up", "SETNAME", "worker"
            ]))
        );
        let mut passed = false;
        assert_eq!(
            gate(None).screen(&mut passed, "HELLO", &hello),
            Screen::Rewrite(args(&["HELLO", "3", "SETNAME", "worker"]))
        );
        assert!(passed);
        assert_eq!(
            gate(None).screen(&mut passed, "HELLO", &args(&["HELLO", "2"])),
            Screen::Pass
        );
    }

    #[test]
    fn url_credentials_are_decoded_and_default_the_user() {
        assert_eq!(
            url_credentials("redis://:p%40ss@h:1"),
            Some((Bytes::from("default"), Bytes::from("p@ss")))
        );
        assert_eq!(
            url_credentials("redis://svc:pw@h"),
            Some((Bytes::from("svc"), Bytes::from("pw")))
        );
        assert_eq!(url_credentials("redis://h:1/0"), None);
    }

    #[test]
    fn passwords_are_percent_decoded() {
        assert_eq!(percent_decode("a%2Bb+c%"), b"a+b+c%");
    }
}
