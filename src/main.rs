//! The `qbridge` binary: parse the command line, set up logging, dispatch.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = qbridge::cli::Cli::parse();
    let as_json = cli.json;
    // Benchmarks and the demo print their own report; per-runtime info lines would drown it.
    let level = match cli.command {
        qbridge::cli::Command::Bench(_)
        | qbridge::cli::Command::Demo(_)
        | qbridge::cli::Command::Chaos(_) => "warn",
        _ => "info,sqlx=warn",
    };
    qbridge::telemetry::init_logging(cli.log_format, level);
    match qbridge::commands::dispatch(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            let err = anyhow::Error::from(err);
            if as_json {
                // Scripts asked for JSON: the error is one JSON line too.
                eprintln!("{}", serde_json::json!({ "error": err.to_string() }));
            } else {
                eprintln!("error: {err}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
