//! Subcommand implementations. Each returns a crate `Result`; `main` turns an
//! error into one line on stderr and a non-zero exit code.

mod chaos;
mod cutover;
mod diff;
mod dlq;
mod enqueue;
mod import;
mod proxy;
mod routes;
mod stats;
mod survey;

use crate::cli::{Cli, Command};
use crate::config::{Config, Overrides};
use crate::error::Result;
use crate::output;

/// Runs the parsed command line.
pub async fn dispatch(cli: Cli) -> Result<()> {
    let overrides = Overrides {
        database_url: cli.database_url.clone(),
        pooler: cli.pooler,
        redis_url: cli.redis_url.clone(),
        http_listen: match &cli.command {
            Command::Run(args) => args.http_listen.clone(),
            Command::Proxy(args) => args.http_listen.clone(),
            _ => None,
        },
        ..Overrides::default()
    }
    .with_env_secrets()?;
    if let Command::Demo(args) = &cli.command {
        // The demo picks its servers itself: only URLs the user chose count.
        let loaded = match &cli.config {
            Some(path) => Some(Config::load(Some(path), &overrides)?),
            None => None,
        };
        return crate::demo::run(crate::demo::DemoInput {
            database_url: cli
                .database_url
                .clone()
                .or_else(|| loaded.as_ref().map(|c| c.database_url.clone())),
            redis_url: cli
                .redis_url
                .clone()
                .or_else(|| loaded.as_ref().map(|c| c.redis_url.clone())),
            step: args.step,
            as_json: cli.json,
            framework: args.framework,
            python: args.python.clone(),
            ruby_lib: args.ruby_lib.clone(),
            keys: crate::demo::FleetKeys {
                key_prefix: args.key_prefix.clone(),
                priority_steps: args.priority_steps.clone(),
            },
            realistic: args.realistic,
        })
        .await;
    }
    let mut config = Config::load(cli.config.as_deref(), &overrides)?;
    // The URL as the user named it (a Sentinel URL before it is resolved to
    // a relay): what a survey's draft config should say.
    let named_redis_url = config.redis_url.clone();
    if !matches!(cli.command, Command::Migrate) {
        follow_sentinels(&mut config).await?;
    }
    match cli.command {
        Command::Migrate => {
            // Migrations hold a session lock: straight to Postgres, never
            // through a transaction-mode pooler.
            let url = config.database.migrate_url(&config.database_url)?;
            let db = crate::db::connect(url, 2).await?;
            crate::db::migrate(&db).await?;
            output::done(cli.json, "schema qbridge is current");
            Ok(())
        }
        Command::Run(_) => run(config).await,
        Command::Proxy(args) => proxy::run(config, args.listen.as_deref()).await,
        Command::Enqueue(args) => enqueue::run(&config, &args, cli.json).await,
        Command::Stats => stats::run(&config, cli.json).await,
        Command::Dlq(cmd) => dlq::run(&config, cmd, cli.json).await,
        Command::Cutover(cmd) => cutover::run(&config, cmd, cli.json).await,
        Command::Diff(args) => diff::run(&config, &args, cli.json).await,
        Command::Import(args) => import::run(&config, &args, cli.json).await,
        Command::Survey(args) => survey::run(&config, &named_redis_url, &args, cli.json).await,
        Command::Bench(args) => crate::bench::run(&config, args, cli.json).await,
        Command::Demo(_) => unreachable!("handled above"),
        Command::Chaos(args) => chaos::run(&args, cli.json).await,
    }
}

async fn run(config: Config) -> Result<()> {
    let consumers = config.routes.iter().any(|r| r.redis_consumer.is_some());
    if config.pools.is_empty() && config.schedules.is_empty() && !config.proxy.enabled && !consumers
    {
        return Err(crate::error::Error::Config(
            "nothing to run: add a [[pools]] entry, a route with a handler, or [proxy] enabled = true to the config file (see docs/src/reference/configuration.md)"
                .into(),
        ));
    }
    // Installs the recorder before any metric is touched.
    crate::telemetry::prometheus();
    let runtime = crate::app::Runtime::build(config).await?;
    let stop = crate::shutdown::on_signal();
    runtime.run_until_stopped(stop).await?;
    Ok(())
}

/// `$USER@host`, the default operator of an audited change.
pub(crate) fn operator(args_by: Option<&str>) -> String {
    if let Some(by) = args_by.filter(|b| !b.trim().is_empty()) {
        return by.to_string();
    }
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    format!("{user}@{host}")
}

/// Redis behind Sentinel: a `redis+sentinel://` URL (routes' Redis, proxy
/// upstream) is replaced by the URL of a relay to the current master that
/// lives as long as the process (`redis::sentinel`). The same URL twice
/// shares one relay.
async fn follow_sentinels(config: &mut Config) -> Result<()> {
    let lives_with_the_process = tokio_util::sync::CancellationToken::new();
    let named = config.redis_url.clone();
    config.redis_url = crate::redis::sentinel::resolve(&named, &lives_with_the_process).await?;
    if config.proxy.upstream == named {
        config.proxy.upstream = config.redis_url.clone();
    } else {
        config.proxy.upstream =
            crate::redis::sentinel::resolve(&config.proxy.upstream, &lives_with_the_process)
                .await?;
    }
    Ok(())
}
