//! `sluice`: flags → settings → `run(settings, shutdown)`.

use std::process::ExitCode;

use clap::Parser;
use sluice::settings::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { path } => sluice::cli::check_config(&path),
        Command::Serve(settings) => {
            sluice::telemetry::init_logging(&settings.log_level, settings.log_format);
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
