//! Jobs Sidekiq schedules (`perform_in`) go to its `schedule`
//! sorted set, not to the list, and Sidekiq's poller later moves them to the
//! list. Real Sidekiq 6.4 pushes through the proxy in `dual_write`: each
//! route's members of `schedule` become mirror copies when Redis takes them
//! (due at their score; another queue's member is not the route's), and the
//! poller's move to the list is the same job (its `jid`), not a second one.
//! After the flip to `postgres_only`, the poller's move of a job scheduled
//! before it runs the job live in Postgres, once: Redis handed the job out
//! of `schedule` (the reply to the poller's pop names it) and its push does
//! not reach Redis.

use std::time::Duration;

use sqlx::PgPool;

use crate::exactly_once::ProxySide;
use crate::servers::ThrowawayRedis;

/// Runs `tests/ruby/<script>` with `REDIS_URL` (async: the proxy runs on
/// this test's runtime) and returns its output lines.
async fn ruby(script: &str, args: &[&str], redis_url: &str) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/ruby")
        .join(script);
    let run = crate::sidekiq_versions::Sidekiq::V6
        .ruby()
        .arg(&path)
        .args(args)
        .env("REDIS_URL", redis_url)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the Sidekiq script finished within 60 s")
        .expect("ruby runs (./scripts/test-deps.sh installs ruby-sidekiq)");
    assert!(
        out.status.success(),
        "{} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn scheduled_sidekiq_jobs_are_mirrored_when_redis_takes_them(pool: PgPool) {
    let redis = ThrowawayRedis::start();
    let toml = "[[routes]]\nname = \"mail\"\nredis_key = \"queue:default\"\nqueue = \"mail\"\n\
                format = \"sidekiq\"\nphase = \"dual_write\"\n";
    let side = ProxySide::start_on(&pool, toml, &redis.url()).await;
    let lines = ruby("sidekiq_scheduled_through_proxy.rb", &[], &side.url()).await;
    let jids = |what: &str| -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(what).map(|j| j.trim().to_string()))
            .collect()
    };
    let (later, other, moved) = (jids("later"), jids("other"), jids("moved"));
    assert_eq!(
        (later.len(), other.len(), moved.len()),
        (3, 1, 1),
        "{lines:?}"
    );

    let wanted = later.len() + moved.len();
    let started = std::time::Instant::now();
    loop {
        let copies: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM qbridge.job_keys WHERE queue = 'mail' AND copy = 'mirror'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if copies as usize >= wanted {
            assert_eq!(copies as usize, wanted, "one copy per job");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{copies} of {wanted} mirrored"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Due when Sidekiq would run them: an hour from now.
    for jid in &later {
        let run_at: chrono::DateTime<chrono::Utc> =
            sqlx::query_scalar("SELECT run_at FROM qbridge.jobs WHERE queue = 'mail' AND key = $1")
                .bind(jid)
                .fetch_one(&pool)
                .await
                .unwrap();
        let ahead = run_at - chrono::Utc::now();
        assert!(
            ahead > chrono::Duration::minutes(59) && ahead < chrono::Duration::minutes(61),
            "{jid} is due in an hour: {run_at}"
        );
    }
    let theirs: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.job_keys WHERE key = $1")
        .bind(&other[0])
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(theirs, 0, "the other queue's job is not the route's");
    // The poller moved one job to the list through the proxy: the same
    // job, known by its jid, not a second copy.
    let mut conn = qbridge::redis::connect::connect_redis(&redis.url())
        .await
        .unwrap();
    let listed: Vec<String> = ::redis::cmd("LRANGE")
        .arg("queue:default")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].contains(&moved[0]));
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM qbridge.job_keys WHERE key = $1")
        .bind(&moved[0])
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(seen, 1);
    side.stop().await;
}

