//! The command line (clap derive). Secrets come from the environment with
//! `hide_env_values`, so `--help` never prints them.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

mod cutover;
pub use cutover::{CutoverArgs, CutoverCommand, PercentArgs, RollbackArgs, ShadowTestArgs};

use crate::telemetry::LogFormat;

/// Move Redis-list job queues onto a Postgres job queue without downtime.
#[derive(Debug, Parser)]
#[command(name = "qbridge", version, propagate_version = true)]
pub struct Cli {
    /// Postgres URL (default: the config file's, else postgres://postgres:postgres@127.0.0.1:5432/postgres).
    #[arg(
        long,
        global = true,
        env = "QBRIDGE_DATABASE_URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,

    /// A transaction-mode pooler (PgBouncer, Supavisor, Neon) in front of
    /// Postgres (default: the config file's [database] pooler, else none).
    #[arg(long, global = true, value_enum, env = "QBRIDGE_POOLER")]
    pub pooler: Option<crate::config::Pooler>,

    /// Redis URL of the routes (default: the config file's, else redis://127.0.0.1:6379).
    #[arg(long, global = true, env = "QBRIDGE_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// TOML config file.
    #[arg(long, short = 'c', global = true, env = "QBRIDGE_CONFIG")]
    pub config: Option<PathBuf>,

    /// Machine-readable output: a JSON object on stdout; an error is one
    /// `{"error": "..."}` line on stderr (the exit code stays non-zero).
    #[arg(long, global = true)]
    pub json: bool,

