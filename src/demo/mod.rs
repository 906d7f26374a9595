//! `qbridge demo`: the whole product on real Postgres and Redis in about a
//! minute — one route walked through every phase with its gates, the diff
//! at each step, a planted discrepancy caught and repaired, a rollback and a
//! re-advance, the decommission — ending with a summary (produced, run live,
//! run in shadow, duplicates, lost) that must show 0 lost and 0 duplicates.
//!
//! Servers: the URLs given (flags, environment, config file); else whatever
//! answers on 127.0.0.1:5432 and :6379; else throwaway servers started from
//! the binaries on PATH ([`servers`]) and removed afterwards. On an existing
//! Postgres the demo creates its own database and drops it at the end, so
//! it never touches application data.

pub mod attach;
mod drill;
mod fleet;
pub mod handler;
pub mod pgbouncer;
pub mod ports;
pub mod sentinel;
pub mod servers;

use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::redact::redact_url;

pub use drill::Summary;
pub use fleet::{FleetKeys, FleetSummary, Framework};

/// What the command line gave.
pub struct DemoInput {
    /// A Postgres URL the user chose, if any.
    pub database_url: Option<String>,
    /// A Redis URL the user chose, if any.
    pub redis_url: Option<String>,
    pub step: Duration,
    pub as_json: bool,
    /// A real framework fleet on the Redis side (`--framework`), with the
    /// Python for Celery and RQ.
    pub framework: Option<Framework>,
    pub python: String,
    /// `--ruby-lib`: the Sidekiq to run (with `--framework sidekiq`).
    pub ruby_lib: Option<String>,
    /// The fleet's key options (`--key-prefix`, `--priority-steps`).
    pub keys: FleetKeys,
    /// `--realistic`: default gates and a paced producer.
    pub realistic: bool,
}

/// The default URLs, as the quickstart and docker-compose use them.
const DEFAULT_PG: &str = "postgres://postgres:postgres@127.0.0.1:5432/postgres";
const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379";

fn answers(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(300),
    )
    .is_ok()
}

/// Where the demo runs, and the throwaway servers it must stop.
struct Servers {
    database_url: String,
    redis_url: String,
    _pg: Option<servers::ThrowawayPostgres>,
    _redis: Option<servers::ThrowawayRedis>,
    started: Vec<&'static str>,
}

fn choose_servers(input: &DemoInput) -> Result<Servers> {
    let need_pg = input.database_url.is_none() && !answers(5432);
    let need_redis = input.redis_url.is_none() && !answers(6379);
    let missing: Vec<&str> = [
        (need_pg && !servers::have_postgres_server(), "PostgreSQL"),
        (need_redis && !servers::have_redis_server(), "redis-server"),
    ]
    .into_iter()
    .filter(|(m, _)| *m)
    .map(|(_, n)| n)
    .collect();
    if !missing.is_empty() {
        return Err(Error::Environment(format!(
            "nothing answers on 127.0.0.1:5432/6379 and {} is not installed; install it with: {}",
            missing.join(" and "),
            servers::install_hint()
        )));
    }
    let mut out = Servers {
        database_url: input.database_url.clone().unwrap_or(DEFAULT_PG.into()),
        redis_url: input.redis_url.clone().unwrap_or(DEFAULT_REDIS.into()),
        _pg: None,
        _redis: None,
        started: Vec::new(),
    };
    if need_pg {
        let pg = servers::ThrowawayPostgres::try_start().map_err(Error::Environment)?;
        out.database_url = pg.url();
        out._pg = Some(pg);
        out.started.push("Postgres");
    }
    if need_redis {
        let redis = servers::ThrowawayRedis::try_start().map_err(Error::Environment)?;
        out.redis_url = redis.url();
        out._redis = Some(redis);
        out.started.push("Redis");
    }
    Ok(out)
}

/// `url` with its database replaced by `db`.
fn with_database(url: &str, db: &str) -> Result<String> {
    let mut parsed = url::Url::parse(url)
        .map_err(|e| Error::InvalidInput(format!("{}: {e}", redact_url(url))))?;
    parsed.set_path(&format!("/{db}"));
    Ok(parsed.to_string())
}

/// The demo's own database on the chosen server, created fresh.
async fn create_database(url: &str) -> Result<(String, String)> {
    let name = format!(
        "qbridge_demo_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let admin = crate::db::connect(url, 1).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .map_err(|e| {
            Error::Environment(format!(
                "cannot create the demo database on {}: {e} (the demo needs CREATEDB; or give --database-url of a user that has it)",
                redact_url(url)
            ))
        })?;
    admin.close().await;
    Ok((name.clone(), with_database(url, &name)?))
}

async fn drop_database(url: &str, name: &str) {
    if let Ok(admin) = crate::db::connect(url, 1).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&admin)
            .await;
        admin.close().await;
    }
}

#[derive(Serialize)]
struct Report<'a> {
    ok: bool,
    servers: String,
    summary: &'a Summary,
}

