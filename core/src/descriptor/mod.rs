//! The compiled descriptor tree of one domain: request entries → the rule they reach.
//!
//! Built once per config load. A lookup walks one level per request entry with hash lookups keyed
//! by the request's own `&str`s, so it allocates nothing. Configured values are UTF-8; request
//! values are bytes and match byte-wise: a value that is not UTF-8 equals no exact value and may
//! match a wildcard (`abc\xff` matches `abc*`).
//!
//! Matching is envoyproxy/ratelimit's: at each level try the exact `key`+`value` node, else the
//! first wildcard node of that key (config order) whose pattern matches the value, else the
//! bare-key node. In a wildcard every `*` matches zero or more characters, in order (`a*`, `*`,
//! `bar*b`, `foo*bar*baz`); the common shapes stay cheap: an exact value is a hash lookup and a
//! trailing `*` a prefix test. A node's rule applies only when the request's last entry lands on it; a node reached
//! earlier leads on through its children, and a node without children ends the walk with no
//! match. There is no backtracking: a more specific node that leads nowhere hides a less specific
//! one that would have.

use std::collections::HashMap;
use std::sync::Arc;

use crate::request::Entry;
use crate::rule::Rule;

/// How a configured descriptor's `value` matches a request value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern<'a> {
    /// No `value`: any value.
    Any,
    /// A literal value.
    Exact(&'a str),
    /// A value whose only `*` is its last character: any value starting with the part before it
    /// (`*` alone: any value, tried before the bare key).
    Prefix(&'a str),
    /// Any other value holding a `*` (the whole configured value): each `*` matches zero or more
    /// characters, the literal parts between them appear in order.
    Glob(&'a str),
}

impl<'a> Pattern<'a> {
    /// Reads a configured value.
    pub fn parse(value: Option<&'a str>) -> Pattern<'a> {
        match value {
            None => Pattern::Any,
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) if !prefix.contains('*') => Pattern::Prefix(prefix),
                _ if v.contains('*') => Pattern::Glob(v),
                _ => Pattern::Exact(v),
            },
        }
    }
}

/// A compiled wildcard value.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Wildcard {
    /// The part before a single trailing `*`.
    Prefix(Box<str>),
    /// The configured value and its literal parts, split on `*` once at load.
    Glob {
        text: Box<str>,
        parts: Box<[Box<str>]>,
    },
}

impl Wildcard {
    fn new(pattern: Pattern<'_>) -> Option<Wildcard> {
        match pattern {
            Pattern::Prefix(prefix) => Some(Wildcard::Prefix(prefix.into())),
            Pattern::Glob(text) => Some(Wildcard::Glob {
                text: text.into(),
                parts: text.split('*').map(Box::from).collect(),
            }),
            Pattern::Any | Pattern::Exact(_) => None,
        }
    }

    /// The configured value, `*`s included.
    fn text(&self) -> String {
        match self {
            Wildcard::Prefix(prefix) => format!("{prefix}*"),
            Wildcard::Glob { text, .. } => text.to_string(),
        }
    }

    /// Byte-wise: a value need not be UTF-8 (`abc\xff` matches `abc*`).
    fn matches(&self, value: &[u8]) -> bool {
        match self {
            Wildcard::Prefix(prefix) => value.starts_with(prefix.as_bytes()),
            Wildcard::Glob { parts, .. } => glob_matches(parts, value),
        }
    }
}