    /// Log format on stderr.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "QBRIDGE_LOG_FORMAT"
    )]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or update the qbridge schema.
    #[command(after_help = "Example:\n  qbridge migrate --database-url postgres://app@db/app")]
    Migrate,

    /// Run the worker pools, maintenance and the HTTP listener.
    #[command(after_help = "Example:\n  qbridge run --config qbridge.toml\n\n\
        SIGINT/SIGTERM stop intake, let running jobs finish (shutdown_deadline), flush completions.")]
    Run(RunArgs),

    /// Run the RESP proxy alone: producers point their Redis URL at it.
    #[command(
        after_help = "Example:\n  qbridge proxy --config qbridge.toml --listen 0.0.0.0:6380\n\n\
        Every client connection is spliced to its own connection to [proxy] upstream\n\
        (default: redis_url). Pushes to a route's redis_key follow the route's phase:\n\
        forwarded and mirrored into Postgres (dual_write, shadow), or written to\n\
        Postgres only (postgres_only, decommissioned). /metrics is served on [http] listen."
    )]
    Proxy(ProxyArgs),

    /// Enqueue jobs from arguments or a JSON-lines file.
    #[command(
        after_help = "Examples:\n  qbridge enqueue --queue emails '{\"to\":\"a@example.com\"}'\n  \
        qbridge enqueue --queue emails --file jobs.jsonl --key-pointer /id\n  \
        qbridge enqueue --queue reports --delay 10m '{\"report\":42}'"
    )]
    Enqueue(EnqueueArgs),

    /// Per-queue ready, running, scheduled, dead and lag, plus database health.
    #[command(after_help = "Example:\n  qbridge stats --json")]
    Stats,

    /// Inspect and requeue dead-lettered jobs.
    #[command(
        subcommand,
        after_help = "Examples:\n  qbridge dlq list --queue emails\n  \
        qbridge dlq show 1234\n  qbridge dlq requeue --queue emails --rate 200"
    )]
    Dlq(DlqCommand),

    /// Walk routes through the migration phases: status, advance (gated), rollback.
    #[command(
        subcommand,
        after_help = "Examples:\n  qbridge cutover status\n  \
        qbridge cutover advance emails\n  \
        qbridge cutover advance emails --force --reason 'completeness 99.98%: 2 jobs lost in a known Redis restart, repaired'\n  \
        qbridge cutover rollback emails --reason 'handler errors in postgres_only'\n\n\
        The runbook is docs/src/runbook/README.md."
    )]
    Cutover(CutoverCommand),

    /// Compare a route's Redis and Postgres sides over a window.
    #[command(
        after_help = "Examples:\n  qbridge diff --route emails\n  qbridge diff --route emails --since 1h --json\n  \
        qbridge diff --route emails --repair\n  \
        qbridge diff --route emails --repair --assume-lost jid-1 jid-2 --reason 'deleted by hand on Redis'\n\n\
        Exit code 0 with a verdict line either way; --repair mirrors Redis items Postgres lacks\n\
        and pushes back to Redis the mirror copies Redis lost on evidence, idempotently by job key.\n\
        Jobs without evidence either way are 'unaccounted': only --assume-lost moves them."
    )]
    Diff(DiffArgs),

    /// Copy what already waits in Redis for a route into Postgres as mirror copies.
    #[command(
        after_help = "Examples:\n  qbridge import --route mail --dry-run\n  qbridge import --route mail\n\n\
        Run it once a route is in dual_write: the backlog in its list and, for Sidekiq, the\n\
        route's jobs in the schedule and retry sets become mirror copies (due at their time),\n\
        its dead jobs are copied to the dead-letter table. The jobs stay in Redis. Idempotent\n\
        by job key: run it again until it reports nothing new."
    )]
    Import(ImportArgs),

    /// What a Redis holds: frameworks, queues, counts, sizes, push rates; read-only.
    #[command(
        after_help = "Examples:\n  qbridge survey --redis-url redis://cache:6379/0\n  \
        qbridge survey --redis-url rediss://app@cache:6380/0 --sample 10s --write-config qbridge.toml\n  \
        qbridge survey --json --sample 0s\n\n\
        The first command to run: it recognises Sidekiq (namespaces, super_fetch and\n\
        gitlab-sidekiq-fetcher lists), Celery (priority lists, unacked, global_keyprefix), RQ,\n\
        Resque and plain lists, and prints a row per queue. It only reads (SCAN, TYPE, lengths,\n\
        INFO, a few sampled items to measure them), never prints a payload, and works with an\n\
        ACL user that may only read. --write-config writes a draft with one route per queue\n\
        (never over an existing file)."
    )]
    Survey(SurveyArgs),

    /// The migration drill: one route through every phase on real Postgres and Redis.
    #[command(after_help = "Examples:\n  qbridge demo\n  qbridge demo --json\n  \
        qbridge demo --database-url postgres://me@db/app --redis-url redis://cache:6379\n  \
        qbridge demo --framework sidekiq\n  qbridge demo --framework sidekiq --ruby-lib vendor/ruby\n  \
        qbridge demo --framework celery --python .venv/bin/python\n\n\
        Without URLs it uses what answers on 127.0.0.1:5432 and :6379, else starts throwaway\n\
        servers from the binaries on PATH. It works in its own new database (dropped at the end)\n\
        and its own Redis keys. Exits non-zero if a job was lost or run live twice.")]
    Demo(DemoArgs),

    /// The fault suite: each scenario injects a fault under load on throwaway
    /// servers and checks that no acknowledged job was lost or run twice.
    #[command(
        after_help = "Examples:\n  qbridge chaos\n  qbridge chaos --scenario worker-kill --span 60s\n  \
        qbridge chaos --json\n\n\
        Each scenario starts its own Postgres (initdb into a temp dir) and redis-server on free\n\
        ports, and runs qbridge's proxy and two workers from this binary. Exits non-zero if any\n\
        scenario lost a job or broke the promise."
    )]
    Chaos(ChaosArgs),

    /// Benchmarks: burn-down, steady state, pickup latency, claim latency.
    #[command(
        after_help = "Examples:\n  qbridge bench burndown --jobs 50000 --workers 2\n  \
        qbridge bench latency --samples 200\n  qbridge bench steady --duration 20s"
    )]
    Bench(crate::bench::BenchArgs),
}

