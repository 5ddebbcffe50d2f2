//! Descriptor configs: the YAML model, validation with `file:line:column` errors, loading a file
//! or a directory, and the compiled [`Config`] the request path reads.
//!
//! Pipeline per source: `yaml` (located tree) → `raw` (schema shape) → `validate` (meaning) →
//! `compile` (rules and descriptor trees). Every stage reports into a `Sink` and carries on, so
//! one run lists every problem of every file.

mod compile;
mod load;
mod raw;
mod store;
mod validate;
mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::descriptor::Level;
use crate::request::Entry;
use crate::rule::{FailureMode, Rule, RuleId};

pub use load::load_path;
pub use store::{ConfigStore, Rejected};

#[cfg(test)]
mod tests;

use yaml::Pos;

/// One problem found in a config source.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    pub file: String,
    /// 1-based; 0 when the problem has no place in the file (unreadable file, empty directory).
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.message
            )
        }
    }
}

/// Every problem found in a config set (never just the first). Display: one `file:line:col: message` per line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<Diagnostic>);

/// A validated, compiled set of domains.
#[derive(Debug)]
pub struct Config {
    /// In load order (a directory's files sorted by name).
    domains: Vec<Domain>,
    index: HashMap<Arc<str>, usize>,
    /// Every rule, indexed by [`RuleId`].
    rules: Vec<Arc<Rule>>,
    digest: String,
}

/// One domain's rules.
#[derive(Debug)]
pub struct Domain {
    pub name: Arc<str>,
    pub failure_mode: Option<FailureMode>,
    file: Arc<str>,
    tree: Level,
    rules: Vec<Arc<Rule>>,
}

impl Default for Config {
    /// No domains: every request is for an unknown domain.
    fn default() -> Self {
        compile::config(Vec::new(), digest(&[]))
    }
}

impl Config {
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.index.get(name).map(|&i| &self.domains[i])
    }

    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.iter()
    }

    /// Every rule of every domain, in [`RuleId`] order.
    pub fn rules(&self) -> impl Iterator<Item = &Arc<Rule>> {
        self.rules.iter()
    }

    pub fn rule(&self, id: RuleId) -> Option<&Arc<Rule>> {
        self.rules.get(id.0 as usize)
    }

    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Hex digest of the sources, a version operators can compare across replicas.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// One line for `check-config`: `ok: 2 domains, 9 rules, digest 1a2b3c4d`.
    pub fn summary(&self) -> String {
        let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        format!(
            "ok: {}, {}, digest {}",
            plural(self.domains.len(), "domain"),
            plural(self.rules.len(), "rule"),
            &self.digest[..8]
        )
    }

    /// The active config as JSON for `GET /config`.
    pub fn to_json(&self) -> serde_json::Value {
        let domains: Vec<serde_json::Value> = self
            .domains
            .iter()
            .map(|d| {
                serde_json::json!({
                    "domain": d.name,
                    "file": d.file,
                    "failure_mode": d.failure_mode,
                    "rules": d.rules,
                })
            })
            .collect();
        serde_json::json!({
            "digest": self.digest,
            "rule_count": self.rules.len(),
            "domains": domains,
        })
    }
}

impl Domain {
    /// The rule a request descriptor's entries reach, envoyproxy/ratelimit's matching.
    pub fn find(&self, entries: &[Entry]) -> Option<&Arc<Rule>> {
        self.tree.find(entries)
    }

    /// The source this domain was loaded from.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// This domain's rules in config order.
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }
}

/// Loads named in-memory sources as one set (tests, xDS).
pub fn load_sources(sources: &[(String, String)]) -> Result<Config, ConfigErrors> {
    let mut per_file: Vec<Vec<Diagnostic>> = vec![Vec::new(); sources.len()];
    let mut specs = Vec::with_capacity(sources.len());
    for (index, ((name, text), diagnostics)) in sources.iter().zip(&mut per_file).enumerate() {
        let mut sink = Sink {
            file: name,
            out: diagnostics,
        };
        if let Some(spec) = check_source(text, &mut sink) {
            specs.push((index, spec));
        }
    }

    let mut first_seen: HashMap<&str, (&str, Pos)> = HashMap::new();
    for (index, spec) in &specs {
        let file = sources[*index].0.as_str();
        let name = spec.name.value.as_str();
        match first_seen.get(name) {
            Some((first_file, first_at)) => Sink {
                file,
                out: &mut per_file[*index],
            }
            .error(
                spec.name.at,
                format!(
                    "duplicate domain `{name}`: already defined at {first_file}:{}:{}",
                    first_at.line, first_at.column
                ),
            ),
            None => {
                first_seen.insert(name, (file, spec.name.at));
            }
        }
    }

    let mut diagnostics: Vec<Diagnostic> = per_file
        .into_iter()
        .flat_map(|mut file| {
            file.sort_by_key(|d| (d.line, d.column));
            file
        })
        .collect();
    if !diagnostics.is_empty() {
        // A YAML alias repeats a subtree, and with it that subtree's problems at the same place.
        diagnostics.dedup();
        return Err(ConfigErrors(diagnostics));
    }
    let specs = specs
        .into_iter()
        .map(|(index, spec)| (Arc::from(sources[index].0.as_str()), spec))
        .collect();
    Ok(compile::config(specs, digest(sources)))
}

/// One source through parsing, shape and meaning checks.
fn check_source(text: &str, sink: &mut Sink) -> Option<validate::DomainSpec> {
    let docs = match yaml::parse(text) {
        Ok(docs) => docs,
        Err(e) => {
            sink.error(e.at, e.message);
            return None;
        }
    };
    let Some((doc, extra)) = docs.split_first() else {
        sink.error(
            Pos::new(1, 1),
            "no domain in this file: expected a mapping with `domain` and `descriptors`",
        );
        return None;
    };
    if let Some(second) = extra.first() {
        sink.error(
            second.at,
            "a config file holds one domain; found a second YAML document",
        );
    }
    let raw = raw::read_domain(doc, sink)?;
    validate::domain(&raw, sink)
}

/// SHA-1 over the sources sorted by name. Names count only by their last component, so replicas
/// that mount the same files at different paths agree.
fn digest(sources: &[(String, String)]) -> String {
    let mut named: Vec<(&str, &str)> = sources
        .iter()
        .map(|(name, text)| {
            let base = Path::new(name)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or(name);
            (base, text.as_str())
        })
        .collect();
    named.sort_unstable();
    let mut sha = sha1_smol::Sha1::new();
    for (name, text) in named {
        // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
        for part in [name, text] {
            sha.update(&(part.len() as u64).to_be_bytes());
            sha.update(part.as_bytes());
        }
    }
    sha.digest().to_string()
}

/// Where the checks of one source report.
pub(crate) struct Sink<'a> {
    file: &'a str,
    out: &'a mut Vec<Diagnostic>,
}

impl Sink<'_> {
    pub(crate) fn error(&mut self, at: Pos, message: impl Into<String>) {
        self.out.push(Diagnostic {
            file: self.file.to_owned(),
            line: at.line,
            column: at.column,
            message: yaml::escape_controls(&message.into()),
        });
    }
}
