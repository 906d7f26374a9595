//! A claim's cost stays proportional to its batch whatever the table's
//! statistics say. A queue table's statistics swing between empty and huge
//! (autoanalyze often samples it drained), and a plan made for an empty
//! table once turned every claim into a scan of the whole table, a nested
//! loop of all its rows against the batch: 4 s a claim with 85,000 rows, so
//! claims fell behind, the backlog grew and each claim got slower still
//! (the paced runs that stalled). These tests put the table in the
//! states that misled the planner, fill it, and count the rows one claim (or
//! one completion) reads, through the connections `qbridge::db` opens.

use std::future::Future;
use std::time::Duration;

use qbridge::queue::{self, fence};
use sqlx::PgPool;

use crate::support::{self, claim_req};

const LEASE: Duration = Duration::from_secs(60);
/// Ready jobs waiting when the claim runs.
const BACKLOG: i64 = 20_000;
/// Jobs one claim takes.
const BATCH: i64 = 100;
/// Most rows of `qbridge.jobs` one claim (or completion) of [`BATCH`] may
/// read: ten rows a job leaves room for a few dead entries at the head of
/// the index, and is far below the backlog a whole-table plan reads. At
/// least [`BATCH`] must be counted, or the counters measured nothing.
const MOST_ROWS_READ: i64 = 10 * BATCH;

/// Rows of `qbridge.jobs` read so far by sequential scans and fetched
/// through its indexes, as far as the backends have flushed their counts.
async fn rows_read(observer: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables \
          WHERE relid = 'qbridge.jobs'::regclass",
    )
    .fetch_one(observer)
    .await
    .expect("read table counters")
}

/// Makes the one backend of `db` flush its pending statistics: it does so
/// before it reports this statement done.
pub(crate) async fn flush_counts(db: &PgPool) {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(db)
        .await
        .expect("flush counts");
}

/// `n` ready jobs on `queue`, in one statement.
async fn fill(pool: &PgPool, queue: &str, n: i64) {
    sqlx::query(
        "INSERT INTO qbridge.jobs (queue, kind, payload) \
         SELECT $1, 'k', jsonb_build_object('n', g) FROM generate_series(1, $2) g",
    )
    .bind(queue)
    .bind(n)
    .execute(pool)
    .await
    .expect("fill");
}

/// The test's table with autovacuum off, so no ANALYZE during the test
/// changes the statistics each test sets up on purpose.
async fn hold_statistics(pool: &PgPool) {
    exec(
        pool,
        "ALTER TABLE qbridge.jobs SET (autovacuum_enabled = off)",
    )
    .await;
}