/// Scheduled in `shadow` (Redis owns it; Postgres has a mirror copy due at
/// its score), moved by Sidekiq's poller after the flip: the pop out of
/// `schedule` goes to Redis, the push to the list is the proxy's. Before
/// the fix the push was held as a re-push without evidence ("no outcome
/// from the Redis side yet"): the job was in no Redis structure any more
/// and ran nowhere.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_job_scheduled_before_the_flip_and_moved_after_it_runs_live_in_postgres(pool: PgPool) {
    let redis = ThrowawayRedis::start();
    let toml = "[[routes]]\nname = \"mail\"\nredis_key = \"queue:default\"\nqueue = \"mail\"\n\
                format = \"sidekiq\"\nphase = \"shadow\"\n";
    let side = ProxySide::start_on(&pool, toml, &redis.url()).await;
    let jids = ruby(
        "sidekiq_schedule_then_move.rb",
        &["schedule", "3", "1"],
        &side.url(),
    )
    .await;
    assert_eq!(jids.len(), 3, "{jids:?}");
    wait_for(
        &pool,
        "SELECT count(*) FROM qbridge.job_keys WHERE queue = 'mail' AND copy = 'mirror'",
        3,
    )
    .await;

    side.force_to("mail", &redis.url(), qbridge::model::Phase::PostgresOnly)
        .await;
    let mut conn = qbridge::redis::connect::connect_redis(&redis.url())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let moved = ruby("sidekiq_schedule_then_move.rb", &["move"], &side.url()).await;
    assert_eq!(moved, ["moved"]);

    // Each job is live in Postgres, once; nothing is held, nothing in Redis.
    wait_for(
        &pool,
        "SELECT count(*) FROM qbridge.job_keys WHERE queue = 'mail' AND copy = 'live'",
        3,
    )
    .await;
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM qbridge.held_repushes WHERE queue = 'mail'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(held, 0, "nothing held");
    for jid in &jids {
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM qbridge.jobs WHERE queue = 'mail' AND key = $1 AND copy = 'live'",
        )
        .bind(jid)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(live, 1, "{jid} has one live job");
    }
    let (listed, scheduled): (i64, i64) = ::redis::pipe()
        .cmd("LLEN")
        .arg("queue:default")
        .cmd("ZCARD")
        .arg("schedule")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!((listed, scheduled), (0, 0), "Redis holds none of them");
    side.stop().await;
}

/// A poller whose script was loaded before the proxy saw it (at Redis
/// itself: the proxy started later, or restarted) sends only `EVALSHA`
/// through the proxy. Sidekiq's poller scripts are known by their SHA-1, so
/// the moves after the flip still run live, once, with nothing held.
/// Before, the proxy learned scripts only from a `SCRIPT LOAD` it saw, and
/// each move was held as a re-push without evidence.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_poller_whose_script_was_loaded_elsewhere_is_recognised(pool: PgPool) {
    let redis = ThrowawayRedis::start();
    let toml = "[[routes]]\nname = \"mail\"\nredis_key = \"queue:default\"\nqueue = \"mail\"\n\
                format = \"sidekiq\"\nphase = \"shadow\"\n";
    let side = ProxySide::start_on(&pool, toml, &redis.url()).await;
    let jids = ruby(
        "sidekiq_schedule_then_move.rb",
        &["schedule", "3", "3"],
        &side.url(),
    )
    .await;
    wait_for(
        &pool,
        "SELECT count(*) FROM qbridge.job_keys WHERE queue = 'mail' AND copy = 'mirror'",
        3,
    )
    .await;
    side.force_to("mail", &redis.url(), qbridge::model::Phase::PostgresOnly)
        .await;
    let moved = ruby(
        "sidekiq_schedule_then_move.rb",
        &["move-loaded-elsewhere", &redis.url(), "3.5"],
        &side.url(),
    )
    .await;
    assert_eq!(moved, ["moved"]);
    wait_for(
        &pool,
        "SELECT count(*) FROM qbridge.job_keys WHERE queue = 'mail' AND copy = 'live'",
        3,
    )
    .await;
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM qbridge.held_repushes WHERE queue = 'mail'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(held, 0, "nothing held");
    assert_eq!(jids.len(), 3);
    side.stop().await;
}

