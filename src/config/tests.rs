//! Unit tests of config parsing and validation.
use super::*;

fn load(text: &str) -> Result<Config> {
    Config::from_toml(text, &Overrides::default())
}

#[test]
fn full_config() {
    let cfg = load(
        r#"
        payload_limit = "64KiB"
        [http]
        listen = "127.0.0.1:9999"
        [[pools]]
        name = "mail"
        queues = ["emails"]
        concurrency = 4
        lease = "30s"
        tenant = { pointer = "/tenant", cap = 2 }
        handler = { type = "http", url = "http://127.0.0.1:8080/run", timeout = "5s" }
        [[pools]]
        queues = ["bulk"]
        handler = { type = "command", program = "/bin/cat", permanent_exit_codes = [75] }
        [[schedules]]
        name = "tick"
        queue = "emails"
        every = "60s"
        "#,
    )
    .unwrap();
    assert_eq!(cfg.payload_limit, 64 * 1024);
    assert_eq!(cfg.pools.len(), 2);
    assert_eq!(cfg.pools[0].batch_size, 4);
    assert_eq!(cfg.pools[0].tenant.as_ref().unwrap().path, vec!["tenant"]);
    assert_eq!(cfg.pools[1].name, "pool1");
    assert_eq!(cfg.schedules.len(), 1);
}

#[test]
fn unknown_keys_are_errors() {
    let err = load("colour = \"blue\"").unwrap_err().to_string();
    assert!(err.contains("colour"), "{err}");
    let err = load("[[pools]]\nqueues=[\"a\"]\nhandler={type=\"noop\"}\nconcurency=3")
        .unwrap_err()
        .to_string();
    assert!(err.contains("concurency"), "{err}");
    let err = load("[[pools]]\nqueues=[\"a\"]\nhandler={type=\"noop\", url=\"x\"}")
        .unwrap_err()
        .to_string();
    assert!(err.contains("url"), "{err}");
}

#[test]
fn wrong_types_and_values_are_errors() {
    assert!(load("max_connections = \"ten\"").is_err());
    assert!(load("[[pools]]\nqueues=[\"bad name\"]\nhandler={type=\"noop\"}").is_err());
    assert!(load("[[pools]]\nqueues=[\"a\"]\nconcurrency=0\nhandler={type=\"noop\"}").is_err());
    assert!(load("[[pools]]\nqueues=[\"a\"]\nlease=\"10x\"\nhandler={type=\"noop\"}").is_err());
    assert!(load("[[schedules]]\nname=\"x\"\nqueue=\"a\"\ncron=\"nope\"").is_err());
    assert!(load("[[schedules]]\nname=\"x\"\nqueue=\"a\"").is_err());
    assert!(load("[[pools]]\nqueues=[\"a\"]\nhandler={type=\"http\", url=\"ftp://x\"}").is_err());
}

#[test]
fn errors_are_one_line() {
    let err = load("[[pools]]\nqueues = 5").unwrap_err().to_string();
    assert!(!err.contains('\n'), "{err}");
}

/// One-line config error text, or a panic naming the accepted input.
fn err(text: &str) -> String {
    let Err(err) = load(text) else {
        panic!("{text:?} was accepted");
    };
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    let msg = err.to_string();
    assert!(!msg.contains('\n'), "{msg}");
    msg
}

#[test]
fn out_of_range_units_are_errors_not_panics() {
    let msg = err("shutdown_deadline = \"99999999999999999999d\"");
    assert!(msg.contains("shutdown_deadline"), "{msg}");
    let msg = err(&format!("payload_limit = \"{}MiB\"", usize::MAX / 1024));
    assert!(msg.contains("payload_limit"), "{msg}");
}

