//! Checked model → the [`Config`] the request path reads: one [`Rule`] per `rate_limit`, one
//! descriptor tree per domain.

use std::collections::HashMap;
use std::sync::Arc;

use super::validate::{DescriptorSpec, DomainSpec};
use super::{Config, Domain};
use crate::descriptor::{Level, Node, Pattern};
use crate::rule::{FailureMode, Rule, RuleId};

/// Builds the config from checked domains (file name, domain) in load order.
pub(crate) fn config(specs: Vec<(Arc<str>, DomainSpec)>, digest: String) -> Config {
    let mut rules = Vec::new();
    let mut domains = Vec::with_capacity(specs.len());
    for (file, spec) in specs {
        let name: Arc<str> = spec.name.value.as_str().into();
        let first_rule = rules.len();
        let mut builder = Builder {
            file: &file,
            domain: &name,
            failure_mode: spec.failure_mode,
            rules: &mut rules,
        };
        let tree = builder.level(&spec.descriptors, &name);
        domains.push(Domain {
            name,
            failure_mode: spec.failure_mode,
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
    }
}

struct Builder<'a> {
    file: &'a str,
    domain: &'a Arc<str>,
    failure_mode: Option<FailureMode>,
    rules: &'a mut Vec<Arc<Rule>>,
}

impl Builder<'_> {
    /// Rules are numbered depth-first in config order, so ids follow the files.
    fn level(&mut self, specs: &[DescriptorSpec], parent_path: &str) -> Level {
        let mut level = Level::default();
        for spec in specs {
            // envoyproxy/ratelimit's stats key: `key_value` for a descriptor with a value.
            let path = match &spec.value {
                Some(value) => format!("{parent_path}.{}_{value}", spec.key),
                None => format!("{parent_path}.{}", spec.key),
            };
            let rule = spec.rule.as_ref().map(|r| {
                let rule = Arc::new(Rule {
                    id: RuleId(self.rules.len() as u32),
                    domain: self.domain.clone(),
                    path: path.as_str().into(),
                    name: r.name.as_deref().map(Arc::from),
                    limit: r.limit,
                    shadow_mode: r.shadow_mode,
                    detailed_metric: r.detailed_metric,
                    cost: r.cost,
                    failure_mode: r.failure_mode.or(self.failure_mode),
                    replaces: r.replaces.iter().map(|n| Arc::from(n.as_str())).collect(),
                    source: format!("{}:{}", self.file, spec.at.line).into(),
                });
                self.rules.push(rule.clone());
                rule
            });
            let children = self.level(&spec.children, &path);
            let inserted = level.insert(
                &spec.key,
                Pattern::parse(spec.value.as_deref()),
                Node::new(rule, children),
            );
            // Validation rejects duplicate (key, value) pairs, which are exactly the clashes here.
            debug_assert!(inserted.is_ok(), "duplicate descriptor passed validation");
        }
        level
    }
}
