//! `sluice`: flags → settings → `run(settings, shutdown)`.

use std::process::ExitCode;

use clap::Parser;
use sluice::settings::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let (args, compat) = match sluice::compat::serve_args() {
        Ok(translated) => translated,
        Err(errors) => {
            for e in errors {
                eprintln!("sluice: {e}");
            }
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::CheckConfig(args) => sluice::cli::check_config(&args),
        Command::Explain(args) => sluice::cli::explain(&args),
        Command::Serve(settings) => {
            sluice::telemetry::init_logging(&settings.log_level, settings.log_format);
            compat.log();
            match sluice::server::run(*settings, sluice::server::shutdown_signal()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("sluice: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