/// `qbridge chaos`
#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// Run only these scenarios (repeatable); default: all nine.
    #[arg(long, value_enum)]
    pub scenario: Vec<crate::chaos::Scenario>,
    /// Jobs per second produced during a scenario.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// How long each fault phase lasts (e.g. 60s).
    #[arg(long, default_value = "60s")]
    pub span: String,
    /// How long recovery may take before a scenario fails.
    #[arg(long, default_value = "120s")]
    pub patience: String,
    /// Megabytes of notifications for notify-queue-full (4,500 passes the
    /// default skip threshold of half of Postgres's 8 GB queue).
    #[arg(long, default_value_t = 4500)]
    pub notify_fill_mb: u64,
    /// Run qbridge's processes through a throwaway PgBouncer in transaction
    /// mode (pgbouncer on PATH), declared as `[database] pooler`.
    #[arg(long)]
    pub via_pgbouncer: bool,
    /// cutover-random: how many seeds to walk.
    #[arg(long, default_value_t = 10)]
    pub seeds: u64,
    /// cutover-random: the first seed (a failing seed replays its walk).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// cutover-random: random steps per seed, before the final flip and
    /// decommission.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
}

/// `qbridge run`
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Address of /metrics, /livez and /readyz (overrides [http] listen).
    #[arg(long, env = "QBRIDGE_HTTP_LISTEN")]
    pub http_listen: Option<String>,
}

/// `qbridge proxy`
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Address producers connect to (overrides [proxy] listen).
    #[arg(long, env = "QBRIDGE_PROXY_LISTEN")]
    pub listen: Option<String>,
    /// Address of /metrics, /livez and /readyz (overrides [http] listen).
    #[arg(long, env = "QBRIDGE_HTTP_LISTEN")]
    pub http_listen: Option<String>,
}

/// `qbridge enqueue`
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// Queue name.
    #[arg(long, short = 'q')]
    pub queue: String,
    /// JSON payloads (one job each).
    pub payloads: Vec<String>,
    /// Read payloads from a JSON-lines file ("-" for stdin), one job per line.
    #[arg(long, conflicts_with = "payloads")]
    pub file: Option<PathBuf>,
    /// Job kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// Idempotency key (one payload only).
    #[arg(long, conflicts_with = "key_pointer")]
    pub key: Option<String>,
    /// Take each job's key from its payload at this JSON pointer (e.g. /id).
    #[arg(long)]
    pub key_pointer: Option<String>,
    /// Larger runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Run no earlier than this RFC 3339 time.
    #[arg(long, conflicts_with = "delay")]
    pub run_at: Option<String>,
    /// Run after this delay (e.g. 30s, 10m).
    #[arg(long)]
    pub delay: Option<String>,
    /// Attempts before dead-lettering.
    #[arg(long)]
    pub max_attempts: Option<i32>,
    /// Jobs with the same lock key never run at the same time.
    #[arg(long)]
    pub lock_key: Option<String>,
}

/// `qbridge demo`
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How long each phase holds (also the gate window).
    #[arg(long, default_value = "5s", value_parser = crate::config::parse_duration)]
    pub step: std::time::Duration,
    /// Run the Redis side with a real framework's own client and workers
    /// (Ruby with Sidekiq 6 or 7, or Python with Celery 5 / RQ) instead of
    /// qbridge's consumer, scheduled jobs included.
    #[arg(long, value_enum)]
    pub framework: Option<crate::demo::Framework>,
    /// The Python that has Celery or RQ (with --framework celery|rq).
    #[arg(long, env = "QBRIDGE_DEMO_PYTHON", default_value = "python3")]
    pub python: String,
    /// Ruby library directories put on the load path (with --framework
    /// sidekiq), `:`-separated: a Sidekiq's `lib` and its dependencies',
    /// or a directory holding them (`vendor/ruby`: Sidekiq 7.3.10). The
    /// fleet's worker then runs that Sidekiq's `bin/sidekiq`. Without it:
    /// the system Ruby's Sidekiq and `sidekiq` on PATH.
    #[arg(long, env = "QBRIDGE_DEMO_RUBY_LIB")]
    pub ruby_lib: Option<String>,
    /// Run the fleet with a key prefix (with --framework celery: kombu's
    /// global_keyprefix, e.g. `app1:`; with --framework rq: RQ 3's
    /// RQ_KEY_PREFIX, e.g. `app1`), and the route's key_prefix to match.
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// Run the Celery fleet with these kombu priority_steps (e.g. 0,5,9) and
    /// tasks sent with priorities, and the route's priority_steps to match.
    #[arg(long, value_delimiter = ',')]
    pub priority_steps: Option<Vec<u8>>,
    /// With --framework: rehearse with the route's default gate settings
    /// (a 10-minute window, 100 jobs, 30 s settle) and a paced producer
    /// (about 4 jobs/s, a countdown job every few seconds due 15-60 s
    /// later), and print how long each gate waited and on what: how long
    /// the migration week's walk really takes. Takes 30-45 minutes.
    #[arg(long, requires = "framework")]
    pub realistic: bool,
}

