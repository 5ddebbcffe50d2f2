//! Warnings: constructs that load fine but cannot do what their author meant.
//!
//! Matching has no backtracking (see [`crate::descriptor`]), so a descriptor can be legal and
//! still never be reached. Each warning names the descriptor it is about and, where another
//! descriptor is the cause, where that one is.

use std::collections::HashSet;

use super::Diagnostic;
use super::compile::Part;
use super::spec::DescriptorSpec;
use super::yaml::Pos;
use crate::descriptor::Pattern;

/// Warnings for every domain (each from one or more merged parts), sorted by file and position.
/// `quota_all` is `--quota-mode`, which puts every rule in quota mode.
pub(super) fn domains(
    domains: &[Vec<Part>],
    max_entries: usize,
    quota_all: bool,
) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for parts in domains {
        let mut names = HashSet::new();
        for part in parts {
            collect_names(&part.spec.descriptors, &mut names);
        }
        let top: Vec<Located> = parts
            .iter()
            .flat_map(|p| p.spec.descriptors.iter().map(|d| (&*p.file, d)))
            .collect();
        let mut lint = Lint {
            names: &names,
            max_entries,
            quota_all,
            out: &mut out,
        };
        lint.level(&top, 1);
    }
    out.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
    out
}

/// A descriptor and the file it is in.
type Located<'a> = (&'a str, &'a DescriptorSpec);

struct Lint<'a, 'o> {
    /// Every `rate_limit.name` of the domain.
    names: &'a HashSet<&'a str>,
    max_entries: usize,
    quota_all: bool,
    out: &'o mut Vec<Diagnostic>,
}

impl<'a> Lint<'a, '_> {
    /// One list of siblings at `depth` (1 = top level).
    fn level(&mut self, siblings: &[Located<'a>], depth: usize) {
        for (index, &(file, d)) in siblings.iter().enumerate() {
            let label = label(d);
            let below = if d.children.is_empty() {
                ""
            } else {
                " (nor is anything under it)"
            };
            if depth > self.max_entries {
                self.warn(
                    file,
                    d.at,
                    format!(
                        "descriptor `{label}` is at depth {depth}, but a request descriptor carries at most {} entries (--max-entries): it is never matched{below}",
                        self.max_entries
                    ),
                );
                continue;
            }
            if let Some((shadow_file, shadow)) = shadowed_by(siblings, index) {
                let at = place(file, shadow_file, shadow.at);
                let message = match Pattern::parse(d.value.as_deref()) {
                    Pattern::Any => format!(
                        "descriptor `{label}` (any value) is never matched: the wildcard `{}` at {at} matches every value first{below}",
                        self::label(shadow)
                    ),
                    _ => format!(
                        "wildcard `{label}` is never matched: the earlier wildcard `{}` at {at} matches every value it would{below}",
                        self::label(shadow)
                    ),
                };
                self.warn(file, d.at, message);
                continue;
            }
            if d.rule.is_none() && d.children.is_empty() {
                self.warn(
                    file,
                    d.at,
                    format!(
                        "descriptor `{label}` has no `rate_limit` and no `descriptors`: requests it matches are never limited (write `rate_limit: {{unlimited: true}}` to say so)"
                    ),
                );
            }
            if let Some(rule) = &d.rule {
                if let (Some(at), Some(_), true) =
                    (rule.lease_at, rule.lease, rule.quota_mode || self.quota_all)
                {
                    let why = if rule.quota_mode {
                        "`quota_mode: true`"
                    } else {
                        "--quota-mode"
                    };
                    self.warn(
                        file,
                        at,
                        format!(
                            "`lease` is ignored on a quota-mode rule ({why}): whether its hit is taken depends on the request's other quota descriptors, so every hit goes to the backend"
                        ),
                    );
                }
                for target in &rule.replaces {
                    if !self.names.contains(target.as_str()) {
                        self.warn(
                            file,
                            d.at,
                            format!(
                                "`replaces` names `{target}`, but no rate_limit of this domain has that name"
                            ),
                        );
                    }
                }
            }
            let children: Vec<Located> = d.children.iter().map(|c| (file, c)).collect();
            self.level(&children, depth + 1);
        }
    }

    fn warn(&mut self, file: &str, at: Pos, message: String) {
        self.out.push(Diagnostic {
            file: file.to_owned(),
            line: at.line,
            column: at.column,
            message,
        });
    }
}

/// The sibling that always wins over `siblings[index]` for every value it could match:
/// an earlier wildcard that matches everything this one does (a prefix wildcard whose prefix
/// starts this one's first literal part, e.g. `a*` before `ab*` or `ab*c`), or (for a bare key) a
/// lone `*`. Exact values are tried first and are never shadowed.
fn shadowed_by<'a>(siblings: &[Located<'a>], index: usize) -> Option<Located<'a>> {
    let (_, d) = siblings[index];
    let same_key = |(_, other): &&Located<'a>| other.key == d.key;
    match Pattern::parse(d.value.as_deref()) {
        Pattern::Exact(_) => None,
        Pattern::Prefix(prefix) => earlier_prefix_covering(&siblings[..index], &d.key, prefix),
        Pattern::Glob(text) => {
            let first = text.split('*').next().unwrap_or_default();
            earlier_prefix_covering(&siblings[..index], &d.key, first)
        }
        Pattern::Any => siblings.iter().filter(same_key).find_map(|s| {
            (Pattern::parse(s.1.value.as_deref()) == Pattern::Prefix("")).then_some(*s)
        }),
    }
}

/// The first of `earlier` with `key` that is a prefix wildcard whose prefix starts `start`: it
/// matches every value that begins with `start`.
fn earlier_prefix_covering<'a>(
    earlier: &[Located<'a>],
    key: &str,
    start: &str,
) -> Option<Located<'a>> {
    earlier
        .iter()
        .find_map(|s| match Pattern::parse(s.1.value.as_deref()) {
            Pattern::Prefix(p) if s.1.key == key && start.starts_with(p) => Some(*s),
            _ => None,
        })
}

fn collect_names<'a>(descriptors: &'a [DescriptorSpec], names: &mut HashSet<&'a str>) {
    for d in descriptors {
        for name in d.limits().filter_map(|r| r.name.as_deref()) {
            names.insert(name);
        }
        collect_names(&d.children, names);
    }
}

fn label(d: &DescriptorSpec) -> String {
    match &d.value {
        Some(value) => format!("{}={value}", d.key),
        None => d.key.clone(),
    }
}

/// `line N` within the same file, `file:N` across files of a merged domain.
fn place(file: &str, other_file: &str, at: Pos) -> String {
    if file == other_file {
        format!("line {}", at.line)
    } else {
        format!("{other_file}:{}", at.line)
    }
}
