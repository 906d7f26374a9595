//! `qbridge survey` against throwaway Redis servers filled by the real
//! framework clients: Sidekiq 6.4 plain and namespaced with
//! gitlab-sidekiq-fetcher and a real worker (`ruby`), Celery 5.7 with
//! priorities, a worker's `unacked` and a `global_keyprefix`, RQ 3.0 with a
//! failed job and a real worker (`python`). Resque's layout is written here
//! as its source writes it (no Resque client runs here), beside plain lists;
//! push rates are measured against pushes made while the survey samples.
//!
//! Every survey runs as an ACL user that may only read, its `ACL LOG` must
//! stay empty, every key's DUMP is the same after it when nothing else
//! writes, and no form of the payloads' marker appears in what it printed or
//! wrote; the draft config it writes must load (`harness`).

mod harness;
mod python;
mod ruby;

use std::time::Duration;

use harness::{admin, MARK};
use qbridge::config::PushEnd;

use crate::servers::ThrowawayRedis;
use crate::support;

/// Writes Resque's and resque-scheduler's keys as `data_store.rb`,
/// `failure/redis.rb` and `delaying_extensions.rb` do, under `resque:`.
async fn resque_layout(conn: &mut redis::aio::MultiplexedConnection) {
    let job = |n: u32| format!(r#"{{"class":"Mail","args":["{MARK}",{n}]}}"#);
    let failed = |retried: &str| {
        format!(
            r#"{{"failed_at":"2026/11/26 00:59:00 UTC","payload":{{"class":"Mail","args":["{MARK}"]}},"exception":"RuntimeError","error":"boom","backtrace":["app/jobs/mail.rb:3"],"worker":"host:42:mail","queue":"mail"{retried}}}"#
        )
    };
    let ts = 4_102_444_800u64; // 2100-01-01: never due
    let delayed = format!(r#"{{"class":"Mail","args":["{MARK}",9],"queue":"mail"}}"#);
    let working = format!(
        r#"{{"queue":"mail","run_at":"2026-11-26T01:00:00Z","payload":{{"class":"Mail","args":["{MARK}",8]}}}}"#
    );
    let _: () = redis::pipe()
        .cmd("SADD")
        .arg("resque:queues")
        .arg("mail")
        .cmd("RPUSH")
        .arg("resque:queue:mail")
        .arg(job(1))
        .arg(job(2))
        .cmd("RPUSH")
        .arg("resque:failed")
        .arg(failed(""))
        .arg(failed(r#","retried_at":"2026/11/26 01:00:00 UTC""#))
        .cmd("RPUSH")
        .arg(format!("resque:delayed:{ts}"))
        .arg(&delayed)
        .cmd("SADD")
        .arg(format!("resque:timestamps:{delayed}"))
        .arg(format!("delayed:{ts}"))
        .cmd("ZADD")
        .arg("resque:delayed_queue_schedule")
        .arg(ts)
        .arg(ts)
        .cmd("SADD")
        .arg("resque:workers")
        .arg("host:42:mail")
        .cmd("SET")
        .arg("resque:worker:host:42:mail")
        .arg(working)
        .cmd("SET")
        .arg("resque:worker:host:42:mail:started")
        .arg("2026-11-26 01:00:00 +0000")
        .cmd("SET")
        .arg("resque:stat:processed")
        .arg(7)
        .query_async(conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn resque_and_plain_lists_without_a_write() {
    let redis = ThrowawayRedis::start();
    let mut conn = admin(&redis).await;
    resque_layout(&mut conn).await;
    let with_id = |n: u32| format!(r#"{{"id":"job-{n}","note":"{MARK}"}}"#);
    let _: () = redis::pipe()
        .cmd("LPUSH")
        .arg("jobs:incoming")
        .arg(with_id(1))
        .arg(with_id(2))
        .cmd("LPUSH")
        .arg("raw:stuff")
        .arg(format!("{MARK} plain bytes"))
        .cmd("LPUSH")
        .arg("qbridge:gap:other")
        .arg("qbridge's own")
        .query_async(&mut conn)
        .await
        .unwrap();

    let s = harness::survey_read_only(&redis, "1s", true).await;
    assert_eq!(s.counts("resque", "", "mail"), [2, 1, -1, 1, 1]);
    assert_eq!(s.found("resque", "")["workers"], 1);
    assert_eq!(s.row("resque", "", "mail")["push"], "rpush");
    assert_eq!(
        s.row("list", "", "jobs:incoming")["format_guess"],
        "json:/id"
    );
    assert_eq!(s.row("list", "", "raw:stuff")["format_guess"], "raw");
    // resque-scheduler's delayed lists and the failed list are Resque's;
    // qbridge's own lists are nobody's queue.
    assert_eq!(s.json["queues"].as_array().unwrap().len(), 3, "{}", s.json);

    let routes: Vec<(&str, &str, String, PushEnd)> = s
        .draft
        .routes
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.redis_key.as_str(),
                r.format.to_string(),
                r.push,
            )
        })
        .collect();
    assert_eq!(
        routes,
        [
            ("mail", "resque:queue:mail", "resque".into(), PushEnd::Rpush),
            (
                "jobs_incoming",
                "jobs:incoming",
                "json:/id".into(),
                PushEnd::Lpush
            ),
            ("raw_stuff", "raw:stuff", "raw".into(), PushEnd::Lpush),
        ]
    );
    assert!(
        s.draft_text.contains("DECIDE: is this list a queue?"),
        "{}",
        s.draft_text
    );
}

#[tokio::test]
async fn past_two_hundred_plain_lists_the_longest_get_a_row() {
    let redis = ThrowawayRedis::start();
    let mut conn = admin(&redis).await;
    let mut pipe = redis::pipe();
    for n in 0..205u32 {
        // list:000 holds one item, list:204 holds 205.
        let items: Vec<String> = (0..=n).map(|i| format!("{MARK} {i}")).collect();
        pipe.cmd("RPUSH").arg(format!("list:{n:03}")).arg(items);
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();

    let s = harness::survey_read_only(&redis, "0s", true).await;
    let rows = s.json["queues"].as_array().unwrap();
    assert_eq!(rows.len(), 200);
    assert_eq!(rows[0]["queue"], "list:005");
    assert_eq!(s.draft.routes.len(), 200);
    let found = s.found("list", "");
    assert!(
        found["options"]
            .to_string()
            .contains("5 more plain lists not shown"),
        "{found}"
    );
}

#[tokio::test]
async fn push_rates_count_what_arrived_in_the_window() {
    let redis = ThrowawayRedis::start();
    let conn = admin(&redis).await;
    let stop = tokio_util::sync::CancellationToken::new();
    // Both lists get a push every 10 ms. `jobs:steady` only grows.
    // `jobs:drained` holds a backlog when the survey starts (so its scan
    // finds it); 1.2 s into the 2 s window a worker starts taking
    // everything, the item that was newest at the start included: its
    // count can only be a lower bound.
    let _: () = redis::cmd("LPUSH")
        .arg("jobs:drained")
        .arg((0..50).map(|n| format!("backlog {n}")).collect::<Vec<_>>())
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    let producer = {
        let (mut conn, stop) = (conn.clone(), stop.clone());
        tokio::spawn(async move {
            let mut pushed = 0u64;
            while !stop.is_cancelled() {
                pushed += 1;
                let item = format!(r#"{{"id":{pushed},"m":"{MARK}"}}"#);
                let _: () = redis::pipe()
                    .cmd("LPUSH")
                    .arg("jobs:steady")
                    .arg(&item)
                    .cmd("LPUSH")
                    .arg("jobs:drained")
                    .arg(&item)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            pushed
        })
    };
    let consumer = {
        let (mut conn, stop) = (conn.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            while !stop.is_cancelled() {
                let item: Option<Vec<u8>> = redis::cmd("RPOP")
                    .arg("jobs:drained")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if item.is_none() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        })
    };
    support::wait_for("the lists exist", Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move {
            redis::cmd("EXISTS")
                .arg("jobs:steady")
                .query_async::<u64>(&mut conn)
                .await
                .unwrap()
                == 1
        }
    })
    .await;
    let s = harness::survey_read_only(&redis, "2s", false).await;
    stop.cancel();
    let pushed = producer.await.unwrap();
    consumer.await.unwrap();

    let steady = &s.row("list", "", "jobs:steady")["push_rate"];
    assert_eq!(steady["exact"], true, "{steady}");
    let counted = steady["pushed"].as_u64().unwrap();
    // Two seconds of a push every 10 ms on a busy machine: well above 20,
    // and never more than were pushed in all.
    assert!(
        counted >= 20 && counted <= pushed,
        "{counted} of {pushed}: {steady}"
    );
    let drained = &s.row("list", "", "jobs:drained")["push_rate"];
    assert_eq!(drained["exact"], false, "{drained}");
    // The server's counters saw every push call the lists show, and more
    // (the drained list's).
    let server = s.json["server_pushes"]["push_calls_per_second"]
        .as_f64()
        .unwrap();
    assert!(
        server >= steady["per_second"].as_f64().unwrap(),
        "{}",
        s.json
    );
    assert!(s.text.contains("push/s"), "{}", s.text);
}

#[tokio::test]
async fn a_survey_refuses_to_overwrite_and_names_bad_input_in_one_line() {
    let redis = ThrowawayRedis::start();
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("qbridge.toml");
    std::fs::write(&existing, "# mine\n").unwrap();
    let out = support::qbridge(&[
        "survey",
        "--redis-url",
        &url,
        "--write-config",
        existing.to_str().unwrap(),
    ])
    .await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("exists") && err.contains("never overwrites"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "# mine\n");

    let out = support::qbridge(&["survey", "--redis-url", &url, "--sample", "soon"]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--sample"), "{err}");

    let out =
        support::qbridge(&["survey", "--redis-url", "redis://u:hunter2pw@127.0.0.1:1/0"]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        !err.contains("hunter2pw") && err.contains("cannot connect to Redis"),
        "{err}"
    );
}
