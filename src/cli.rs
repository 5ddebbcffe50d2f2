//! Subcommands other than `serve`: they print for humans and CI and return an exit code.

use std::path::Path;
use std::process::ExitCode;

/// `sluice check-config PATH`: a one-line summary and exit 0, or every error as
/// `file:line:col: message` on stderr and exit 1.
pub fn check_config(path: &Path) -> ExitCode {
    match crate::config::load_path(path) {
        Ok(config) => {
            println!("{}", config.summary());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}
