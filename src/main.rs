//! The `qbridge` binary: parse the command line, set up logging, dispatch.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = qbridge::cli::Cli::parse();
    qbridge::telemetry::init_logging(cli.log_format, "info,sqlx=warn");
    match qbridge::commands::dispatch(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            let err = anyhow::Error::from(err);
            eprintln!("error: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
