//! Claims: many concurrent claimers never share a job, the tenant cap keeps a
//! burst from one tenant from walling off the others, kinds and priority.

use std::collections::HashMap;
use std::time::Duration;

use qbridge::queue::claim::TenantCap;
use qbridge::queue::{self, fence, NewJob};
use serde_json::json;
use sqlx::PgPool;

use crate::support::{self, claim_req};

const LEASE: Duration = Duration::from_secs(60);

/// 8 claimers, each on its own connection, drain 10,000 jobs; every job is
/// claimed once and completed once, and the table ends empty.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn eight_claimers_complete_every_job_exactly_once(pool: PgPool) {
    let ids = support::enqueue_ids(&pool, &support::plain_jobs("burn", 10_000)).await;
    assert_eq!(ids.len(), 10_000);
    let db = support::extra_pool(&pool, 9).await;

    let mut tasks = Vec::new();
    for w in 0..8 {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let queues = vec!["burn".to_string()];
            let worker = format!("claimer-{w}");
            let (mut claimed, mut completed) = (Vec::new(), Vec::new());
            loop {
                let jobs = queue::claim(&db, &claim_req(&queues, 50, &worker, LEASE))
                    .await
                    .expect("claim");
                if jobs.is_empty() {
                    return (claimed, completed);
                }
                claimed.extend(jobs.iter().map(|j| j.id));
                let r = fence::complete(&db, &support::refs(&jobs), false)
                    .await
                    .expect("complete");
                assert!(r.lost.is_empty(), "{} fresh leases were lost", r.lost.len());
                completed.extend(r.applied);
            }
        }));
    }
    let mut claims: HashMap<i64, u32> = HashMap::new();
    let mut completions: HashMap<i64, u32> = HashMap::new();
    let mut claimers_with_work = 0;
    for t in tasks {
        let (claimed, completed) = t.await.expect("claimer task");
        if !claimed.is_empty() {
            claimers_with_work += 1;
        }
        for id in claimed {
            *claims.entry(id).or_default() += 1;
        }
        for id in completed {
            *completions.entry(id).or_default() += 1;
        }
    }
    db.close().await;

    assert!(
        claimers_with_work > 1,
        "the claimers did not run concurrently"
    );
    for id in &ids {
        assert_eq!(
            claims.get(id),
            Some(&1),
            "job {id} claimed {:?} times",
            claims.get(id)
        );
        assert_eq!(
            completions.get(id),
            Some(&1),
            "job {id} completed {:?} times",
            completions.get(id)
        );
    }
    assert_eq!(claims.len(), 10_000);
    assert_eq!(completions.len(), 10_000);
    assert_eq!(support::jobs(&pool).await, 0, "jobs table is not empty");
}

/// Three jobs on `queue`: a plain one, one of priority 5, one due at `past`
/// (claim order: the second, the third, the first); their ids.
async fn enqueue_plain_urgent_overdue(
    pool: &PgPool,
    queue: &str,
    past: chrono::DateTime<chrono::Utc>,
) -> Vec<i64> {
    support::enqueue_ids(
        pool,
        &[
            NewJob::new(queue, json!(1)),
            NewJob::new(queue, json!(2)).with_priority(5),
            NewJob::new(queue, json!(3)).with_run_at(past),
        ],
    )
    .await
}