/// Whether `value` matches the literal `parts` of a pattern split on `*` (at least two parts):
/// it starts with the first, ends with the last, and holds the middle ones in order, none of them
/// overlapping another. Greedy leftmost placement of each middle part is enough: placing a part
/// earlier never leaves less room for the parts after it.
fn glob_matches(parts: &[Box<str>], value: &[u8]) -> bool {
    let (Some((first, rest)), Some(last)) = (parts.split_first(), parts.last()) else {
        return false;
    };
    let Some(middle) = rest.split_last().map(|(_, middle)| middle) else {
        return first.as_bytes() == value;
    };
    let fixed: usize = parts.iter().map(|p| p.len()).sum();
    if value.len() < fixed
        || !value.starts_with(first.as_bytes())
        || !value.ends_with(last.as_bytes())
    {
        return false;
    }
    let mut inner = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match find(inner, part.as_bytes()) {
            Some(at) => inner = &inner[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Where `needle` first occurs in `haystack` (an empty needle: at 0).
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The sibling descriptors under one parent (or at the top of a domain).
#[derive(Debug, Default)]
pub struct Level {
    keys: HashMap<Box<str>, KeyNodes>,
}

/// The nodes of one key at one level, in match order.
#[derive(Debug, Default)]
struct KeyNodes {
    exact: HashMap<Box<str>, Node>,
    /// Wildcard values and their nodes, in config order.
    wildcards: Vec<(Wildcard, Node)>,
    bare: Option<Node>,
}

/// One configured descriptor.
#[derive(Debug, Default)]
pub struct Node {
    rule: Option<Arc<Rule>>,
    children: Level,
}

/// Two configured descriptors with the same key and value at one level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("duplicate descriptor at one level")]
pub struct Duplicate;

impl Node {
    pub fn new(rule: Option<Arc<Rule>>, children: Level) -> Node {
        Node { rule, children }
    }

    pub fn rule(&self) -> Option<&Arc<Rule>> {
        self.rule.as_ref()
    }

    pub fn children(&self) -> &Level {
        &self.children
    }
}

impl Level {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Adds a node; wildcards keep the order they are added in.
    pub fn insert(&mut self, key: &str, pattern: Pattern<'_>, node: Node) -> Result<(), Duplicate> {
        let nodes = self.keys.entry(key.into()).or_default();
        match pattern {
            Pattern::Any if nodes.bare.is_some() => return Err(Duplicate),
            Pattern::Any => nodes.bare = Some(node),
            Pattern::Exact(value) if nodes.exact.contains_key(value) => return Err(Duplicate),
            Pattern::Exact(value) => {
                nodes.exact.insert(value.into(), node);
            }
            Pattern::Prefix(_) | Pattern::Glob(_) => {
                let wildcard = Wildcard::new(pattern).expect("a wildcard pattern");
                if nodes.wildcards.iter().any(|(w, _)| *w == wildcard) {
                    return Err(Duplicate);
                }
                nodes.wildcards.push((wildcard, node));
            }
        }
        Ok(())
    }

    /// The node one entry selects at this level.
    pub fn select(&self, entry: &Entry) -> Option<&Node> {
        let nodes = self.keys.get(entry.key.as_str())?;
        // Configured values are UTF-8: a value that is not equals none of them.
        let value = &entry.value;
        value
            .as_str()
            .and_then(|v| nodes.exact.get(v))
            .or_else(|| {
                nodes
                    .wildcards
                    .iter()
                    .find(|(wildcard, _)| wildcard.matches(value.as_bytes()))
                    .map(|(_, node)| node)
            })
            .or(nodes.bare.as_ref())
    }

    /// The rule a request descriptor's entries reach from this level, if any.
    pub fn find(&self, entries: &[Entry]) -> Option<&Arc<Rule>> {
        let (last, path) = entries.split_last()?;
        let mut level = self;
        for entry in path {
            let node = level.select(entry)?;
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        level.select(last)?.rule.as_ref()
    }
}

/// How one request entry selected a configured descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selected {
    /// The descriptor with exactly this value.
    Exact,
    /// The first wildcard (in config order) that matches the value; holds the configured
    /// value, `*`s included.
    Wildcard(String),
    /// The descriptor with the key and no value.
    AnyValue,
}

/// One entry's step down the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Index of the request entry.
    pub index: usize,
    pub selected: Selected,
}

/// Why a request descriptor reaches no rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Miss {
    /// The request descriptor has no entries.
    NoEntries,
    /// Entry `index` matches no descriptor at its level; `keys` are the keys configured there.
    NoMatch { index: usize, keys: Vec<String> },
    /// Entry `index` reached a descriptor with no nested descriptors, but more entries follow.
    RequestDeeper { index: usize },
    /// The last entry (`index`) reached a descriptor without a `rate_limit` of its own; `keys`
    /// are the keys nested under it, which a longer request would reach.
    NoRule { index: usize, keys: Vec<String> },
}

/// The walk [`Level::find`] makes, step by step, and where it ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation {
    pub steps: Vec<Step>,
    pub outcome: Result<Arc<Rule>, Miss>,
}

impl Explanation {
    pub fn rule(&self) -> Option<&Arc<Rule>> {
        self.outcome.as_ref().ok()
    }
}

