//! Checked model → the [`Config`] the request path reads: one [`Rule`] per `rate_limit`, one
//! descriptor tree per domain.

use std::collections::HashMap;
use std::sync::Arc;

use super::spec::{DescriptorSpec, DomainSpec, RuleSpec};
use super::{Config, Domain};
use crate::algorithm::Algorithm;
use crate::descriptor::{Level, Node, Pattern};
use crate::rule::{Charge, FailureMode, MetricLevel, Origin, Rule, RuleId, window_label};

/// One file's share of a domain: all of it, unless several files are merged into one domain.
pub(crate) struct Part {
    pub file: Arc<str>,
    pub spec: DomainSpec,
}

/// Builds the config from checked domains in load order, each from one or more parts (merged in
/// order). `all` puts every rule in shadow or quota mode; `defaults` count the rules whose rule
/// and domain name no algorithm or charge.
pub(crate) fn config(
    domains_parts: Vec<Vec<Part>>,
    digest: String,
    all: Modes,
    defaults: Defaults,
) -> Config {
    let default_algorithm = defaults.algorithm;
    let mut rules = Vec::new();
    let mut domains = Vec::with_capacity(domains_parts.len());
    for parts in domains_parts {
        let Some(first) = parts.first() else {
            continue;
        };
        let name: Arc<str> = first.spec.name.value.as_str().into();
        let file = first.file.clone();
        // Merging checked that the parts agree on the failure mode.
        let failure_mode = parts.iter().find_map(|p| p.spec.failure_mode);
        let domain_algorithm = parts
            .iter()
            .find_map(|p| p.spec.algorithm.as_ref())
            .map(|a| a.value);
        let (algorithm, algorithm_from) =
            resolved_algorithm(None, domain_algorithm, default_algorithm);
        // Merging checked that the parts agree on the charge.
        let domain_charge = parts
            .iter()
            .find_map(|p| p.spec.charge.as_ref())
            .map(|c| c.value);
        let (charge, charge_from) = resolved(None, domain_charge, defaults.charge);
        let first_rule = rules.len();
        let mut tree = Level::default();
        for part in &parts {
            let mut builder = Builder {
                file: &part.file,
                domain: &name,
                failure_mode,
                domain_algorithm,
                default_algorithm,
                domain_charge,
                default_charge: defaults.charge,
                all,
                rules: &mut rules,
            };
            builder.fill(&mut tree, &part.spec.descriptors, &name, &[], &[]);
        }
        domains.push(Domain {
            name,
            failure_mode,
            algorithm,
            algorithm_from,
            charge,
            charge_from,
            file,
            tree,
            rules: rules[first_rule..].to_vec(),
        });
    }
    let index = domains
        .iter()
        .enumerate()
        .map(|(i, d)| (d.name.clone(), i))
        .collect::<HashMap<_, _>>();
    Config {
        domains,
        index,
        rules,
        digest,
        warnings: Vec::new(),
    }
}

/// The algorithm a rule ends up with and where it comes from: its own `algorithm`, else its
/// domain's, else `--default-algorithm`. A domain's default for its rules is `own: None`.
pub(crate) fn resolved_algorithm(
    own: Option<Algorithm>,
    domain: Option<Algorithm>,
    global: Algorithm,
) -> (Algorithm, Origin) {
    resolved(own, domain, global)
}

/// A setting that falls back from the rule to its domain to the global default, and where it
/// came from.
fn resolved<T>(own: Option<T>, domain: Option<T>, global: T) -> (T, Origin) {
    match (own, domain) {
        (Some(own), _) => (own, Origin::Rule),
        (None, Some(domain)) => (domain, Origin::Domain),
        (None, None) => (global, Origin::Default),
    }
}

/// The global defaults of rules whose rule and domain name none.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Defaults {
    /// `--default-algorithm`.
    pub algorithm: Algorithm,
    /// `--default-charge`.
    pub charge: Charge,
}

/// Modes a global setting puts every rule in, whatever its file says.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Modes {
    /// `--shadow-mode` (envoyproxy/ratelimit's `SHADOW_MODE`).
    pub shadow: bool,
    /// `--quota-mode` (envoyproxy/ratelimit's `QUOTA_MODE`).
    pub quota: bool,
}

struct Builder<'a> {
    file: &'a str,
    domain: &'a Arc<str>,
    failure_mode: Option<FailureMode>,
    /// The domain's `algorithm`, for rules that name none.
    domain_algorithm: Option<Algorithm>,
    /// `--default-algorithm`, for rules whose rule and domain name none.
    default_algorithm: Algorithm,
    /// The domain's `charge`, for rules that name none.
    domain_charge: Option<Charge>,
    /// `--default-charge`, for rules whose descriptor and domain name none.
    default_charge: Charge,
    all: Modes,
    rules: &'a mut Vec<Arc<Rule>>,
}