/// A claim takes the highest priority first, then the oldest run_at.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn claim_order_is_priority_then_run_at(pool: PgPool) {
    let past = chrono::Utc::now() - chrono::Duration::seconds(60);
    let ids = support::enqueue_ids(
        &pool,
        &[
            NewJob::new("q", json!(1)),
            NewJob::new("q", json!(2)).with_priority(5),
            NewJob::new("q", json!(3)).with_run_at(past),
            NewJob::new("q", json!(4)).with_run_at(chrono::Utc::now() + chrono::Duration::hours(1)),
        ],
    )
    .await;
    let mut got: Vec<i64> = support::claim(&pool, "q", 10, LEASE)
        .await
        .iter()
        .map(|j| j.id)
        .collect();
    got.sort_unstable();
    assert_eq!(
        got,
        ids[..3].to_vec(),
        "a job delayed by an hour was claimed"
    );
    let again = support::claim(&pool, "q", 10, LEASE).await;
    assert!(again.is_empty(), "running jobs were claimed again");

    // Claim one at a time: the order claims take jobs in.
    let ids = enqueue_plain_urgent_overdue(&pool, "r", past).await;
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(support::claim(&pool, "r", 1, LEASE).await[0].id);
    }
    assert_eq!(order, vec![ids[1], ids[2], ids[0]]);

    // One claim hands its jobs back in claim order too: a pool starts the
    // first of them and holds the rest, and of two jobs with one lock key
    // the first runs.
    let ids = enqueue_plain_urgent_overdue(&pool, "s", past).await;
    let one_claim: Vec<i64> = support::claim(&pool, "s", 3, LEASE)
        .await
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(one_claim, vec![ids[1], ids[2], ids[0]]);
}

/// 5,000 jobs of tenant A arrive before 10 of tenant B. A claim of 20 with a
/// cap of 5 takes at most 5 of A, and B's jobs get in, however large A's burst.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn tenant_cap_lets_other_tenants_through_a_burst(pool: PgPool) {
    let mut jobs: Vec<NewJob> = (0..5000)
        .map(|i| NewJob::new("t", json!({ "tenant": { "id": "A" }, "n": i })))
        .collect();
    jobs.extend((0..10).map(|i| NewJob::new("t", json!({ "tenant": { "id": "B" }, "n": i }))));
    support::enqueue_ids(&pool, &jobs).await;

    let queues = vec!["t".to_string()];
    let cap = TenantCap {
        path: qbridge::queue::validate::json_pointer_path("/tenant/id").unwrap(),
        cap: 5,
    };
    let mut req = claim_req(&queues, 20, "w", LEASE);
    req.tenant = Some(&cap);
    let got = queue::claim(&pool, &req).await.expect("claim");
    let per_tenant = |t: &str| {
        got.iter()
            .filter(|j| j.payload["tenant"]["id"] == t)
            .count()
    };
    assert!(
        per_tenant("A") <= 5,
        "tenant A got {} jobs in one claim",
        per_tenant("A")
    );
    assert!(per_tenant("B") >= 1, "tenant B got no job: {:?}", got.len());
    assert_eq!((per_tenant("A"), per_tenant("B")), (5, 5));

    // Without the cap the burst takes the whole claim (so the cap is what let B in).
    let got = queue::claim(&pool, &claim_req(&queues, 20, "w", LEASE))
        .await
        .expect("claim");
    assert_eq!(got.len(), 20);
    assert!(got.iter().all(|j| j.payload["tenant"]["id"] == "A"));
}

/// A pool claiming a set of kinds takes only those kinds.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn kinds_filter_claims_only_those_kinds(pool: PgPool) {
    let mut jobs: Vec<NewJob> = (0..20)
        .map(|i| NewJob::new("k", json!(i)).with_kind("Backfill"))
        .collect();
    jobs.push(NewJob::new("k", json!("urgent")).with_kind("Urgent"));
    jobs.push(NewJob::new("k", json!("untyped")));
    support::enqueue_ids(&pool, &jobs).await;

    let queues = vec!["k".to_string()];
    let kinds = vec!["Urgent".to_string()];
    let mut req = claim_req(&queues, 10, "w", LEASE);
    req.kinds = Some(&kinds);
    let got = queue::claim(&pool, &req).await.expect("claim");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].kind.as_deref(), Some("Urgent"));
    assert_eq!(got[0].payload, json!("urgent"));
}