/// Runs the demo; an error, lost or duplicated jobs, or a planted loss the
/// diff or repair missed exits non-zero.
pub async fn run(input: DemoInput) -> Result<()> {
    input.keys.check(input.framework)?;
    let servers = tokio::task::block_in_place(|| choose_servers(&input))?;
    let where_ = if servers.started.is_empty() {
        format!(
            "Postgres {} and Redis {}",
            redact_url(&servers.database_url),
            redact_url(&servers.redis_url)
        )
    } else {
        format!(
            "throwaway {} started for the demo (removed afterwards)",
            servers.started.join(" and ")
        )
    };
    let say = |line: &str| match input.as_json {
        true => eprintln!("{line}"),
        false => println!("{line}"),
    };
    say(&format!("qbridge demo on {where_}"));
    let (db_name, db_url) = create_database(&servers.database_url).await?;
    if let Some(framework) = input.framework {
        let opts = fleet::FleetOptions {
            framework,
            python: input.python.clone(),
            ruby_lib: input.ruby_lib.clone(),
            keys: input.keys.clone(),
            step: input.step,
            as_json: input.as_json,
            realistic: input.realistic,
        };
        let result = fleet::run(&db_url, &servers.redis_url, &opts).await;
        drop_database(&servers.database_url, &db_name).await;
        return fleet::report(&result?, where_, input.as_json);
    }
    let result = drill::run(
        &db_url,
        &servers.redis_url,
        drill::DrillOptions {
            step: input.step,
            as_json: input.as_json,
        },
    )
    .await;
    drop_database(&servers.database_url, &db_name).await;
    let summary = result?;
    let failure = failure(&summary);
    let ok = failure.is_none();
    if input.as_json {
        crate::output::json(&Report {
            ok,
            servers: where_,
            summary: &summary,
        });
    } else {
        print_summary(&summary);
    }
    drop(servers);
    match failure {
        None => Ok(()),
        Some(why) => Err(Error::CheckFailed(why)),
    }
}

/// Why the drill failed, if it did: a job lost or run live twice, or the
/// planted loss not caught by the diff or not brought back by repair (the
/// drill's proof that both work; it printed "not caught" and still exited 0).
fn failure(s: &Summary) -> Option<String> {
    let mut why = Vec::new();
    if !s.planted_caught {
        why.push("the diff did not catch the planted loss".to_string());
    } else if !s.planted_repaired {
        why.push("repair did not bring the planted loss back".to_string());
    }
    if s.lost > 0 || s.duplicates > 0 {
        why.push(format!(
            "the drill lost {} and ran {} jobs live twice",
            s.lost, s.duplicates
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

fn print_summary(s: &Summary) {
    println!();
    println!(
        "produced {} jobs ({} through the RESP proxy, {} through the producer API, 1 planted)",
        s.produced, s.produced_via_proxy, s.produced_via_producer_api
    );
    println!(
        "run live: {} jobs ({} live calls); run in shadow: {} calls",
        s.run_live, s.live_calls, s.shadow_calls
    );
    println!("duplicates (run live twice): {}", s.duplicates);
    println!("lost: {}", s.lost);
    println!(
        "planted discrepancy: {}, {}",
        if s.planted_caught {
            "caught by the diff"
        } else {
            "NOT caught"
        },
        if s.planted_repaired {
            "repaired (ran live once)"
        } else {
            "NOT repaired"
        }
    );
    println!(
        "advances forced past a gate: {}; rollbacks: {}",
        s.forced_advances, s.rollbacks
    );
    drill::print_times(&s.phases, s.seconds);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean() -> Summary {
        Summary {
            produced: 10,
            produced_via_proxy: 6,
            produced_via_producer_api: 3,
            run_live: 10,
            live_calls: 10,
            shadow_calls: 4,
            duplicates: 0,
            lost: 0,
            duplicate_keys: Vec::new(),
            lost_keys: Vec::new(),
            planted_caught: true,
            planted_repaired: true,
            forced_advances: 0,
            rollbacks: 1,
            phases: Vec::new(),
            seconds: 1.0,
        }
    }

    #[test]
    fn a_clean_drill_passes() {
        assert_eq!(failure(&clean()), None);
    }

    /// The drill plants a loss to show the diff and repair at work: a run in
    /// which the diff missed it, or repair did not bring it back, failed.
    #[test]
    fn a_planted_loss_not_caught_or_not_repaired_fails_the_drill() {
        let missed = Summary {
            planted_caught: false,
            ..clean()
        };
        let why = failure(&missed).expect("not caught is a failure");
        assert!(why.contains("planted"), "{why}");
        let unrepaired = Summary {
            planted_repaired: false,
            ..clean()
        };
        assert!(failure(&unrepaired).is_some());
    }

    #[test]
    fn lost_or_doubled_jobs_fail_the_drill() {
        assert!(failure(&Summary { lost: 1, ..clean() }).is_some());
        assert!(failure(&Summary {
            duplicates: 1,
            ..clean()
        })
        .is_some());
    }
}