/// Runs one set-up statement.
async fn exec(pool: &PgPool, sql: &str) {
    sqlx::query(sql)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Statistics taken right after a backlog drained: the table has pages but
/// no rows, a queue's usual state between bursts.
async fn analyze_drained(setup: &PgPool) {
    fill(setup, "q", 5_000).await;
    exec(setup, "DELETE FROM qbridge.jobs").await;
    analyze(setup).await;
}

/// The one connection a test sets its table up on: the rows its statements
/// read must reach the counters before a claim is measured ([`done_with`]),
/// not land in the middle of the measurement.
async fn setup_connection(pool: &PgPool) -> PgPool {
    support::extra_pool(pool, 1).await
}

/// Flushes the set-up connection's counts and closes it.
async fn done_with(setup: PgPool) {
    flush_counts(&setup).await;
    setup.close().await;
}

async fn analyze(pool: &PgPool) {
    exec(pool, "ANALYZE qbridge.jobs").await;
}

/// One connection opened the way qbridge opens its own (so with whatever
/// settings `qbridge::db` gives them); a single one, so every statement of
/// a test runs on the backend whose counts [`flush_counts`] flushes.
pub(crate) async fn qbridge_connection(pool: &PgPool) -> PgPool {
    qbridge::db::connect(&support::db_url(pool), 1)
        .await
        .expect("connect as qbridge does")
}

/// Runs `work` (statements on `db`) and returns how many rows of the table
/// it read, with its result.
async fn rows_read_by<T>(
    observer: &PgPool,
    db: &PgPool,
    work: impl Future<Output = T>,
) -> (i64, T) {
    flush_counts(db).await;
    let before = rows_read(observer).await;
    let out = work.await;
    flush_counts(db).await;
    (rows_read(observer).await - before, out)
}

/// Claims `BATCH` from `queues` (optionally only `kinds`) on `db` and
/// returns how many rows of the table that read, with the jobs.
async fn rows_one_claim_reads(
    pool: &PgPool,
    db: &PgPool,
    queues: &[String],
    kinds: Option<&[String]>,
) -> (i64, Vec<queue::ClaimedJob>) {
    let mut req = claim_req(queues, BATCH, "plans", LEASE);
    req.kinds = kinds;
    let (read, jobs) = rows_read_by(pool, db, queue::claim(db, &req)).await;
    (read, jobs.expect("claim"))
}

fn one(queue: &str) -> Vec<String> {
    vec![queue.to_string()]
}

/// With [`BACKLOG`] ready jobs of kind `k` in each of queues `q` and `other`:
/// one claim of [`BATCH`], on a fresh qbridge connection, from one queue,
/// from both, and for one kind, each reads about its batch.
async fn each_claim_reads_about_its_batch(pool: &PgPool) {
    let kinds = ["k".to_string()];
    let several = vec!["q".to_string(), "other".to_string()];
    for (what, queues, kinds) in [
        ("one queue", one("q"), None),
        ("two queues", several, None),
        ("some kinds", one("q"), Some(&kinds[..])),
    ] {
        let db = qbridge_connection(pool).await;
        let (read, jobs) = rows_one_claim_reads(pool, &db, &queues, kinds).await;
        db.close().await;
        assert_eq!(jobs.len() as i64, BATCH, "{what}");
        assert!(
            (BATCH..=MOST_ROWS_READ).contains(&read),
            "{what}: one claim of {BATCH} read {read} rows of a {}-job table",
            2 * BACKLOG
        );
    }
}

/// The statistics say the table is empty (analyzed before any job came) and
/// the connection has claimed from it a few times, so a plan it caches was
/// made for no rows. Then the backlog arrives: a claim still reads about its
/// batch, not the backlog, and so does completing what it took.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn claims_planned_on_an_empty_table_stay_cheap_when_it_fills(pool: PgPool) {
    let setup = setup_connection(&pool).await;
    hold_statistics(&setup).await;
    analyze(&setup).await;
    let db = qbridge_connection(&pool).await;
    let queues = one("q");
    // Postgres settles on a cached (generic) plan for a prepared statement
    // after its fifth run; an empty claim and an empty completion still run.
    let nothing = [qbridge::queue::JobRef { id: -1, lease: 1 }];
    for _ in 0..8 {
        assert!(
            queue::claim(&db, &claim_req(&queues, BATCH, "plans", LEASE))
                .await
                .expect("empty claim")
                .is_empty()
        );
        fence::complete(&db, &nothing, false)
            .await
            .expect("empty completion");
    }
    fill(&setup, "q", BACKLOG).await;
    done_with(setup).await;

    let (read, jobs) = rows_one_claim_reads(&pool, &db, &queues, None).await;
    assert_eq!(jobs.len() as i64, BATCH);
    assert!(
        (BATCH..=MOST_ROWS_READ).contains(&read),
        "one claim of {BATCH} read {read} rows of a {BACKLOG}-job table"
    );

    let refs = support::refs(&jobs);
    let (read, done) = rows_read_by(&pool, &db, fence::complete(&db, &refs, false)).await;
    assert_eq!(done.expect("complete").applied.len() as i64, BATCH);
    assert!(
        (BATCH..=MOST_ROWS_READ).contains(&read),
        "completing {BATCH} jobs read {read} rows of a {BACKLOG}-job table"
    );
    db.close().await;
}

/// The statistics say the table has pages but no rows ([`analyze_drained`]).
/// Then a new backlog arrives: a claim
/// reads about its batch, on its first run too (a plan made for this claim
/// alone), from one queue, from several, and for some kinds.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn claims_on_a_table_analyzed_while_drained_stay_cheap(pool: PgPool) {
    let setup = setup_connection(&pool).await;
    hold_statistics(&setup).await;
    analyze_drained(&setup).await;
    let (pages, rows): (i32, f32) = sqlx::query_as(
        "SELECT relpages, reltuples FROM pg_class WHERE oid = 'qbridge.jobs'::regclass",
    )
    .fetch_one(&pool)
    .await
    .expect("statistics");
    assert!(
        pages > 0 && rows == 0.0,
        "set-up: pages {pages}, rows {rows}"
    );
    fill(&setup, "q", BACKLOG).await;
    fill(&setup, "other", BACKLOG).await;
    done_with(setup).await;

    each_claim_reads_about_its_batch(&pool).await;
}

/// The statistics were taken while every job in the table was running (none
/// ready), then a backlog of ready jobs arrives: a claim reads about its batch.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn claims_on_a_table_analyzed_while_all_ran_stay_cheap(pool: PgPool) {
    let setup = setup_connection(&pool).await;
    hold_statistics(&setup).await;
    fill(&setup, "q", 5_000).await;
    sqlx::query(
        "UPDATE qbridge.jobs SET state = 'running', lease_until = now() + interval '1 hour'",
    )
    .execute(&setup)
    .await
    .expect("all running");
    analyze(&setup).await;
    fill(&setup, "q", BACKLOG).await;
    done_with(setup).await;

    let db = qbridge_connection(&pool).await;
    let (read, jobs) = rows_one_claim_reads(&pool, &db, &one("q"), None).await;
    db.close().await;
    assert_eq!(jobs.len() as i64, BATCH);
    assert!(
        (BATCH..=MOST_ROWS_READ).contains(&read),
        "one claim of {BATCH} read {read} rows of a {BACKLOG}-job table"
    );
}

