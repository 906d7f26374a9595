//! `qbridge cutover …`: its subcommands and their arguments.

use clap::{Args, Subcommand};

/// `qbridge cutover …`
#[derive(Debug, Subcommand)]
pub enum CutoverCommand {
    /// Every route: phase, since, who changed it, and the gate of its next step.
    #[command(
        after_help = "Example:\n  qbridge --config qbridge.toml cutover status\n  \
                            qbridge --config qbridge.toml --json cutover status   # for scripts"
    )]
    Status,
    /// Move a route one phase forward if its gate passes.
    Advance(CutoverArgs),
    /// Move a route one phase back (no gate; a reason is required).
    #[command(
        after_help = "Example:\n  qbridge cutover rollback emails --reason 'handler fails on Postgres'"
    )]
    Rollback(RollbackArgs),
    /// In postgres_only: change the share of job keys produced Postgres-only
    /// (the gradual flip; sticky by a hash of the job key).
    #[command(
        after_help = "Example:\n  qbridge cutover percent emails 10 --reason '1% clean for an hour'"
    )]
    Percent(PercentArgs),
    /// Call the route's handler once in shadow mode with a job qbridge
    /// stored (the newest, or --key), as the worker will in `shadow`, and
    /// print its answer. Records nothing; check that the call had no effect.
    #[command(
        name = "shadow-test",
        after_help = "Example:\n  qbridge --config qbridge.toml cutover shadow-test emails\n  \
                      qbridge --config qbridge.toml cutover shadow-test emails --key 4f0c2d9e"
    )]
    ShadowTest(ShadowTestArgs),
}

/// Arguments of `cutover shadow-test`.
#[derive(Debug, Args)]
pub struct ShadowTestArgs {
    /// Route name.
    pub route: String,
    /// The job to send (default: the newest the route stored).
    #[arg(long)]
    pub key: Option<String>,
}

/// Arguments of `cutover percent`.
#[derive(Debug, Args)]
pub struct PercentArgs {
    /// Route name.
    pub route: String,
    /// Share of job keys flipped, 0 to 100.
    pub percent: u8,
    /// Why; stored in the audit log.
    #[arg(long)]
    pub reason: Option<String>,
    /// Who is changing it (default: $USER@host).
    #[arg(long, env = "QBRIDGE_OPERATOR")]
    pub by: Option<String>,
}

/// Arguments of `cutover rollback`: no gate to force, no share to set.
#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// Route name.
    pub route: String,
    /// Why; stored in the audit log (required).
    #[arg(long)]
    pub reason: Option<String>,
    /// Who is changing it (default: $USER@host).
    #[arg(long, env = "QBRIDGE_OPERATOR")]
    pub by: Option<String>,
}

/// Arguments of `cutover advance`.
#[derive(Debug, Args)]
pub struct CutoverArgs {
    /// Route name.
    pub route: String,
    /// Why; stored in the audit log (required with --force).
    #[arg(long)]
    pub reason: Option<String>,
    /// Advance although the gate refuses (audited with the failing numbers).
    #[arg(long)]
    pub force: bool,
    /// Into postgres_only: flip only this share of job keys at first (e.g. 1),
    /// then raise it with `qbridge cutover percent`.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub percent: Option<u8>,
    /// Who is changing it (default: $USER@host).
    #[arg(long, env = "QBRIDGE_OPERATOR")]
    pub by: Option<String>,
}
