//! The compiled descriptor tree of one domain: request entries → the rule they reach.
//!
//! Built once per config load. A lookup walks one level per request entry with hash lookups keyed
//! by the request's own `&str`s, so it allocates nothing.
//!
//! Matching is envoyproxy/ratelimit's: at each level try the exact `key`+`value` node, else the
//! first wildcard node of that key (config order) whose prefix starts the value, else the bare-key
//! node. A node's rule applies only when the request's last entry lands on it; a node reached
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
    /// A value ending in `*`: any value starting with the part before it (`*` alone: any value,
    /// tried before the bare key).
    Prefix(&'a str),
}

impl<'a> Pattern<'a> {
    /// Reads a configured value. Only a trailing `*` is special; a `*` elsewhere is literal.
    pub fn parse(value: Option<&'a str>) -> Pattern<'a> {
        match value {
            None => Pattern::Any,
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => Pattern::Prefix(prefix),
                None => Pattern::Exact(v),
            },
        }
    }
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
    /// Prefix (without the `*`) and node, in config order.
    wildcards: Vec<(Box<str>, Node)>,
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
            Pattern::Prefix(prefix) if nodes.wildcards.iter().any(|(p, _)| **p == *prefix) => {
                return Err(Duplicate);
            }
            Pattern::Prefix(prefix) => nodes.wildcards.push((prefix.into(), node)),
        }
        Ok(())
    }

    /// The node one entry selects at this level.
    pub fn select(&self, entry: &Entry) -> Option<&Node> {
        let nodes = self.keys.get(entry.key.as_str())?;
        nodes
            .exact
            .get(entry.value.as_str())
            .or_else(|| {
                nodes
                    .wildcards
                    .iter()
                    .find(|(prefix, _)| entry.value.starts_with(&**prefix))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{Limit, RateLimit, RuleId, Unit};

    fn rule(id: u32, path: &str) -> Arc<Rule> {
        Arc::new(Rule {
            id: RuleId(id),
            domain: "d".into(),
            path: path.into(),
            name: None,
            limit: Limit::Bucket(RateLimit {
                requests_per_unit: 1,
                unit: Unit::Second,
                burst: None,
            }),
            shadow_mode: false,
            detailed_metric: false,
            cost: 1,
            failure_mode: None,
            replaces: Vec::new(),
            source: "t:1".into(),
        })
    }

    fn leaf(id: u32, path: &str) -> Node {
        Node::new(Some(rule(id, path)), Level::default())
    }

    fn found(level: &Level, entries: &[(&str, &str)]) -> Option<String> {
        let entries: Vec<Entry> = entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
        level.find(&entries).map(|r| r.path.to_string())
    }

    #[test]
    fn pattern_only_trailing_star_is_special() {
        assert_eq!(Pattern::parse(None), Pattern::Any);
        assert_eq!(Pattern::parse(Some("a")), Pattern::Exact("a"));
        assert_eq!(Pattern::parse(Some("a*")), Pattern::Prefix("a"));
        assert_eq!(Pattern::parse(Some("*")), Pattern::Prefix(""));
        assert_eq!(Pattern::parse(Some("a*b")), Pattern::Exact("a*b"));
    }

    #[test]
    fn exact_then_first_wildcard_then_bare() {
        let mut top = Level::default();
        top.insert("k", Pattern::Any, leaf(0, "bare")).unwrap();
        top.insert("k", Pattern::Prefix("ab"), leaf(1, "ab*"))
            .unwrap();
        top.insert("k", Pattern::Prefix("a"), leaf(2, "a*"))
            .unwrap();
        top.insert("k", Pattern::Exact("abc"), leaf(3, "abc"))
            .unwrap();
        assert_eq!(found(&top, &[("k", "abc")]).as_deref(), Some("abc"));
        // "ab*" comes first in config order, although "a*" also matches.
        assert_eq!(found(&top, &[("k", "abd")]).as_deref(), Some("ab*"));
        assert_eq!(found(&top, &[("k", "ax")]).as_deref(), Some("a*"));
        assert_eq!(found(&top, &[("k", "zz")]).as_deref(), Some("bare"));
        assert_eq!(found(&top, &[("other", "abc")]), None);
        assert_eq!(found(&top, &[]), None);
    }

    #[test]
    fn wildcards_match_in_config_order() {
        let mut top = Level::default();
        top.insert("k", Pattern::Prefix("a"), leaf(0, "a*"))
            .unwrap();
        top.insert("k", Pattern::Prefix("ab"), leaf(1, "ab*"))
            .unwrap();
        // The broader wildcard, listed first, shadows the narrower one.
        assert_eq!(found(&top, &[("k", "abc")]).as_deref(), Some("a*"));
    }

    #[test]
    fn lone_star_matches_every_value_before_the_bare_key() {
        let mut top = Level::default();
        top.insert("k", Pattern::Any, leaf(0, "bare")).unwrap();
        top.insert("k", Pattern::Prefix(""), leaf(1, "star"))
            .unwrap();
        assert_eq!(found(&top, &[("k", "anything")]).as_deref(), Some("star"));
        assert_eq!(found(&top, &[("k", "")]).as_deref(), Some("star"));
    }

    #[test]
    fn depth_must_match_both_ways() {
        let mut children = Level::default();
        children.insert("b", Pattern::Any, leaf(1, "a.b")).unwrap();
        let mut top = Level::default();
        top.insert("a", Pattern::Any, Node::new(Some(rule(0, "a")), children))
            .unwrap();
        top.insert("x", Pattern::Any, leaf(2, "x")).unwrap();
        assert_eq!(found(&top, &[("a", "1")]).as_deref(), Some("a"));
        assert_eq!(
            found(&top, &[("a", "1"), ("b", "2")]).as_deref(),
            Some("a.b")
        );
        // Request deeper than the config.
        assert_eq!(found(&top, &[("a", "1"), ("b", "2"), ("c", "3")]), None);
        assert_eq!(found(&top, &[("x", "1"), ("b", "2")]), None);
        // Rule deeper than the request: a pure tree node has no rule of its own.
        let mut inner = Level::default();
        inner.insert("b", Pattern::Any, leaf(3, "p.b")).unwrap();
        let mut top = Level::default();
        top.insert("p", Pattern::Any, Node::new(None, inner))
            .unwrap();
        assert_eq!(found(&top, &[("p", "1")]), None);
        assert_eq!(
            found(&top, &[("p", "1"), ("b", "2")]).as_deref(),
            Some("p.b")
        );
    }

    #[test]
    fn no_backtracking_to_a_less_specific_node() {
        let mut children = Level::default();
        children.insert("b", Pattern::Any, leaf(1, "a.b")).unwrap();
        let mut top = Level::default();
        top.insert("a", Pattern::Exact("v"), leaf(0, "a_v"))
            .unwrap();
        top.insert("a", Pattern::Any, Node::new(None, children))
            .unwrap();
        assert_eq!(
            found(&top, &[("a", "w"), ("b", "1")]).as_deref(),
            Some("a.b")
        );
        // The exact node wins at level one and has no children, so the walk ends there.
        assert_eq!(found(&top, &[("a", "v"), ("b", "1")]), None);
    }

    #[test]
    fn duplicates_are_refused() {
        let mut top = Level::default();
        top.insert("k", Pattern::Any, leaf(0, "a")).unwrap();
        top.insert("k", Pattern::Exact("v"), leaf(1, "b")).unwrap();
        top.insert("k", Pattern::Prefix("v"), leaf(2, "c")).unwrap();
        assert_eq!(top.insert("k", Pattern::Any, leaf(3, "d")), Err(Duplicate));
        assert_eq!(
            top.insert("k", Pattern::Exact("v"), leaf(4, "e")),
            Err(Duplicate)
        );
        assert_eq!(
            top.insert("k", Pattern::Prefix("v"), leaf(5, "f")),
            Err(Duplicate)
        );
    }
}