/// The benchmark of that case end to end: workers poll the empty queue,
/// then a burst arrives (`bench burndown --idle-first`); every job runs
/// exactly once and the queue ends empty (the bench checks both: `ok`).
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn a_burst_after_an_idle_spell_drains_every_job_once(pool: PgPool) {
    let url = support::db_url(&pool);
    let out = support::qbridge(&[
        "bench",
        "burndown",
        "--database-url",
        &url,
        "--jobs",
        "3000",
        "--batch",
        "100",
        "--idle-first",
        "300ms",
        "--json",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", support::last_stderr_line(&out));
    let report: serde_json::Value =
        serde_json::from_str(support::last_line(&stdout)).expect("a JSON report");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["n"], 3000);
    assert_eq!(report["settings"]["idle_first_s"], 0.3);
}

/// The reaper finds expired leases and puts those jobs back by id too: on a
/// table analyzed while drained, with a backlog waiting, one pass over 100
/// expired jobs reads about those jobs, not the backlog.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn the_reaper_on_a_table_analyzed_while_drained_stays_cheap(pool: PgPool) {
    let setup = setup_connection(&pool).await;
    hold_statistics(&setup).await;
    analyze_drained(&setup).await;
    fill(&setup, "q", BACKLOG).await;
    sqlx::query(
        "UPDATE qbridge.jobs SET state = 'running', attempts = 1, \
                lease_until = now() - interval '1 minute' \
          WHERE id IN (SELECT id FROM qbridge.jobs ORDER BY id LIMIT $1)",
    )
    .bind(BATCH)
    .execute(&setup)
    .await
    .expect("expired leases");
    done_with(setup).await;

    let db = qbridge_connection(&pool).await;
    let (read, report) =
        rows_read_by(&pool, &db, qbridge::queue::reaper::run_once(&db, BATCH)).await;
    db.close().await;
    assert_eq!(report.expect("reap").requeued as i64, BATCH);
    assert!(
        (BATCH..=MOST_ROWS_READ).contains(&read),
        "one reaper pass over {BATCH} expired jobs read {read} rows of a {BACKLOG}-job table"
    );
}

/// A plan that sorts the whole backlog. In a full-speed `bench steady` run
/// whose workers fell behind (p99 40 s), `auto_explain` showed every claim
/// planned as a bitmap scan of all ready rows and a sort, 300 ms a claim:
/// statistics sampled with about a hundred ready rows made that look as
/// cheap as the ordered walk of a bloated claim index, and the claims then
/// read the growing backlog, so it kept growing. Here the planner is made
/// to prefer that plan every time (plain index scans switched off for the
/// database, the way a planner setting or a misleading estimate would):
/// a claim still walks the claim index in order and reads about its
/// batch, for one queue, several, and some kinds.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn claims_walk_the_index_even_when_costs_favour_a_sort(pool: PgPool) {
    let setup = setup_connection(&pool).await;
    hold_statistics(&setup).await;
    fill(&setup, "q", BACKLOG).await;
    fill(&setup, "other", BACKLOG).await;
    analyze(&setup).await;
    prefer_bulk_plans(&setup).await;
    done_with(setup).await;

    each_claim_reads_about_its_batch(&pool).await;
}

/// Makes the planner prefer reading every ready row and sorting them, on
/// connections opened from now on: plain index scans switched off for the
/// test's database (what a misleading estimate did in the stalled run).
async fn prefer_bulk_plans(setup: &PgPool) {
    let db_name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(setup)
        .await
        .expect("database name");
    exec(
        setup,
        &format!("ALTER DATABASE \"{db_name}\" SET enable_indexscan = off"),
    )
    .await;
}

/// The tenant claim (a loose index scan from tenant to tenant, then each
/// tenant's jobs in claim order) under the same planner preference: one
/// claim of 100 jobs from 100 tenants reads about them, not the backlog of
/// 20,000 tenants.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn tenant_claims_walk_the_index_even_when_costs_favour_a_sort(pool: PgPool) {
    let setup = setup_connection(&pool).await;
    hold_statistics(&setup).await;
    sqlx::query(
        "INSERT INTO qbridge.jobs (queue, payload, tenant) \
         SELECT 't', jsonb_build_object('n', g::text), g::text FROM generate_series(1, $1) g",
    )
    .bind(BACKLOG)
    .execute(&setup)
    .await
    .expect("fill with tenants");
    analyze(&setup).await;
    prefer_bulk_plans(&setup).await;
    done_with(setup).await;

    let cap = queue::TenantCap {
        path: queue::validate::json_pointer_path("/n").expect("pointer"),
        cap: 1,
    };
    let queues = one("t");
    let db = qbridge_connection(&pool).await;
    // The first claim registers the queue's tenant path; measure the next.
    let mut req = claim_req(&queues, 1, "plans", LEASE);
    req.tenant = Some(&cap);
    queue::claim(&db, &req).await.expect("first claim");
    let mut req = claim_req(&queues, BATCH, "plans", LEASE);
    req.tenant = Some(&cap);
    let (read, jobs) = rows_read_by(&pool, &db, queue::claim(&db, &req)).await;
    db.close().await;
    assert_eq!(jobs.expect("claim").len() as i64, BATCH);
    assert!(
        (BATCH..=MOST_ROWS_READ).contains(&read),
        "one tenant claim of {BATCH} read {read} rows of a {BACKLOG}-job table"
    );
}
