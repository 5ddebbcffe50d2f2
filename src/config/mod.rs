//! Descriptor configs: the YAML model, validation with `file:line:column` errors, loading a file
//! or a directory, and the compiled [`Config`] the request path reads.
//!
//! OWNER: config helper. Interface below is fixed; bodies are to be written.

use std::path::Path;
use std::sync::Arc;

use crate::request::Entry;
use crate::rule::{FailureMode, Rule};

/// One problem found in a config source.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Every problem found in a config set (never just the first). Display: one `file:line:col: message` per line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(|d| format!("{}:{}:{}: {}", d.file, d.line, d.column, d.message)).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<Diagnostic>);

/// A validated, compiled set of domains.
#[derive(Debug, Default)]
pub struct Config {}

/// One domain's rules.
#[derive(Debug)]
pub struct Domain {
    pub name: Arc<str>,
    pub failure_mode: Option<FailureMode>,
}

impl Config {
    pub fn domain(&self, _name: &str) -> Option<&Domain> {
        unimplemented!()
    }
    pub fn rule_count(&self) -> usize {
        unimplemented!()
    }
    /// Hex digest of the sources, a version operators can compare across replicas.
    pub fn digest(&self) -> &str {
        unimplemented!()
    }
    /// The active config as JSON for `GET /config`.
    pub fn to_json(&self) -> serde_json::Value {
        unimplemented!()
    }
}

impl Domain {
    /// The rule a request descriptor's entries reach, envoyproxy/ratelimit's matching.
    pub fn find(&self, _entries: &[Entry]) -> Option<&Arc<Rule>> {
        unimplemented!()
    }
}

/// Loads a YAML file or a directory of `*.yaml`/`*.yml` files (one domain per file).
pub fn load_path(_path: &Path) -> Result<Config, ConfigErrors> {
    unimplemented!()
}

/// Loads named in-memory sources as one set (tests, xDS).
pub fn load_sources(_sources: &[(String, String)]) -> Result<Config, ConfigErrors> {
    unimplemented!()
}
