//! The `qbridge` binary: parse the command line, set up logging, dispatch.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = qbridge::cli::Cli::parse();
    // Benchmarks print their own report; per-runtime info lines would drown it.
    let level = match cli.command {
        qbridge::cli::Command::Bench(_) => "warn",
        _ => "info,sqlx=warn",
    };
    qbridge::telemetry::init_logging(cli.log_format, level);
    match qbridge::commands::dispatch(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            let err = anyhow::Error::from(err);
            eprintln!("error: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
