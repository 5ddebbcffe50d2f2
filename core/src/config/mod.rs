//! Descriptor configs: the YAML model, validation with `file:line:column` errors, loading a file
//! or a directory, and the compiled [`Config`] the request path reads.
//!
//! Pipeline per source: `yaml` (located tree) → `raw` (schema shape) → `validate` (meaning) →
//! `compile` (rules and descriptor trees). Every stage reports into a `Sink` and carries on, so
//! one run lists every problem of every file.

mod compile;
mod defaults;
mod in_flight;
mod lint;
mod load;
mod raw;
mod spec;
mod validate;
mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::algorithm::Algorithm;
use crate::descriptor::{Explanation, Level};
use crate::request::Entry;
use crate::rule::{Charge, FailureMode, Origin, Rule, RuleId};

pub use load::{load_path, load_path_with};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_algorithms;
#[cfg(test)]
mod tests_model;
#[cfg(test)]
mod tests_ops;
#[cfg(test)]
mod tests_reference;

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
    /// Legal but suspicious constructs (shadowed or unreachable descriptors, dangling
    /// `replaces`): reported by `check-config` and `GET /config`, never a reason to reject.
    warnings: Vec<Diagnostic>,
}

/// How a set of sources becomes one config, beyond what the files themselves say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Files naming the same domain add their descriptors to it, in load order, instead of being
    /// rejected as duplicates (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
    /// Read a directory's hidden `*.yaml` files too. Off by default; entries starting with `..`
    /// (a Kubernetes ConfigMap volume's internals) are never read either way.
    pub dotfiles: bool,
    /// Put every configured rule in shadow mode (envoyproxy/ratelimit's global `SHADOW_MODE`):
    /// buckets are counted, nothing is rejected. Request `limit` overrides still apply.
    pub shadow_all: bool,
    /// Put every configured rule in quota mode (envoyproxy/ratelimit's global `QUOTA_MODE`):
    /// a request is rejected only by its quota descriptors all being over their limits.
    pub quota_all: bool,
    /// Most entries a request descriptor may carry (`--max-entries`): deeper descriptors are
    /// reported as unreachable.
    pub max_entries: usize,
    /// Algorithm of rules whose domain and `rate_limit` name none (`--default-algorithm`).
    pub default_algorithm: Algorithm,
    /// `charge` of rules whose descriptor and domain name none (`--default-charge`).
    pub default_charge: Charge,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            merge_domains: false,
            dotfiles: false,
            shadow_all: false,
            quota_all: false,
            max_entries: 32,
            default_algorithm: Algorithm::TokenBucket,
            default_charge: Charge::IfAllowed,
        }
    }
}

/// One domain's rules.
#[derive(Debug)]
pub struct Domain {
    pub name: Arc<str>,
    pub failure_mode: Option<FailureMode>,
    /// The algorithm of this domain's rules that name none, and of request `limit` overrides
    /// that reach no rule: the domain's `algorithm`, else `--default-algorithm`.
    pub algorithm: Algorithm,
    pub algorithm_from: Origin,
    /// The `charge` of this domain's rules that name none, and of request `limit` overrides
    /// that reach no rule: the domain's `charge`, else `--default-charge`.
    pub charge: Charge,
    pub charge_from: Origin,
    file: Arc<str>,
    tree: Level,
    rules: Vec<Arc<Rule>>,
}

impl Default for Config {
    /// No domains: every request is for an unknown domain.
    fn default() -> Self {
        compile::config(
            Vec::new(),
            digest(&[]),
            compile::Modes::default(),
            compile::Defaults::default(),
        )
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

    /// Suspicious but legal constructs found while loading, in file order.
    pub fn warnings(&self) -> &[Diagnostic] {
        &self.warnings
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
                    "algorithm": d.algorithm,
                    "algorithm_from": d.algorithm_from,
                    "charge": d.charge,
                    "charge_from": d.charge_from,
                    "rules": d.rules,
                })
            })
            .collect();
        serde_json::json!({
            "digest": self.digest,
            "rule_count": self.rules.len(),
            "domains": domains,
            "warnings": self.warnings,
        })
    }
}

