//! The service side of descriptor configs: the active config ([`ConfigStore`]), file reloads and
//! the `--config-*` flags. The model, validation and loading are [`sluice_core::config`],
//! re-exported here so the service names one `config` module.

pub mod args;
pub mod reload;
mod store;

pub use sluice_core::config::*;
pub use store::{ConfigStore, Rejected};
