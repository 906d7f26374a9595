//! Unit tests of config parsing and validation.
use super::*;

mod key_names;
mod tables;

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
    // Not concurrency (4): claims may carry a prefetch beyond the handlers.
    assert_eq!(cfg.pools[0].batch_size, 100);
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
    let long_window = "[[pools]]\nqueues=[\"a\"]\nprefetch_window=\"2s\"\nhandler={type=\"noop\"}";
    let err = load(long_window).unwrap_err().to_string();
    assert!(
        err.contains("prefetch_window must be at most 500ms"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
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
        ..Overrides::default()
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
        ("mail", crate::model::Phase::Shadow)
    );
    assert_eq!(mail.push, PushEnd::Rpush);
    assert_eq!(mail.redis_consumer.as_ref().unwrap().max_attempts, 5);
    assert_eq!(cfg.routes[1].phase, crate::model::Phase::RedisOnly);
    assert_eq!(cfg.routes[1].format.to_string(), "json:/meta/id");
    // The route's handler brings a pool for its queue.
    assert_eq!(cfg.pools.len(), 1);
    assert_eq!(
        (cfg.pools[0].name.as_str(), cfg.pools[0].concurrency),
        ("route:mail", 3)
    );
    assert_eq!(cfg.proxy.upstream, "rediss://:pw@cache:6380/2");
    assert_eq!(cfg.proxy.mirror_buffer, 8 << 20);
    assert_eq!(
        cfg.proxy.mirror_linger,
        crate::config::DEFAULT_MIRROR_LINGER
    );
    let off = load("[proxy]\nmirror_linger = \"0s\"").unwrap();
    assert_eq!(off.proxy.mirror_linger, std::time::Duration::ZERO);
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
        ("[proxy]\nmirror_linger = \"2s\"".to_string(), "mirror_linger must be at most 1000ms"),
        ("[proxy]\nmirror_linger = \"soon\"".to_string(), "mirror_linger"),
        (format!("{ROUTE}priority_steps = [0, 5]\n"), "needs format = \"celery\""),
        (
            format!("{}priority_steps = [0, 5, 5]\n", ROUTE.replace("sidekiq", "celery")),
            "ascending order",
        ),
        (
            format!("{}priority_steps = [0, 300]\n", ROUTE.replace("sidekiq", "celery")),
            "between 0 and 255",
        ),
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

/// The test route with a handler and `tables` appended (TOML sub-tables of
/// the last `[[routes]]` entry, e.g. `[routes.gates]`).
fn cutover_route(tables: &str) -> String {
    format!("{ROUTE}handler = {{ type = \"noop\" }}\n{tables}")
}

#[test]
fn cutover_tables_default_when_absent() {
    let cfg = load(&cutover_route("")).unwrap();
    let c = &cfg.routes[0].cutover;
    assert_eq!(*c, CutoverConfig::default());
    assert_eq!(c.shadow.dual_write, DualWriteMirrors::Ledger);
    assert_eq!(c.shadow.handler, None);
    assert_eq!(c.shadow.noise_sample, 0.01);
    assert!(c.diff.ignore_fields.is_empty() && c.diff.ignore_patterns.is_empty());
    assert_eq!(c.diff.settle, Duration::from_secs(30));
    assert_eq!(c.diff.sample_keys, 10);
    assert_eq!(c.gates.window, Duration::from_secs(600));
    assert_eq!(c.gates.min_jobs, 100);
    assert_eq!(c.gates.mirror_completeness, 0.9999);
    assert_eq!(c.gates.ack_tolerance, 0.001);
    assert_eq!(c.gates.max_mismatch_rate, 0.001);
    assert_eq!(c.gates.max_postgres_lag, Duration::from_secs(5));
    assert_eq!(c.gates.quiet_period, Duration::from_secs(600));
    assert_eq!(c.gates.decommission_wait, Duration::from_secs(60));
    // Empty tables are the same as none.
    let cfg = load(&cutover_route(
        "[routes.shadow]\n[routes.diff]\n[routes.gates]\n",
    ))
    .unwrap();
    assert_eq!(cfg.routes[0].cutover, CutoverConfig::default());
}

#[test]
fn cutover_tables_are_read() {
    let cfg = load(&cutover_route(
        "[routes.shadow]\ndual_write = \"shadow\"\nnoise_sample = 0.5\n\
         handler = { type = \"http\", url = \"http://127.0.0.1:8081/shadow\", timeout = \"2s\" }\n\
         [routes.diff]\nignore_fields = [\"/at\", \"/items/*/id\"]\nignore_patterns = [\"[0-9a-f]{32}\"]\n\
         settle = \"5s\"\nsample_keys = 3\n\
         [routes.gates]\nwindow = \"1m\"\nmin_jobs = 5\nmirror_completeness = 1\nack_tolerance = 0.01\n\
         max_mismatch_rate = 0\nmax_postgres_lag = \"250ms\"\nquiet_period = \"1s\"\ndecommission_wait = \"5m\"\n",
    ))
    .unwrap();
    let c = &cfg.routes[0].cutover;
    assert_eq!(c.shadow.dual_write, DualWriteMirrors::Shadow);
    assert_eq!(c.shadow.noise_sample, 0.5);
    match &c.shadow.handler {
        Some(HandlerConfig::Http { url, timeout, .. }) => {
            assert_eq!(url, "http://127.0.0.1:8081/shadow");
            assert_eq!(timeout.0, Duration::from_secs(2));
        }
        other => panic!("shadow handler: {other:?}"),
    }
    assert_eq!(c.diff.ignore_fields, ["/at", "/items/*/id"]);
    assert_eq!(c.diff.ignore_patterns, ["[0-9a-f]{32}"]);
    assert_eq!(
        (c.diff.settle, c.diff.sample_keys),
        (Duration::from_secs(5), 3)
    );
    assert_eq!(
        c.gates,
        GatesConfig {
            window: Duration::from_secs(60),
            min_jobs: 5,
            mirror_completeness: 1.0,
            ack_tolerance: 0.01,
            max_mismatch_rate: 0.0,
            max_postgres_lag: Duration::from_millis(250),
            quiet_period: Duration::from_secs(1),
            decommission_wait: Duration::from_secs(300),
        }
    );
    // A shadow command handler and the inline-table form are accepted too,
    // and the route's own handler stays the live one.
    let cfg = load(&cutover_route(
        "shadow = { dual_write = \"skip\", handler = { type = \"command\", program = \"/bin/cat\", args = [\"-\"] } }\n",
    ))
    .unwrap();
    let route = &cfg.routes[0];
    assert_eq!(route.cutover.shadow.dual_write, DualWriteMirrors::Skip);
    assert!(matches!(
        route.cutover.shadow.handler,
        Some(HandlerConfig::Command { ref program, .. }) if program == "/bin/cat"
    ));
    assert_eq!(route.handler, Some(HandlerConfig::Noop {}));
    // The cutover tables need no handler on the route (an outside fleet
    // may run the jobs and report outcomes).
    let cfg = load(&format!(
        "{ROUTE}[routes.gates]\nmin_jobs = 1\n[routes.shadow]\ndual_write = \"shadow\"\n"
    ))
    .unwrap();
    assert_eq!(cfg.routes[0].cutover.gates.min_jobs, 1);
}

#[test]
fn unknown_keys_in_cutover_tables_are_refused_by_name() {
    for (table, key) in [
        ("shadow", "dual_writes"),
        ("diff", "ignore_field"),
        ("gates", "min_job"),
        ("gates", "mirror_completness"),
    ] {
        let msg = err(&cutover_route(&format!("[routes.{table}]\n{key} = 1\n")));
        assert!(msg.contains(key), "[routes.{table}] {key}: {msg}");
    }
    // Inside the shadow handler table too.
    let msg = err(&cutover_route(
        "[routes.shadow]\nhandler = { type = \"noop\", url = \"http://x/\" }\n",
    ));
    assert!(msg.contains("url"), "{msg}");
}

#[test]
fn bad_cutover_values_are_refused_naming_the_key() {
    let cases = [
        (
            "[routes.gates]\nmirror_completeness = 2\n",
            "gates.mirror_completeness",
        ),
        (
            "[routes.gates]\nmirror_completeness = -0.1\n",
            "gates.mirror_completeness",
        ),
        (
            "[routes.gates]\nmirror_completeness = nan\n",
            "gates.mirror_completeness",
        ),
        (
            "[routes.gates]\nack_tolerance = 1.5\n",
            "gates.ack_tolerance",
        ),
        (
            "[routes.gates]\nmax_mismatch_rate = 7\n",
            "gates.max_mismatch_rate",
        ),
        ("[routes.gates]\nwindow = \"500ms\"\n", "gates.window"),
        ("[routes.gates]\nmin_jobs = -1\n", "min_jobs"),
        ("[routes.gates]\nmin_jobs = \"lots\"\n", "min_jobs"),
        ("[routes.gates]\nquiet_period = \"soon\"\n", "quiet_period"),
        (
            "[routes.gates]\ndecommission_wait = \"a while\"\n",
            "decommission_wait",
        ),
        (
            "[routes.shadow]\nnoise_sample = 1.01\n",
            "shadow.noise_sample",
        ),
        ("[routes.shadow]\ndual_write = \"sometimes\"\n", "sometimes"),
        ("[routes.diff]\nsample_keys = 5000\n", "diff.sample_keys"),
        ("[routes.diff]\nsettle = \"10x\"\n", "settle"),
        ("[routes.diff]\nignore_fields = \"/at\"\n", "ignore_fields"),
    ];
    for (tables, expected) in cases {
        let msg = err(&cutover_route(tables));
        assert!(
            msg.contains(expected),
            "{tables:?} gave {msg:?}, expected {expected:?}"
        );
    }
    // The route is named, so an operator with many routes finds it.
    let msg = err(&cutover_route("[routes.gates]\nmirror_completeness = 2\n"));
    assert!(msg.contains("route \"mail\""), "{msg}");
    assert!(msg.contains('2'), "the bad value is shown: {msg}");
}

#[test]
fn bad_ignore_rules_are_refused_on_one_line() {
    // `err` checks the message is one line: the regex error draws a caret
    // over several.
    let msg = err(&cutover_route("[routes.diff]\nignore_patterns = [\"(\"]\n"));
    assert!(msg.contains("diff.ignore_patterns"), "{msg}");
    assert!(msg.contains("\"(\""), "the pattern is named: {msg}");
    let msg = err(&cutover_route(
        "[routes.diff]\nignore_patterns = [\"ok\", \"[a-\"]\n",
    ));
    assert!(msg.contains("\"[a-\""), "{msg}");

    let msg = err(&cutover_route("[routes.diff]\nignore_fields = [\"at\"]\n"));
    assert!(
        msg.contains("diff.ignore_fields")
            && msg.contains("\"at\"")
            && msg.contains("JSON pointer"),
        "{msg}"
    );
    let msg = err(&cutover_route(
        "[routes.diff]\nignore_fields = [\"/ok\", \"\"]\n",
    ));
    assert!(msg.contains("JSON pointer"), "{msg}");
}

/// A shadow handler is checked like a pool's handler: a URL that is not
/// http(s), a header HTTP cannot carry or an empty program fails at load,
/// not on the first shadow call (or at `qbridge run` start-up).
#[test]
fn a_bad_shadow_handler_is_refused_at_load() {
    for (handler, expected) in [
        ("{ type = \"http\", url = \"ftp://x/\" }", "ftp://x/"),
        ("{ type = \"http\", url = \"not a url\" }", "not a url"),
        (
            "{ type = \"http\", url = \"http://x/\", headers = { \"bad name\" = \"v\" } }",
            "bad name",
        ),
        ("{ type = \"command\", program = \"\" }", "program"),
    ] {
        let msg = err(&cutover_route(&format!(
            "[routes.shadow]\nhandler = {handler}\n"
        )));
        assert!(
            msg.contains("shadow") && msg.contains(expected),
            "{handler}: {msg}"
        );
    }
}

#[test]
fn a_celery_route_takes_kombus_priority_steps() {
    let text = format!(
        "{}priority_steps = [0, 4, 8]\n",
        ROUTE.replace("sidekiq", "celery")
    );
    let cfg = load(&text).unwrap();
    assert_eq!(
        cfg.routes[0].keys.priority_steps.as_deref(),
        Some(&[4u8, 8][..])
    );
    let route = &cfg.routes[0];
    let lists = crate::model::structures::priority_lists(
        &route.format,
        route.redis_key.as_bytes(),
        &route.keys,
    );
    let expected: Vec<&[u8]> = vec![b"queue:mail\x06\x164", b"queue:mail\x06\x168"];
    assert_eq!(lists, expected);
}