impl Domain {
    /// The rule a request descriptor's entries reach, envoyproxy/ratelimit's matching.
    pub fn find(&self, entries: &[Entry]) -> Option<&Arc<Rule>> {
        self.tree.find(entries)
    }

    /// The walk [`Domain::find`] makes, step by step (for `sluice explain` and `GET /explain`).
    pub fn explain(&self, entries: &[Entry]) -> Explanation {
        self.tree.explain(entries)
    }

    /// The descriptor an RLQS bucket id stands for and the rule it reaches
    /// ([`crate::descriptor::Level::place`]): the same rule, hence the same bucket, an RLS
    /// descriptor with those entries in that order reaches.
    pub fn place(
        &self,
        entries: &[Entry],
    ) -> Result<(Vec<Entry>, Arc<Rule>), crate::descriptor::Unplaced> {
        self.tree.place(entries)
    }

    /// The source this domain was loaded from (the first one, when files are merged).
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
    load_sources_with(sources, &LoadOptions::default())
}

/// Loads named in-memory sources as one set, with `options`: each file checked on its own, the
/// files grouped by domain (merged or rejected as duplicates), each domain's algorithm-dependent
/// fields checked, then compiled.
pub fn load_sources_with(
    sources: &[(String, String)],
    options: &LoadOptions,
) -> Result<Config, ConfigErrors> {
    let mut per_file: Vec<Vec<Diagnostic>> = vec![Vec::new(); sources.len()];
    let (specs, read_warnings) = check_sources(sources, &mut per_file);
    let groups = group_by_domain(specs, sources, options, &mut per_file);
    for group in &groups {
        check_domain(group, sources, options, &mut per_file);
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
    let mut config = compile_domains(groups, sources, options);
    config.warnings.extend(read_warnings);
    config
        .warnings
        .sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
    Ok(config)
}

/// The files of one domain: each file's index in the sources and its checked model.
type DomainFiles = Vec<(usize, spec::DomainSpec)>;

/// Each source through [`check_source`]; the good ones with their index, and the warnings
/// reading them raised.
fn check_sources(
    sources: &[(String, String)],
    per_file: &mut [Vec<Diagnostic>],
) -> (DomainFiles, Vec<Diagnostic>) {
    let mut specs = Vec::with_capacity(sources.len());
    let mut warnings = Vec::new();
    for (index, ((name, text), diagnostics)) in sources.iter().zip(per_file).enumerate() {
        let mut sink = Sink::new(name, diagnostics);
        if let Some(spec) = check_source(text, &mut sink) {
            specs.push((index, spec));
        }
        warnings.append(&mut sink.warnings);
    }
    (specs, warnings)
}

/// Groups the files of each domain, in load order of the domains' first files. Without
/// `merge_domains`, a second file of a domain is an error.
fn group_by_domain(
    specs: DomainFiles,
    sources: &[(String, String)],
    options: &LoadOptions,
    per_file: &mut [Vec<Diagnostic>],
) -> Vec<DomainFiles> {
    let mut groups: Vec<DomainFiles> = Vec::new();
    let mut group_of: HashMap<String, usize> = HashMap::new();
    for (index, spec) in specs {
        let name = spec.name.value.clone();
        match group_of.get(&name) {
            Some(&g) if options.merge_domains => groups[g].push((index, spec)),
            Some(&g) => {
                let (first_index, first) = &groups[g][0];
                Sink::new(&sources[index].0, &mut per_file[index]).error(
                    spec.name.at,
                    format!(
                        "duplicate domain `{name}`: already defined at {}:{}:{}",
                        sources[*first_index].0, first.name.at.line, first.name.at.column
                    ),
                );
            }
            None => {
                group_of.insert(name, groups.len());
                groups.push(vec![(index, spec)]);
            }
        }
    }
    groups
}

/// The checks that need every file of a domain: merging, and the fields whose meaning depends on
/// the algorithm.
fn check_domain(
    group: &[(usize, spec::DomainSpec)],
    sources: &[(String, String)],
    options: &LoadOptions,
    per_file: &mut [Vec<Diagnostic>],
) {
    if group.len() > 1 {
        check_merge(group, sources, per_file);
    }
    // The domain's algorithm, from whichever of its files sets it (merging checked that
    // they agree), decides what `burst` means in all of them.
    let domain = group.iter().find_map(|(index, spec)| {
        spec.algorithm
            .as_ref()
            .map(|a| (a, sources[*index].0.as_str()))
    });
    let default = defaults::AlgorithmDefault {
        domain,
        global: options.default_algorithm,
    };
    let charge = defaults::ChargeDefault {
        domain: group.iter().find_map(|(index, spec)| {
            spec.charge
                .as_ref()
                .map(|c| (c, sources[*index].0.as_str()))
        }),
        global: options.default_charge,
    };
    for (index, spec) in group {
        let mut sink = Sink::new(&sources[*index].0, &mut per_file[*index]);
        defaults::algorithm_fields(&spec.descriptors, default, &mut sink);
        defaults::charge_fields(&spec.descriptors, charge, &mut sink);
    }
}

/// Checked domains → the config, with the lint warnings.
fn compile_domains(
    groups: Vec<DomainFiles>,
    sources: &[(String, String)],
    options: &LoadOptions,
) -> Config {
    let domains: Vec<Vec<compile::Part>> = groups
        .into_iter()
        .map(|group| {
            group
                .into_iter()
                .map(|(index, spec)| compile::Part {
                    file: Arc::from(sources[index].0.as_str()),
                    spec,
                })
                .collect()
        })
        .collect();
    let warnings = lint::domains(&domains, options.max_entries, options.quota_all);
    let mut config = compile::config(
        domains,
        digest(sources),
        compile::Modes {
            shadow: options.shadow_all,
            quota: options.quota_all,
        },
        compile::Defaults {
            algorithm: options.default_algorithm,
            charge: options.default_charge,
        },
    );
    config.warnings = warnings;
    config
}

/// The checks merging adds for the files of one domain: top-level descriptors and rule names
/// must stay unique across the files, and the files must agree on the domain's failure mode and
/// algorithm.
/// Problems are reported in the later file.
fn check_merge(
    group: &[(usize, spec::DomainSpec)],
    sources: &[(String, String)],
    per_file: &mut [Vec<Diagnostic>],
) {
    let mut seen = MergeSeen::default();
    for (index, spec) in group {
        let index = *index;
        let mut report = |at: Pos, message: String| {
            Sink::new(&sources[index].0, &mut per_file[index]).error(at, message);
        };
        seen.settings(index, spec, sources, &mut report);
        seen.top_descriptors(index, spec, sources, &mut report);
        seen.rule_names(index, spec, sources, &mut report);
    }
}

/// What the earlier files of a merged domain set, and in which file.
#[derive(Default)]
struct MergeSeen<'a> {
    top: HashMap<(&'a str, Option<&'a str>), (usize, Pos)>,
    names: HashMap<&'a str, (usize, Pos)>,
    failure_mode: Option<(usize, FailureMode)>,
    algorithm: Option<(usize, Algorithm)>,
    charge: Option<(usize, Charge)>,
}