#[test]
fn bad_handler_headers_are_config_errors() {
    let pool = |headers: &str| {
        format!(
            "[[pools]]\nname = \"p\"\nqueues = [\"a\"]\n\
             handler = {{ type = \"http\", url = \"http://x/\", headers = {{ {headers} }} }}"
        )
    };
    let msg = err(&pool("\"bad name\" = \"v\""));
    assert!(msg.contains("bad name"), "{msg}");
    let msg = err(&pool("Authorization = \"Bearer s3cret\\nX: y\""));
    assert!(msg.contains("Authorization"), "{msg}");
    assert!(!msg.contains("s3cret"), "a header value leaked: {msg}");
    let cfg = load(&pool(
        "Authorization = \"Bearer s3cret\", X-Team = \"mail\"",
    ))
    .unwrap();
    assert_eq!(cfg.pools.len(), 1);
}

#[test]
fn schedules_that_cannot_work_are_refused() {
    let sched = |rest: &str| format!("[[schedules]]\nname = \"s\"\nqueue = \"a\"\n{rest}");
    for every in ["\"0s\"", "\"500ms\"", "\"999ms\""] {
        let msg = err(&sched(&format!("every = {every}")));
        assert!(msg.contains("at least 1s"), "{msg}");
    }
    assert!(load(&sched("every = \"1s\"")).is_ok());
    let msg = err(&sched("every = \"9999999999d\""));
    assert!(msg.contains("every"), "{msg}");
    let msg = err(&sched("cron = \"0 0 0 1 1 * 2001\""));
    assert!(msg.contains("no fire time"), "{msg}");
    let msg = err(&sched("cron = \"0 0 0 30 2 *\""));
    assert!(msg.contains("no fire time"), "{msg}");
    assert!(load(&sched("cron = \"0 0 0 1 1 *\"")).is_ok());
    let big = format!(
        "payload_limit = \"1KiB\"\n{}",
        sched(&format!(
            "every = \"1m\"\npayload = {{ blob = \"{}\" }}",
            "x".repeat(2000)
        ))
    );
    let msg = err(&big);
    assert!(msg.contains("over the limit"), "{msg}");
    assert!(!msg.contains("xxxx"), "the payload leaked: {msg}");
    let msg = err(&sched(&format!(
        "every = \"1m\"\nkind = \"{}\"",
        "k".repeat(1025)
    )));
    assert!(msg.contains("kind"), "{msg}");
}

#[test]
fn overrides_win() {
    let o = Overrides {
        database_url: Some("postgres://x@y/z".into()),
        http_listen: Some("0.0.0.0:1".into()),
        redis_url: Some("redis://r:6379".into()),
    };
    let cfg = Config::from_toml("database_url = \"postgres://a@b/c\"", &o).unwrap();
    assert_eq!(cfg.database_url, "postgres://x@y/z");
    assert_eq!(cfg.http.listen, "0.0.0.0:1");
    assert_eq!(cfg.redis_url, "redis://r:6379");
    assert_eq!(cfg.proxy.upstream, "redis://r:6379");
}

const ROUTE: &str =
    "[[routes]]\nredis_key = \"queue:mail\"\nqueue = \"mail\"\nformat = \"sidekiq\"\n";

#[test]
fn a_route_with_handler_and_consumers() {
    let cfg = load(&format!(
        "redis_url = \"rediss://:pw@cache:6380/2\"\n[proxy]\nenabled = true\nmirror_buffer = \"8MiB\"\n{ROUTE}\
         phase = \"shadow\"\npush = \"rpush\"\nhandler = {{ type = \"noop\" }}\npool = {{ concurrency = 3 }}\n\
         redis_consumer = {{ concurrency = 2, max_attempts = 5, consumer_name = \"w1\" }}\n\
         [[routes]]\nname = \"ev\"\nredis_key = \"events\"\nqueue = \"events\"\nformat = \"json\"\nkey_pointer = \"/meta/id\"\n"
    ))
    .unwrap();
    assert_eq!(cfg.routes.len(), 2);
    let mail = &cfg.routes[0];
    assert_eq!(
        (mail.name.as_str(), mail.phase),
        ("mail", crate::cutover::Phase::Shadow)
    );
    assert_eq!(mail.push, PushEnd::Rpush);
    assert_eq!(mail.redis_consumer.as_ref().unwrap().max_attempts, 5);
    assert_eq!(cfg.routes[1].phase, crate::cutover::Phase::RedisOnly);
    assert_eq!(cfg.routes[1].format.to_string(), "json:/meta/id");
    // The route's handler brings a pool for its queue.
    assert_eq!(cfg.pools.len(), 1);
    assert_eq!(
        (cfg.pools[0].name.as_str(), cfg.pools[0].concurrency),
        ("route:mail", 3)
    );
    assert_eq!(cfg.proxy.upstream, "rediss://:pw@cache:6380/2");
    assert_eq!(cfg.proxy.mirror_buffer, 8 << 20);
}

