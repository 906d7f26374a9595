//! The transparent RESP proxy: producers point their Redis URL at it, and
//! every client connection is spliced 1:1 to its own upstream Redis
//! connection, byte for byte. Pushes on a route's key are honoured by the
//! route's phase:
//!
//! - `redis_only`: forwarded only.
//! - `dual_write`/`shadow`: forwarded; once Redis answers with an integer,
//!   the items are queued for the group-commit
//!   [`Mirror`](crate::mirror::Mirror) as mirror copies (LPUSHX/RPUSHX
//!   answering 0 pushed nothing and are not mirrored).
//!   Inside MULTI only when EXEC returns an array, and only the pushes whose
//!   element is an integer.
//! - `postgres_only`/`decommissioned`: not forwarded; written to Postgres as
//!   live copies and answered `:<items>` (or `-ERR qbridge: <reason>` so the
//!   producer retries) in their place in the reply order; inside MULTI
//!   answered `+QUEUED` and spliced into EXEC's array. LPUSHX/RPUSHX behave
//!   like LPUSH/RPUSH here: the list lives in Postgres now, so "push only if
//!   the list exists" has nothing to test against.
//!
//! Layout: [`frame`] (the codec), `command` (what a command means for
//! pairing; the tags), `reader` (client → Redis), `replies` (Redis → client,
//! settling pushes), `session` (the connection state replies depend on),
//! `auth` (AUTH through the splice and the proxy's own password),
//! `set_pop` and `pop_scripts` (a framework's pops out of its sets),
//! `push_scripts` (pushes a framework makes from a known Lua script),
//! `connection` (one splice), `upstream` (plain TCP or TLS to Redis),
//! `server` ([`ProxyServer`]).
//!
//! Authentication: AUTH, HELLO … AUTH and ACL users go to Redis, which
//! decides (a refused push is never mirrored). Where the proxy answers a
//! push itself (`postgres_only`, `decommissioned`) it first makes sure Redis
//! has the connection authenticated — a PING per new connection tells
//! whether Redis wants AUTH, and the session follows Redis's answers to
//! AUTH, HELLO and RESET — and answers `-NOAUTH Authentication required.`
//! otherwise. With `[proxy] password_file` / `QBRIDGE_PROXY_PASSWORD` the
//! proxy also has a password of its own: clients AUTH to the proxy, and the
//! upstream connection authenticates with the upstream URL's credentials.
//! See `auth` for the rules.
//!
//! A route matches a push by database and key: the connection's database
//! is tracked from Redis's answers (SELECT's `+OK`; RESET returns to 0; HELLO
//! keeps it), so the same list name used by another application under
//! another SELECT index passes through untouched.
//!
//! Replies: Redis answers every command the proxy forwards, so a push is
//! mirrored only once Redis said it took it, for that connection and its
//! user. A client's `CLIENT REPLY OFF|SKIP` reaches Redis as `CLIENT REPLY
//! ON`: its `+OK` (Redis accepted it from this connection) turns the
//! client's replies off in the session, which then withholds Redis's
//! answers from the client and still acts on them; a refusal (NOAUTH,
//! NOPERM) is forwarded and changes nothing, as in Redis.
//!
//! Known limits, by design or for later:
//! - `CLIENT REPLY` inside MULTI is answered with an error and the
//!   connection is closed: Redis would apply it during EXEC, in the middle
//!   of EXEC's own reply, and the proxy does not model that.
//! - After MONITOR the connection is passed through unparsed, so pushes on it
//!   are no longer mirrored.
//! - Commands that change the connection's state (HELLO, SUBSCRIBE) queued
//!   *inside* MULTI are forwarded, but their effect at EXEC is not tracked.
//! - A SELECT queued in MULTI is taken to succeed at EXEC for the pushes
//!   queued after it (an out-of-range index fails only there, and those
//!   pushes then run in the old database); the database after EXEC is read
//!   from EXEC's array.
//! - A routed push in `postgres_only` is answered even where Redis would
//!   have refused it (RESP2 subscribe mode, a wrong-type key, an ACL user
//!   denied the key: key permissions cannot be checked without Redis). An
//!   unauthenticated connection is refused, though (see above).
//! - AUTH queued inside MULTI takes effect at EXEC, which is not tracked: a
//!   local push after it still sees the connection as before the MULTI.
//!   With the proxy's password, AUTH inside MULTI is answered at once.
//! - Locally answered pushes of one pipelined connection are written by
//!   concurrent group commits, so their Postgres order may differ from the
//!   order they were sent in; each reply still comes in its place.
//! - A reply is forwarded once it is complete, so one connection holds its
//!   largest reply in memory; client commands are bounded by `max_bulk_len`.
//! - Clients speak plain RESP to the proxy (it listens without TLS, so keep
//!   it on loopback or a private network); a `rediss://` upstream is reached
//!   over TLS (`upstream`), trusting `[proxy] upstream_ca_file`.

mod auth;
mod command;
mod connection;
pub mod frame;
mod held_read;
mod link;
mod list_pop;
mod pop_scripts;
mod push_scripts;
mod reader;
mod replies;
mod server;
mod session;
mod set_pop;
mod upstream;

pub use server::{ProxyDeps, ProxyServer};