impl<'a> MergeSeen<'a> {
    /// The files must agree on the domain's failure mode and algorithm.
    fn settings(
        &mut self,
        index: usize,
        spec: &spec::DomainSpec,
        sources: &[(String, String)],
        report: &mut impl FnMut(Pos, String),
    ) {
        if let Some(mode) = spec.failure_mode {
            match self.failure_mode {
                Some((first, earlier)) if earlier != mode => report(
                    spec.name.at,
                    format!(
                        "domain `{}` has failure_mode `{}` here but `{}` in {}",
                        spec.name.value,
                        mode.as_str(),
                        earlier.as_str(),
                        sources[first].0
                    ),
                ),
                Some(_) => {}
                None => self.failure_mode = Some((index, mode)),
            }
        }
        if let Some(own) = &spec.algorithm {
            match self.algorithm {
                Some((first, earlier)) if earlier != own.value => report(
                    own.at,
                    format!(
                        "domain `{}` has algorithm `{}` here but `{}` in {}",
                        spec.name.value, own.value, earlier, sources[first].0
                    ),
                ),
                Some(_) => {}
                None => self.algorithm = Some((index, own.value)),
            }
        }
        if let Some(own) = &spec.charge {
            match self.charge {
                Some((first, earlier)) if earlier != own.value => report(
                    own.at,
                    format!(
                        "domain `{}` has charge `{}` here but `{}` in {}",
                        spec.name.value, own.value, earlier, sources[first].0
                    ),
                ),
                Some(_) => {}
                None => self.charge = Some((index, own.value)),
            }
        }
    }