impl Level {
    /// Configured keys at this level, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.keys.keys().map(|k| k.to_string()).collect();
        keys.sort_unstable();
        keys
    }

    /// [`Level::select`], also saying how the node was chosen.
    fn select_explained(&self, entry: &Entry) -> Option<(&Node, Selected)> {
        let nodes = self.keys.get(entry.key.as_str())?;
        if let Some(node) = entry.value.as_str().and_then(|v| nodes.exact.get(v)) {
            return Some((node, Selected::Exact));
        }
        if let Some((wildcard, node)) = nodes
            .wildcards
            .iter()
            .find(|(wildcard, _)| wildcard.matches(entry.value.as_bytes()))
        {
            return Some((node, Selected::Wildcard(wildcard.text())));
        }
        nodes.bare.as_ref().map(|node| (node, Selected::AnyValue))
    }

    /// The same walk as [`Level::find`], recorded for operators (`sluice explain`, `GET /explain`).
    /// Off the request path, so it may allocate.
    pub fn explain(&self, entries: &[Entry]) -> Explanation {
        let mut steps = Vec::with_capacity(entries.len());
        let miss = |steps, miss| Explanation {
            steps,
            outcome: Err(miss),
        };
        if entries.is_empty() {
            return miss(steps, Miss::NoEntries);
        }
        let mut level = self;
        for (index, entry) in entries.iter().enumerate() {
            let Some((node, selected)) = level.select_explained(entry) else {
                let keys = level.keys();
                return miss(steps, Miss::NoMatch { index, keys });
            };
            steps.push(Step { index, selected });
            let last = index + 1 == entries.len();
            if last {
                return match &node.rule {
                    Some(rule) => Explanation {
                        steps,
                        outcome: Ok(rule.clone()),
                    },
                    None => {
                        let keys = node.children.keys();
                        miss(steps, Miss::NoRule { index, keys })
                    }
                };
            }
            if node.children.is_empty() {
                return miss(steps, Miss::RequestDeeper { index });
            }
            level = &node.children;
        }
        unreachable!("the last entry returns inside the loop")
    }
}

/// Why an RLQS bucket id reaches no rule ([`Level::place`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unplaced {
    /// Some entries could not all be placed on one path down the tree to a rule; `placed` is the
    /// longest path found (entries in tree order), `left` the keys that found no level.
    NoPath {
        placed: Vec<Entry>,
        left: Vec<String>,
    },
}

impl Level {
    /// Orders an RLQS `BucketId` (an unordered map) into the descriptor it stands for: at each
    /// level, one not-yet-placed entry whose key a descriptor at that level names (and whose
    /// value it matches) is placed, entries tried in key order, backtracking when a choice cannot
    /// place the rest. Every entry must be placed and the last one must reach a rule, so a bucket
    /// id reaches a rule exactly when some ordering of its entries would as an RLS descriptor,
    /// and then the same rule (and so the same storage key). `entries` must have distinct keys,
    /// sorted. The search is bounded by the tree, not by the orders of the entries: entries have
    /// distinct keys, so each path of choices reaches a different node, and each node is visited
    /// at most once — at most (entries × nodes) lookups.
    pub fn place(&self, entries: &[Entry]) -> Result<(Vec<Entry>, Arc<Rule>), Unplaced> {
        let mut search = Search {
            used: vec![false; entries.len()],
            path: Vec::with_capacity(entries.len()),
            best: Vec::new(),
        };
        if let Some(rule) = self.place_from(entries, &mut search) {
            return Ok((search.path, rule));
        }
        let best = search.best;
        let left = entries
            .iter()
            .filter(|e| !best.iter().any(|b| b.key == e.key))
            .map(|e| e.key.clone())
            .collect();
        Err(Unplaced::NoPath { placed: best, left })
    }

    fn place_from(&self, entries: &[Entry], search: &mut Search) -> Option<Arc<Rule>> {
        for i in 0..entries.len() {
            if search.used[i] {
                continue;
            }
            let Some(node) = self.select(&entries[i]) else {
                continue;
            };
            search.used[i] = true;
            search.path.push(entries[i].clone());
            if search.path.len() > search.best.len() {
                search.best.clone_from(&search.path);
            }
            let found = if search.path.len() == entries.len() {
                node.rule.clone()
            } else {
                node.children.place_from(entries, search)
            };
            if found.is_some() {
                return found;
            }
            search.path.pop();
            search.used[i] = false;
        }
        None
    }
}

/// The state of one [`Level::place`] search.
struct Search {
    used: Vec<bool>,
    path: Vec<Entry>,
    best: Vec<Entry>,
}

#[cfg(test)]
mod tests;
