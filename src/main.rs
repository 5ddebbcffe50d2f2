//! `sluice`: flags → settings → the subcommand ([`sluice::cli`]; `serve` runs the server).

use std::process::ExitCode;

use clap::Parser;
use sluice::settings::{Cli, Command};

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
    match Cli::parse_from(args).command {
        Command::CheckConfig(args) => sluice::cli::check_config(&args),
        Command::Explain(args) => sluice::cli::explain(&args),
        Command::Top(args) => sluice::cli::top::run(&args),
        Command::Bucket(args) => sluice::cli::bucket::run(&args),
        Command::Serve(settings) => sluice::cli::serve(*settings, compat),
    }
}
