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
        Command::Serve(mut settings) => {
            settings.telemetry.otlp = sluice::telemetry::OtlpSettings::from_process_env();
            let telemetry = sluice::telemetry::init(
                &settings.log_level,
                settings.log_format,
                &settings.telemetry,
            );
            compat.log();
            let result = sluice::server::run(*settings, sluice::server::shutdown_signal()).await;
            telemetry.shutdown().await;
            match result {
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