/// One claim over several queues takes from all of them in claim order
/// (priority, then run_at), never more than asked.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn claim_over_several_queues(pool: PgPool) {
    let past = chrono::Utc::now() - chrono::Duration::seconds(60);
    let ids = support::enqueue_ids(
        &pool,
        &[
            NewJob::new("a", json!(1)),
            NewJob::new("b", json!(2)).with_priority(9),
            NewJob::new("b", json!(3)).with_run_at(past),
            NewJob::new("c", json!(4)).with_priority(10),
            NewJob::new("a", json!(5)),
        ],
    )
    .await;
    let queues = vec!["a".to_string(), "b".to_string()];
    let mut order = Vec::new();
    for _ in 0..3 {
        let got = queue::claim(&pool, &claim_req(&queues, 1, "w", LEASE))
            .await
            .expect("claim");
        assert_eq!(got.len(), 1);
        order.push(got[0].id);
    }
    assert_eq!(order, vec![ids[1], ids[2], ids[0]]);
    let rest = queue::claim(&pool, &claim_req(&queues, 10, "w", LEASE))
        .await
        .expect("claim");
    assert_eq!(rest.iter().map(|j| j.id).collect::<Vec<_>>(), vec![ids[4]]);
    assert!(queue::claim(&pool, &claim_req(&queues, 10, "w", LEASE))
        .await
        .unwrap()
        .is_empty());
    // Queue "c" was never named, so its job is still ready.
    assert_eq!(
        support::count(
            &pool,
            "SELECT count(*) FROM qbridge.jobs WHERE queue = 'c' AND state = 'ready'"
        )
        .await,
        1
    );
}

/// With more tenants than one claim takes, successive claims rotate through
/// them: 30 tenants, claims of 10 with a cap of 1 → the first three claims
/// together serve every tenant once. Jobs without the tenant field form the
/// '' tenant and are claimed too.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn tenant_claims_rotate_through_tenants(pool: PgPool) {
    let cap = TenantCap {
        path: qbridge::queue::validate::json_pointer_path("/t").unwrap(),
        cap: 1,
    };
    // Register first: jobs enqueued after it get their tenant at insert.
    qbridge::queue::tenants::ensure(&pool, "rot", &cap.path)
        .await
        .unwrap();
    let mut jobs = Vec::new();
    for round in 0..3 {
        for t in 0..30 {
            jobs.push(NewJob::new(
                "rot",
                json!({ "t": format!("t{t:02}"), "round": round }),
            ));
        }
    }
    jobs.push(NewJob::new("rot", json!({ "no_tenant": true })));
    support::enqueue_ids(&pool, &jobs).await;

    let queues = vec!["rot".to_string()];
    let mut seen = std::collections::HashSet::new();
    let mut cursor: Option<String> = None;
    for _ in 0..4 {
        let mut req = claim_req(&queues, 10, "w", LEASE);
        req.tenant = Some(&cap);
        req.tenant_after = cursor.as_deref();
        let got = qbridge::queue::claim::claim_batch(&pool, &req)
            .await
            .unwrap();
        let tenants: Vec<_> = got.jobs.iter().map(|j| j.tenant.clone().unwrap()).collect();
        let distinct: std::collections::HashSet<_> = tenants.iter().collect();
        assert_eq!(
            distinct.len(),
            tenants.len(),
            "cap 1 per tenant per claim: {tenants:?}"
        );
        seen.extend(tenants);
        cursor = got.tenant_cursor;
    }
    assert_eq!(
        seen.len(),
        31,
        "every tenant (and the '' bucket) served: {seen:?}"
    );
    assert!(seen.contains(""));
}

/// Jobs enqueued before a queue had a tenant pointer get their tenant when it
/// is registered, so a tenant-capped pool still sees them.
#[sqlx::test(migrator = "qbridge::MIGRATOR")]
async fn jobs_enqueued_before_the_tenant_setting_are_backfilled(pool: PgPool) {
    support::enqueue_ids(
        &pool,
        &[
            NewJob::new("late", json!({ "t": "x" })),
            NewJob::new("late", json!({})),
        ],
    )
    .await;
    let cap = TenantCap {
        path: qbridge::queue::validate::json_pointer_path("/t").unwrap(),
        cap: 5,
    };
    let queues = vec!["late".to_string()];
    let mut req = claim_req(&queues, 10, "w", LEASE);
    req.tenant = Some(&cap);
    let got = queue::claim(&pool, &req).await.unwrap();
    let mut tenants: Vec<_> = got.iter().map(|j| j.tenant.clone().unwrap()).collect();
    tenants.sort();
    assert_eq!(tenants, vec!["".to_string(), "x".to_string()]);
}