    /// Top-level descriptors stay unique across the files.
    fn top_descriptors(
        &mut self,
        index: usize,
        spec: &'a spec::DomainSpec,
        sources: &[(String, String)],
        report: &mut impl FnMut(Pos, String),
    ) {
        for d in &spec.descriptors {
            let id = (d.key.as_str(), d.value.as_deref());
            match self.top.get(&id) {
                Some((first, at)) => report(
                    d.at,
                    format!(
                        "duplicate descriptor `{}` in merged domain `{}`: already defined at {}:{}:{}",
                        descriptor_label(&d.key, d.value.as_deref()),
                        spec.name.value,
                        sources[*first].0,
                        at.line,
                        at.column
                    ),
                ),
                None => {
                    self.top.insert(id, (index, d.at));
                }
            }
        }
    }

    /// Rule names stay unique across the files.
    fn rule_names(
        &mut self,
        index: usize,
        spec: &'a spec::DomainSpec,
        sources: &[(String, String)],
        report: &mut impl FnMut(Pos, String),
    ) {
        let mut named = Vec::new();
        defaults::named_rules(&spec.descriptors, &mut named);
        for (name, at) in named {
            match self.names.get(name) {
                Some((first, first_at)) if *first != index => report(
                    at,
                    format!(
                        "duplicate rate_limit name `{name}` in merged domain `{}`: already used at {}:{}:{}",
                        spec.name.value, sources[*first].0, first_at.line, first_at.column
                    ),
                ),
                Some(_) => {}
                None => {
                    self.names.insert(name, (index, at));
                }
            }
        }
    }
}

/// `key` or `key=value`, as messages name a descriptor.
fn descriptor_label(key: &str, value: Option<&str>) -> String {
    match value {
        Some(value) => format!("{key}={value}"),
        None => key.to_owned(),
    }
}

/// One source through parsing, shape and meaning checks.
fn check_source(text: &str, sink: &mut Sink) -> Option<spec::DomainSpec> {
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
    /// Legal but ignored constructs found while reading (see [`Config::warnings`]).
    warnings: Vec<Diagnostic>,
}

impl<'a> Sink<'a> {
    pub(crate) fn new(file: &'a str, out: &'a mut Vec<Diagnostic>) -> Sink<'a> {
        Sink {
            file,
            out,
            warnings: Vec::new(),
        }
    }

    pub(crate) fn warn(&mut self, at: Pos, message: impl Into<String>) {
        let diagnostic = self.diagnostic(at, message.into());
        self.warnings.push(diagnostic);
    }

    pub(crate) fn error(&mut self, at: Pos, message: impl Into<String>) {
        let diagnostic = self.diagnostic(at, message.into());
        self.out.push(diagnostic);
    }

    fn diagnostic(&self, at: Pos, message: String) -> Diagnostic {
        Diagnostic {
            file: self.file.to_owned(),
            line: at.line,
            column: at.column,
            message: yaml::escape_controls(&message),
        }
    }
}