#[test]
fn bad_routes_are_refused_with_the_reason() {
    let cases = [
        (format!("{ROUTE}{}", ROUTE), "two routes have this name"),
        (format!("{ROUTE}{}", ROUTE.replace("queue = \"mail\"", "queue = \"other\"\nname = \"o\"")), "another route"),
        (ROUTE.replace("sidekiq", "yaml"), "unknown payload format"),
        (ROUTE.replace("sidekiq", "json"), "JSON pointer"),
        (ROUTE.replace("sidekiq", "json:id"), "must start with '/'"),
        (format!("{ROUTE}phase = \"dual-write\"\n"), "unknown phase"),
        (format!("{ROUTE}pool = {{ concurrency = 2 }}\n"), "need the route's handler"),
        (ROUTE.replace("\"mail\"", "\"ma il\""), "invalid queue name"),
        (ROUTE.replace("\"queue:mail\"", "\"\""), "redis_key is empty"),
        (format!("{ROUTE}colour = 1\n"), "colour"),
        (format!("{ROUTE}db = -1\n"), "db must be 0 or more"),
        (format!("{ROUTE}dedup_window = \"1s\"\n"), "dedup_window"),
        (
            format!("{ROUTE}handler = {{ type = \"noop\" }}\nredis_consumer = {{ consumer_name = \"a b\" }}\n"),
            "consumer_name",
        ),
        (
            format!("{ROUTE}handler = {{ type = \"noop\" }}\n[[pools]]\nqueues = [\"mail\"]\nhandler = {{ type = \"noop\" }}\n"),
            "served by both",
        ),
        ("redis_url = \"http://x\"".to_string(), "redis://"),
        ("redis_url = \"not a url\"".to_string(), "not a URL"),
        ("[proxy]\nmirror_batch = 0".to_string(), "mirror_batch"),
    ];
    for (text, expected) in cases {
        let err = load(&text).unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "{text:?} gave {err:?}, expected {expected:?}"
        );
        assert!(!err.contains('\n'), "{err}");
    }
}

#[test]
fn a_route_lives_in_the_database_of_redis_url() {
    let other = ROUTE
        .replace("queue = \"mail\"", "queue = \"other\"\nname = \"o\"")
        .replace("queue:mail", "queue:other");
    // db defaults to redis_url's database.
    let cfg = load(&format!(
        "redis_url = \"redis://h:6379/3\"\n{ROUTE}{other}db = 3\n"
    ))
    .unwrap();
    let dbs: Vec<i64> = cfg.routes.iter().map(|r| r.db).collect();
    assert_eq!(dbs, [3, 3]);
    // A route elsewhere would be captured by the proxy there but consumed
    // and repaired in redis_url's database: refused.
    let err = load(&format!("{ROUTE}db = 3\n")).unwrap_err().to_string();
    assert!(
        err.contains("differs from the database of redis_url"),
        "{err}"
    );
    let err = load("redis_url = \"redis://h/x\"").unwrap_err().to_string();
    assert!(err.contains("database number"), "{err}");
}

#[test]
fn redis_url_passwords_are_redacted_in_errors() {
    let err = load("redis_url = \"ftp://user:hunter2@h/\"")
        .unwrap_err()
        .to_string();
    assert!(!err.contains("hunter2"), "{err}");
}