/// `qbridge import`
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Route name.
    #[arg(long)]
    pub route: String,
    /// Count what would be copied; store nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `qbridge survey`
#[derive(Debug, Args)]
pub struct SurveyArgs {
    /// How long to watch the queues for push rates (e.g. 5s; 0s: not sampled).
    #[arg(long, default_value = "5s")]
    pub sample: String,
    /// Write a draft config with one route per queue to this file (refuses
    /// an existing file).
    #[arg(long)]
    pub write_config: Option<PathBuf>,
}

/// `qbridge diff`
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Route name.
    #[arg(long)]
    pub route: String,
    /// Start of the window: a duration back from now (10m, 1h) or an RFC 3339 time
    /// (default: the route's gates.window).
    #[arg(long)]
    pub since: Option<String>,
    /// Fill what is missing on one side: mirror what only Redis has, push
    /// back what Redis lost on evidence (a restart, flush or failover after
    /// the push); never what is unaccounted without an operator's decision.
    #[arg(long)]
    pub repair: bool,
    /// With --repair: the operator knows these jobs are lost (audited; needs
    /// --reason): unaccounted mirror copies are pushed back to Redis; a held
    /// re-push runs live in Postgres instead when Redis does not hold its
    /// original (one path per key, never both).
    #[arg(long, value_name = "KEY", num_args = 1.., requires = "repair")]
    pub assume_lost: Vec<String>,
    /// With --repair: every unaccounted job mirrored before this RFC 3339
    /// time or duration back from now is lost (audited; needs --reason).
    /// Held re-pushes are released only by key (--assume-lost).
    #[arg(long, value_name = "TIME", requires = "repair")]
    pub assume_lost_before: Option<String>,
    /// Why the jobs are known to be lost (required with --assume-lost…).
    #[arg(long)]
    pub reason: Option<String>,
    /// Who decides (default: $USER@host).
    #[arg(long, env = "QBRIDGE_OPERATOR")]
    pub by: Option<String>,
}

/// `qbridge dlq …`
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// List dead jobs, newest first (payloads are not shown).
    #[command(after_help = "Example:\n  qbridge dlq list --queue emails --error timeout")]
    List {
        #[command(flatten)]
        filter: DlqFilter,
        /// Most rows to show.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Show one dead job, with its payload.
    #[command(after_help = "Example:\n  qbridge dlq show 1234")]
    Show {
        /// Job id.
        id: i64,
    },
    /// Move dead jobs back to the queue (attempts reset) at a bounded rate.
    #[command(
        after_help = "Examples:\n  qbridge dlq requeue --id 1234 --id 1235\n  \
        qbridge dlq requeue --queue emails --error 'http handler answered 503' --rate 200\n  \
        qbridge dlq requeue --all --rate 1000"
    )]
    Requeue {
        #[command(flatten)]
        filter: DlqFilter,
        /// Requeue every dead job (required when no filter is given).
        #[arg(long)]
        all: bool,
        /// Most jobs per second, so a replay cannot starve live work.
        #[arg(long, default_value_t = 100)]
        rate: u32,
    },
}

/// Filters shared by `dlq list` and `dlq requeue`.
#[derive(Debug, Args)]
pub struct DlqFilter {
    /// Only these job ids.
    #[arg(long = "id")]
    pub ids: Vec<i64>,
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only jobs whose last error contains this text.
    #[arg(long = "error")]
    pub error_contains: Option<String>,
}

#[cfg(test)]
mod tests;