impl Builder<'_> {
    /// Rules are numbered depth-first in config order, so ids follow the files.
    /// `shared` holds, per level above, the pattern of a `share_threshold` wildcard on the path.
    fn fill(
        &mut self,
        level: &mut Level,
        specs: &[DescriptorSpec],
        parent_path: &str,
        shared: &[Option<Arc<str>>],
        metric: &[MetricLevel],
    ) {
        for spec in specs {
            let mut metric = metric.to_vec();
            metric.push(MetricLevel {
                value: spec.value.as_deref().map(Arc::from),
                value_to_metric: spec.value_to_metric,
            });
            let mut shared = shared.to_vec();
            shared.push(
                spec.value
                    .as_deref()
                    .filter(|_| spec.share_threshold)
                    .map(Arc::from),
            );
            // envoyproxy/ratelimit's stats key: `key_value` for a descriptor with a value.
            let path = match &spec.value {
                Some(value) => format!("{parent_path}.{}_{value}", spec.key),
                None => format!("{parent_path}.{}", spec.key),
            };
            let source: Arc<str> = format!("{}:{}", self.file, spec.at.line).into();
            let shared_values: Arc<[Option<Arc<str>>]> = if shared.iter().any(Option::is_some) {
                shared.clone().into()
            } else {
                Arc::default()
            };
            let metric_levels: Arc<[MetricLevel]> = if metric.iter().any(|m| m.value_to_metric) {
                metric.clone().into()
            } else {
                Arc::default()
            };
            let rule = spec.rule.as_ref().map(|first| {
                let place = Place {
                    path: &path,
                    shared_values: &shared_values,
                    metric_levels: &metric_levels,
                    source: &source,
                };
                let first_id = self.rules.len() as u32;
                let also: Vec<Arc<Rule>> = (first_id + 1..)
                    .zip(&first.also)
                    .map(|(id, r)| self.rule(r, &place, RuleId(id), Arc::default()))
                    .collect();
                let rule = self.rule(first, &place, RuleId(first_id), also.clone().into());
                self.rules.push(rule.clone());
                self.rules.extend(also);
                rule
            });
            let mut children = Level::default();
            self.fill(&mut children, &spec.children, &path, &shared, &metric);
            // An in-flight cap's descriptor ends with its holder entry, whatever its value:
            // it reaches the same rule (which keeps it out of the storage key).
            if let Some(rule) = &rule
                && let Some(cap) = rule.holding()
            {
                let holder = Node::new(Some(rule.clone()), Level::default());
                let inserted = children.insert(&cap.holder, Pattern::parse(None), holder);
                debug_assert!(
                    inserted.is_ok(),
                    "validation refuses a child on the holder key"
                );
            }
            let inserted = level.insert(
                &spec.key,
                Pattern::parse(spec.value.as_deref()),
                Node::new(rule, children),
            );
            // Validation (and merging) reject duplicate (key, value) pairs, which are exactly the
            // clashes here.
            debug_assert!(inserted.is_ok(), "duplicate descriptor passed validation");
        }
    }

    /// The rule of one limit of a descriptor. A `rate_limits` entry's path ends in its window
    /// (`edge.tenant[30s]`), so its metrics are its own.
    fn rule(
        &self,
        r: &RuleSpec,
        place: &Place<'_>,
        id: RuleId,
        also: Arc<[Arc<Rule>]>,
    ) -> Arc<Rule> {
        let path = match r.window_tag {
            Some(secs) => format!("{}[{}]", place.path, window_label(secs)),
            None => place.path.to_owned(),
        };
        let (algorithm, algorithm_from) = resolved_algorithm(
            r.algorithm.as_ref().map(|a| a.value),
            self.domain_algorithm,
            self.default_algorithm,
        );
        let (charge, charge_from) = match r.reserve {
            // A reservation is taken only when it fits; its settlement always lands.
            Some(_) => (Charge::IfAllowed, Origin::Rule),
            None => resolved(
                r.charge.as_ref().map(|c| c.value),
                self.domain_charge,
                self.default_charge,
            ),
        };
        Arc::new(Rule {
            id,
            domain: self.domain.clone(),
            path: path.as_str().into(),
            name: r.name.as_deref().map(Arc::from),
            limit: r.limit,
            algorithm,
            algorithm_from,
            shadow_mode: r.shadow_mode || self.all.shadow,
            quota_mode: r.quota_mode || self.all.quota,
            detailed_metric: r.detailed_metric,
            cost: r.cost,
            charge,
            charge_from,
            lease: r.lease,
            shards: r.shards,
            in_flight: r.in_flight.clone(),
            reserve: r.reserve.clone(),
            failure_mode: r.failure_mode.or(self.failure_mode),
            replaces: r.replaces.iter().map(|n| Arc::from(n.as_str())).collect(),
            shared_values: place.shared_values.clone(),
            metric_levels: place.metric_levels.clone(),
            metadata: r.metadata.clone().map(Arc::new),
            source: place.source.clone(),
            window_tag: r.window_tag,
            also,
        })
    }
}

/// Where a descriptor's limits sit in the config: what every limit of it shares.
struct Place<'a> {
    path: &'a str,
    shared_values: &'a Arc<[Option<Arc<str>>]>,
    metric_levels: &'a Arc<[MetricLevel]>,
    source: &'a Arc<str>,
}
