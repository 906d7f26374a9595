//! Every table of the config file refuses an unknown key and a value of the
//! wrong type with one line that names the key, and route and consumer names
//! are held to the characters that are safe in Redis keys and SCAN patterns.

use super::*;

/// A config whose only problem is `line`, placed inside `table`.
fn with(table: &str, line: &str) -> String {
    let pool = "[[pools]]\nqueues = [\"a\"]\nhandler = { type = \"noop\" }\n";
    let route = format!("{ROUTE}handler = {{ type = \"noop\" }}\n");
    match table {
        "" => format!("{line}\n"),
        "http" | "proxy" | "history" => format!("[{table}]\n{line}\n"),
        "pools" => format!("{pool}{line}\n"),
        "pools.tenant" => format!("{pool}tenant = {{ pointer = \"/t\", cap = 1, {line} }}\n"),
        "pools.handler" => format!(
            "[[pools]]\nqueues = [\"a\"]\nhandler = {{ type = \"http\", url = \"http://x/\", {line} }}\n"
        ),
        "schedules" => format!("[[schedules]]\nname = \"s\"\nqueue = \"a\"\nevery = \"1m\"\n{line}\n"),
        "routes" => format!("{route}{line}\n"),
        "routes.pool" | "routes.redis_consumer" | "routes.shadow" | "routes.diff"
        | "routes.gates" => format!("{route}[{table}]\n{line}\n"),
        other => panic!("no table {other}"),
    }
}

#[test]
fn unknown_keys_are_refused_by_name_in_every_table() {
    for table in [
        "",
        "http",
        "proxy",
        "history",
        "pools",
        "pools.tenant",
        "pools.handler",
        "schedules",
        "routes",
        "routes.pool",
        "routes.redis_consumer",
        "routes.shadow",
        "routes.diff",
        "routes.gates",
    ] {
        let msg = err(&with(table, "colour_key = 1"));
        assert!(msg.contains("colour_key"), "[{table}]: {msg}");
    }
}

#[test]
fn wrong_types_are_refused_by_name_in_every_table() {
    let cases = [
        ("", "completer_batch = \"many\""),
        ("", "shutdown_deadline = 30"),
        ("", "redis_url = 6379"),
        ("http", "listen = 9000"),
        ("http", "max_body = \"huge\""),
        ("http", "max_body = -1"),
        ("proxy", "enabled = \"yes\""),
        ("proxy", "max_elements = -5"),
        ("proxy", "max_bulk_len = \"9223372036854775807MiB\""),
        ("proxy", "mirror_buffer = [1]"),
        ("history", "retention_days = \"forever\""),
        ("history", "retention_days = 4294967296"),
        ("pools", "batch_size = 1.5"),
        ("pools", "poll_interval = \"often\""),
        ("pools.tenant", "pointer2 = 1"),
        ("pools.handler", "timeout = 5"),
        ("schedules", "priority = \"high\""),
        ("schedules", "kind = 7"),
        ("routes", "db = \"zero\""),
        ("routes", "max_attempts = 2147483648"),
        ("routes", "dedup_window = true"),
        ("routes.pool", "concurrency = \"lots\""),
        ("routes.pool", "lease = 60"),
        ("routes.redis_consumer", "max_attempts = -1"),
        ("routes.redis_consumer", "retry_delay = \"soon\""),
        ("routes.shadow", "noise_sample = \"half\""),
        ("routes.diff", "ignore_fields = \"jid\""),
        ("routes.diff", "sample_keys = -3"),
        ("routes.gates", "min_jobs = \"some\""),
        ("routes.gates", "window = 10"),
    ];
    for (table, line) in cases {
        let key = line.split(" = ").next().unwrap_or_default();
        let msg = err(&with(table, line));
        assert!(msg.contains(key), "[{table}] {line}: {msg}");
    }
}

#[test]
fn route_names_outside_the_safe_characters_are_refused() {
    for name in [
        "a*", "a:b", "a b", "a;b", "a\"b", "a'b", "émails", "a?", "[a]", "a\\b", "", "a/b",
    ] {
        let text = ROUTE.replace(
            "queue = \"mail\"",
            &format!("queue = \"mail\"\nname = {}", toml::Value::from(name)),
        );
        let msg = err(&text);
        assert!(msg.contains("A-Z a-z 0-9 _ . -"), "{name:?}: {msg}");
        assert!(!msg.contains("defaults to the queue name"), "{msg}");
    }
    // A queue with `:` is fine, but then the route needs its own name.
    let colon = ROUTE.replace("queue = \"mail\"", "queue = \"jobs:mail\"");
    let msg = err(&colon);
    assert!(msg.contains("defaults to the queue name"), "{msg}");
    let named = colon.replace(
        "queue = \"jobs:mail\"",
        "queue = \"jobs:mail\"\nname = \"mail.v2-x_1\"",
    );
    assert_eq!(load(&named).unwrap().routes[0].name, "mail.v2-x_1");
}

#[test]
fn consumer_names_outside_the_safe_characters_are_refused() {
    for name in ["b:c", "w*", "a b", "x;y", "é"] {
        let text = format!(
            "{ROUTE}handler = {{ type = \"noop\" }}\nredis_consumer = {{ consumer_name = {} }}\n",
            toml::Value::from(name)
        );
        let msg = err(&text);
        assert!(msg.contains("consumer_name"), "{name:?}: {msg}");
    }
}
