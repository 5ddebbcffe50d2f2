//! `sluice`: flags → settings → runtime → `run(settings, shutdown)`.

use std::process::ExitCode;

use clap::Parser;
use sluice::settings::{Cli, Command, Settings};

// mimalloc, not glibc's malloc: per-request allocations (HTTP/2 frames, futures, buffers) took
// ~18 % of the CPU in glibc's malloc and free under load (docs/benchmarks.md, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
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
            // The runtime is built here, from the settings, rather than by `#[tokio::main]`:
            // its worker count is a flag (src/runtime.rs).
            match sluice::runtime::build(settings.worker_threads) {
                Ok(runtime) => runtime.block_on(serve(*settings, compat)),
                Err(e) => {
                    eprintln!("sluice: cannot start the runtime: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn serve(mut settings: Settings, compat: sluice::compat::Translation) -> ExitCode {
    settings.telemetry.otlp = sluice::telemetry::OtlpSettings::from_process_env();
    let telemetry = sluice::telemetry::init(
        &settings.log_level,
        settings.log_format,
        &settings.telemetry,
    );
    compat.log();
    if !sluice::runtime::LIFO_SLOT_DISABLED {
        tracing::warn!(
            "built without --cfg tokio_unstable: tokio's LIFO slot stays on and responses are \
             flushed one write each (see src/runtime.rs)"
        );
    }
    let result = sluice::server::run(settings, sluice::server::shutdown_signal()).await;
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