/// A pop script the proxy learns (seen loaded) is stored in Postgres, so a
/// second proxy — or this one after a restart — recognises its `EVALSHA`
/// although it never saw the load: the reply names what Redis handed out,
/// recorded as the evidence that runs the job's re-push live.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_pop_script_one_proxy_learned_is_known_to_another(pool: PgPool) {
    let redis = ThrowawayRedis::start();
    let toml = "[[routes]]\nname = \"mail\"\nredis_key = \"queue:default\"\nqueue = \"mail\"\n\
                format = \"sidekiq\"\nphase = \"shadow\"\n";
    let first = ProxySide::start_on(&pool, toml, &redis.url()).await;
    let jids = ruby(
        "sidekiq_schedule_then_move.rb",
        &["schedule", "1", "3600"],
        &first.url(),
    )
    .await;
    wait_for(
        &pool,
        "SELECT count(*) FROM qbridge.job_keys WHERE queue = 'mail' AND copy = 'mirror'",
        1,
    )
    .await;
    // A team's own pop script, loaded through the first proxy.
    let script = "local m = redis.call('zrange', KEYS[1], 0, 0)[1] \
                  if m then redis.call('zrem', KEYS[1], m) end return m";
    let mut via_first = qbridge::redis::connect::connect_redis(&first.url())
        .await
        .unwrap();
    let sha: String = ::redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query_async(&mut via_first)
        .await
        .unwrap();
    drop(via_first);
    first.stop().await;
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM qbridge.proxy_pop_scripts WHERE sha = $1")
            .bind(&sha)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, 1, "the learned script is shared through Postgres");

    let second = ProxySide::start_on(&pool, toml, &redis.url()).await;
    second
        .force_to("mail", &redis.url(), qbridge::model::Phase::PostgresOnly)
        .await;
    let mut via_second = qbridge::redis::connect::connect_redis(&second.url())
        .await
        .unwrap();
    let member: String = ::redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg("schedule")
        .query_async(&mut via_second)
        .await
        .unwrap();
    assert!(member.contains(&jids[0]));
    let released: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM qbridge.redis_releases WHERE queue = 'mail' AND key = $1",
    )
    .bind(&jids[0])
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        released, 1,
        "the pop is the evidence Redis let go of the job"
    );
    second.stop().await;
}

/// Waits (10 s at most) until `count_sql` counts `wanted`.
async fn wait_for(pool: &PgPool, count_sql: &str, wanted: i64) {
    let started = std::time::Instant::now();
    loop {
        let n: i64 = sqlx::query_scalar(count_sql).fetch_one(pool).await.unwrap();
        if n == wanted {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{n} of {wanted}: {count_sql}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The diff's push-to-outcome lag (the shadow gate's `max_postgres_lag`)
/// of a scheduled job counts from when it was due, not from its `ZADD`: a
/// `perform_in(5)` job run at once when due has a lag near 0, not 5 s.
/// Before the fix every `perform_in` job in the window failed the gate.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_lag_of_a_scheduled_job_counts_from_when_it_was_due(pool: PgPool) {
    let redis = ThrowawayRedis::start();
    let toml = "[[routes]]\nname = \"mail\"\nredis_key = \"queue:default\"\nqueue = \"mail\"\n\
                format = \"sidekiq\"\nphase = \"shadow\"\n";
    let side = ProxySide::start_on(&pool, toml, &redis.url()).await;
    let jids = ruby(
        "sidekiq_schedule_then_move.rb",
        &["schedule", "3", "5"],
        &side.url(),
    )
    .await;
    wait_for(
        &pool,
        "SELECT count(*) FROM qbridge.job_keys WHERE queue = 'mail'",
        3,
    )
    .await;
    // Until they are due (5 s after the ZADD), then run them at once.
    let wait: f64 = sqlx::query_scalar(
        "SELECT greatest(extract(epoch FROM max(due_at) - now()), 0)::float8 \
           FROM qbridge.job_keys WHERE queue = 'mail'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    // The Postgres side's shadow calls, made when the jobs were due.
    for jid in &jids {
        sqlx::query(
            "INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome) \
             VALUES ('mail', $1, 'postgres', 'shadow', 'ok')",
        )
        .bind(jid)
        .execute(&pool)
        .await
        .unwrap();
    }
    let route = side.side_routes().by_name("mail").unwrap().clone();
    let mut conn = qbridge::redis::connect::connect_redis(&redis.url())
        .await
        .unwrap();
    let since = chrono::Utc::now() - chrono::Duration::minutes(1);
    let (diff, _) = qbridge::ops::gates::diff_since(
        &pool,
        &mut conn,
        &route,
        qbridge::model::Phase::Shadow,
        since,
    )
    .await
    .unwrap();
    let lag = diff.postgres.lag_p99.expect("a lag");
    // From the ZADD it would be 5 s at least; from when due, the time the
    // test took to record them (well under 2.5 s even on a loaded machine).
    assert!(
        lag < 2.5,
        "lag p99 {lag} s: counted from the ZADD, not from when the job was due"
    );
    side.stop().await;
}
