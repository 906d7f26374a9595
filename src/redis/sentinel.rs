//! Redis behind Sentinel: `redis+sentinel://[[user]:password@]host:port[,host:port…]/<master>[/<db>]`.
//!
//! Every Redis connection qbridge opens (the proxy's upstream, the
//! consumers, the producer API, repair, decommission, the diff) takes a
//! `redis://` URL and keeps reconnecting to that one address. So a process
//! whose `redis_url` names sentinels starts a [`Relay`] first: a listener on
//! 127.0.0.1 whose every accepted connection is spliced to the master the
//! sentinels name, as last confirmed with `ROLE` (asked every
//! [`FOLLOW_EVERY`]). The process then uses the relay's `redis://127.0.0.1:<port>/<db>`
//! URL (with the master's credentials) everywhere.
//!
//! The relay asks the sentinels every [`FOLLOW_EVERY`]; when they name
//! another master it closes every connection to the old one (which, after
//! a forced failover, stays a master accepting writes until Sentinel
//! reconfigures it), every client reconnects, and each new connection
//! reaches the new master. What a proxy client sees meanwhile is
//! in docs/src/operations/production.md ("Redis behind Sentinel"). TLS to Sentinel or the master is not
//! supported (a one-line error at start-up).

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::SentinelUrl;
use crate::error::{Error, Result};

/// How long one sentinel or the master may take to answer.
const ASK_WITHIN: Duration = Duration::from_secs(2);

/// `host:port` of the current master: the first sentinel that answers
/// names it, and the server itself confirms with `ROLE` that it is a master
/// (a sentinel can lag a failover by a moment).
pub async fn master_addr(target: &SentinelUrl) -> Result<String> {
    let mut why = Vec::new();
    for sentinel in &target.sentinels {
        match ask(target, sentinel).await {
            Ok(addr) => match confirm(target, &addr).await {
                Ok(()) => return Ok(addr),
                Err(e) => why.push(format!("{sentinel} named {addr}, which {e}")),
            },
            Err(e) => why.push(format!("{sentinel}: {e}")),
        }
    }
    Err(Error::RedisUnreachable {
        url: format!(
            "redis+sentinel://{}/{}",
            target.sentinels.join(","),
            target.master
        ),
        reason: format!("no sentinel named a master: {}", why.join("; ")),
    })
}

async fn ask(target: &SentinelUrl, sentinel: &str) -> std::result::Result<String, String> {
    let client = ::redis::Client::open(format!("redis://{}{sentinel}", target.userinfo))
        .map_err(|e| e.to_string())?;
    let ask = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        ::redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&target.master)
            .query_async::<Option<(String, u16)>>(&mut conn)
            .await
    };
    match tokio::time::timeout(ASK_WITHIN, ask).await {
        Ok(Ok(Some((host, port)))) => Ok(format!("{host}:{port}")),
        Ok(Ok(None)) => Err(format!(
            "does not monitor a master named {:?}",
            target.master
        )),
        Ok(Err(e)) => Err(first_line(&e.to_string())),
        Err(_) => Err("did not answer within 2s".into()),
    }
}

async fn confirm(target: &SentinelUrl, addr: &str) -> std::result::Result<(), String> {
    let client = ::redis::Client::open(format!("redis://{}{addr}", target.userinfo))
        .map_err(|e| e.to_string())?;
    let role = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        ::redis::cmd("ROLE")
            .query_async::<::redis::Value>(&mut conn)
            .await
    };
    match tokio::time::timeout(ASK_WITHIN, role).await {
        Ok(Ok(::redis::Value::Array(items))) => match items.first() {
            Some(::redis::Value::BulkString(r)) if r.as_slice() == b"master" => Ok(()),
            _ => Err("is not a master (yet)".into()),
        },
        Ok(Ok(_)) => Err("gave an unexpected ROLE reply".into()),
        Ok(Err(e)) => Err(first_line(&e.to_string())),
        Err(_) => Err("did not answer within 2s".into()),
    }
}

/// The loopback listener that splices each connection to the current
/// master; it runs until the process ends (or `token` is cancelled).
pub struct Relay {
    /// `redis://[userinfo@]127.0.0.1:<port>/<db>`, for every client.
    pub url: String,
}

impl Relay {
    /// Checks that the sentinels name a master now (a one-line error if
    /// not: qbridge does not start against a Redis it cannot find), then
    /// starts relaying and watching.
    pub async fn start(target: SentinelUrl, token: CancellationToken) -> Result<Relay> {
        let master = master_addr(&target).await?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        tracing::info!(master = %target.master, at = %master, relay_port = port,
            "Redis through Sentinel: connections go to the master the sentinels name");
        let url = format!("redis://{}127.0.0.1:{port}/{}", target.userinfo, target.db);
        let (current, seen) = watch::channel(master);
        tokio::spawn(follow(target, current, token.clone()));
        tokio::spawn(relay(listener, seen, token));
        Ok(Relay { url })
    }
}

/// How often the sentinels are asked where the master is. Connections to a
/// server that is no longer named are closed within about this long, so a
/// failover whose old master stays up (and accepts writes until Sentinel
/// reconfigures it) does not keep clients writing to it.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// Keeps `current` at the master the sentinels name (unchanged while none
/// answers: the open connections are the best there is).
async fn follow(target: SentinelUrl, current: watch::Sender<String>, token: CancellationToken) {
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
        if let Ok(addr) = master_addr(&target).await {
            if *current.borrow() != addr {
                tracing::warn!(master = %target.master, from = %*current.borrow(), to = %addr,
                    "Sentinel names a new master: closing connections to the old one");
                current.send_replace(addr);
            }
        }
    }
}

async fn relay(listener: TcpListener, seen: watch::Receiver<String>, token: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = token.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((client, _)) = accepted else {
            continue;
        };
        tokio::spawn(splice(client, seen.clone()));
    }
}

/// One client connection, spliced to the master named now until either
/// side closes or the sentinels name another master. Either way the client
/// sees its connection close, reconnects, and reaches the new master.
async fn splice(mut client: TcpStream, mut seen: watch::Receiver<String>) {
    // The master the follower confirmed last (within FOLLOW_EVERY): asking
    // the sentinels again for every connection would add two connections
    // and round trips to each client's connect.
    let addr = seen.borrow_and_update().clone();
    let mut server = match TcpStream::connect(&addr).await {
        Ok(server) => server,
        Err(e) => {
            // Dropping the client is what a refused connection looks like
            // to it; it retries, and reaches the next master named.
            tracing::warn!(error = %e, at = %addr, "cannot reach the Redis master");
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let _ = client.set_nodelay(true);
    let moved = async {
        loop {
            if *seen.borrow_and_update() != addr {
                return;
            }
            if seen.changed().await.is_err() {
                // The follower stopped with the process: keep splicing.
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = moved => {}
    }
}

/// Replaces a `redis+sentinel://` URL by a relay's `redis://` URL (started
/// here); any other URL is returned as it is.
pub async fn resolve(url: &str, token: &CancellationToken) -> Result<String> {
    if !crate::config::is_sentinel_url(url) {
        return Ok(url.to_string());
    }
    let target = SentinelUrl::parse(url).map_err(Error::Config)?;
    Ok(Relay::start(target, token.clone()).await?.url)
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_string()
}
