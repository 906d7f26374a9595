//! The reply side against a fake upstream: a local listener the test writes
//! scripted RESP3 bytes to, so it decides whether a reply or its command's
//! tag comes first, which a real reader and Redis leave to the scheduler.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::*;
use crate::config::{PushEnd, RouteConfig};
use crate::mirror::{Mirror, MirrorOptions};
use crate::model::formats::Format;
use crate::model::Phase;
use crate::proxy::command::{Family, LocalStore};
use crate::proxy::frame::Limits;
use crate::routes::{Route, Routes};

const WAIT: Duration = Duration::from_secs(5);

/// Both ends of a TCP connection on loopback.
async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("addr");
    let (near, far) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (near.expect("connects"), far.expect("accepts").0)
}

/// A reply side between a fake Redis and a client, and its tag channel.
struct Rig {
    redis: TcpStream,
    client: TcpStream,
    tags: mpsc::Sender<Tag>,
    link: Arc<Link>,
    route: Arc<Route>,
    _replies: JoinHandle<()>,
}

async fn rig() -> Rig {
    let (redis, upstream) = pair().await;
    let (client, downstream) = pair().await;
    let config = RouteConfig {
        name: "r".into(),
        redis_key: "q".into(),
        db: 0,
        queue: "r".into(),
        format: Format::json("/id").expect("format"),
        phase: Phase::PostgresOnly,
        push: PushEnd::Lpush,
        dedup_window: Duration::from_secs(3600),
        max_attempts: None,
        handler: None,
        redis_consumer: None,
        redis_side: crate::config::RedisSideKind::Fleet,
        keys: Default::default(),
        cutover: Default::default(),
    };
    let routes = Routes::from_config(&[config]);
    let route = Arc::clone(routes.by_name("r").expect("route"));
    // Never connects: these tests write nothing to Postgres.
    let pool = PgPoolOptions::new()
        .connect_lazy("postgres://postgres@127.0.0.1:5432/postgres")
        .expect("lazy pool");
    let opts = MirrorOptions {
        buffer_bytes: 1 << 20,
        batch_items: 10,
        writers: 1,
        linger: crate::config::DEFAULT_MIRROR_LINGER,
        payload_limit: 1 << 20,
    };
    let (mirror, _writers) = Mirror::start(pool, None, opts);
    let shared = Arc::new(Shared {
        gate: None,
        routes,
        mirror,
        limits: Limits::default(),
        reply_limits: Limits::default(),
        commands: metrics::Counter::noop(),
        latency: metrics::Histogram::noop(),
        protocol_errors: metrics::Counter::noop(),
        pop_scripts: Default::default(),
    });
    let (tags, rx) = mpsc::channel(16);
    let link = Arc::new(Link::new(true, None));
    let replies = Replies::new(
        1,
        upstream.into_split().0,
        downstream.into_split().1,
        rx,
        Arc::clone(&link),
        shared,
        CancellationToken::new(),
    );
    Rig {
        redis,
        client,
        tags,
        link,
        route,
        _replies: tokio::spawn(replies.run()),
    }
}

impl Rig {
    async fn tag(&self, cmd: Cmd) {
        let tag = Tag::Sent {
            cmd,
            cost: Duration::ZERO,
        };
        self.tags.send(tag).await.expect("reply side runs");
    }

    /// A push answered locally with `:1` (its store already done).
    async fn local(&self) {
        let push = LocalPush {
            route: Arc::clone(&self.route),
            items: 1,
            store: LocalStore::Started(tokio::spawn(async { Ok(1) })),
        };
        self.tags
            .send(Tag::Local(push))
            .await
            .expect("reply side runs");
    }

    /// Reads exactly `want.len()` bytes from the client and compares.
    async fn expect(&mut self, want: &[u8]) {
        let mut got = vec![0u8; want.len()];
        tokio::time::timeout(WAIT, self.client.read_exact(&mut got))
            .await
            .unwrap_or_else(|_| panic!("no {:?} within {WAIT:?}", String::from_utf8_lossy(want)))
            .expect("reads");
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want));
    }
}

fn subscribe() -> Cmd {
    Cmd::Subscribe {
        family: Family::Channel,
        count: 1,
    }
}

const CONFIRMATION: &[u8] = b">3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n";

#[tokio::test]
async fn a_confirmation_that_beats_its_tag_is_paired_with_it() {
    let mut rig = rig().await;
    // The reader counts the SUBSCRIBE, writes it, and is descheduled before
    // it hands over the tag; Redis confirms at once.
    rig.link.pubsub_sent.fetch_add(1, Ordering::Release);
    rig.redis.write_all(CONFIRMATION).await.expect("writes");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // SUBSCRIBE ch, PING, a locally answered push, SET.
    rig.tag(subscribe()).await;
    rig.tag(Cmd::Plain).await;
    rig.local().await;
    rig.tag(Cmd::Plain).await;
    rig.redis
        .write_all(b"+PONG\r\n+OK\r\n")
        .await
        .expect("writes");
    // Paired as out of band, the confirmation left SUBSCRIBE to take +PONG,
    // and the local `:1` came after SET's +OK instead of before it.
    let mut want = CONFIRMATION.to_vec();
    want.extend_from_slice(b"+PONG\r\n:1\r\n+OK\r\n");
    rig.expect(&want).await;
}

#[tokio::test]
async fn unsolicited_pushes_are_forwarded_without_waiting_for_a_tag() {
    let mut rig = rig().await;
    // Redis's own `sunsubscribe` when a shard channel's slot moves: no
    // (un)subscribe command is outstanding, so no tag will come for it.
    let sunsubscribe = b">3\r\n$12\r\nsunsubscribe\r\n$2\r\nch\r\n:0\r\n";
    rig.redis.write_all(sunsubscribe).await.expect("writes");
    rig.expect(sunsubscribe).await;
    // A message while a SUBSCRIBE's tag is still on its way is no
    // confirmation: it goes on at once too.
    rig.link.pubsub_sent.fetch_add(1, Ordering::Release);
    let message = b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n";
    rig.redis.write_all(message).await.expect("writes");
    rig.expect(message).await;
    // Then the SUBSCRIBE's confirmation and tag arrive, and pairing holds.
    rig.redis.write_all(CONFIRMATION).await.expect("writes");
    rig.tag(subscribe()).await;
    rig.tag(Cmd::Plain).await;
    rig.local().await;
    rig.redis.write_all(b"+PONG\r\n").await.expect("writes");
    let mut want = CONFIRMATION.to_vec();
    want.extend_from_slice(b"+PONG\r\n:1\r\n");
    rig.expect(&want).await;
}
