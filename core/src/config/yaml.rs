//! A located YAML tree: every node knows its line and column, and every plain scalar keeps its
//! source spelling.
//!
//! The config is read through this generic tree instead of straight into serde structs because
//! serde stops at the first problem, while `check-config` must report every problem of every file.
//! The spelling is kept because envoyproxy/ratelimit (Go, yaml.v2) reads a string field's text
//! as written: `value: on` is the string "on", `value: 1.50` is "1.50", not `true` or "1.5".

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{MessageFormatter, Spanned};

/// A place in a source: 1-based line and column (in characters). `0:0` means unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Pos {
    pub line: usize,
    pub column: usize,
}

impl Pos {
    pub const fn new(line: usize, column: usize) -> Pos {
        Pos { line, column }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Node {
    /// Where the node is used (for an alias, the alias itself, not its anchor).
    pub at: Pos,
    pub kind: Kind,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Kind {
    Scalar(Scalar),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Scalar {
    /// A string's value; for a null, boolean or number, its spelling in the source.
    pub text: String,
    pub typed: Typed,
}

/// What YAML's implicit typing made of a scalar.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Typed {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str,
}

impl Node {
    pub fn scalar(&self) -> Option<&Scalar> {
        match &self.kind {
            Kind::Scalar(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(
            &self.kind,
            Kind::Scalar(Scalar {
                typed: Typed::Null,
                ..
            })
        )
    }

    /// A short description for "got ..." in messages.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Scalar(s) => format!("`{}`", s.text),
            Kind::Seq(_) => "a list".to_owned(),
            Kind::Map(_) => "a mapping".to_owned(),
        }
    }
}

/// A YAML problem that stops reading a source (syntax, duplicate mapping key, alias limits).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub at: Pos,
    pub message: String,
}

/// Parses every document of `src`. Empty documents (only comments, or nothing) are skipped.
pub(crate) fn parse(src: &str) -> Result<Vec<Node>, SyntaxError> {
    let docs: Vec<Spanned<Tree>> = serde_saphyr::from_str_multiple(src).map_err(|e| {
        let at = e
            .location()
            .map(|l| Pos::new(l.line() as usize, l.column() as usize))
            .unwrap_or_default();
        let message = serde_saphyr::DefaultMessageFormatter.format_message(e.without_snippet());
        SyntaxError {
            at,
            message: message.into_owned(),
        }
    })?;
    Ok(docs.into_iter().map(|d| located(d, src)).collect())
}

/// Keeps a message on one line and free of terminal control sequences: messages quote config text,
/// and serde-saphyr documents that its formatter's text is not sanitised.
pub(crate) fn escape_controls(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for c in message.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// What serde-saphyr hands over: values without their spelling, children wrapped in spans.
#[derive(Debug)]
enum Tree {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Tree>>),
    Map(Vec<(Spanned<Tree>, Spanned<Tree>)>),
}

fn located(spanned: Spanned<Tree>, src: &str) -> Node {
    let at = Pos::new(
        spanned.referenced.line() as usize,
        spanned.referenced.column() as usize,
    );
    // The spelling lives where the value is defined (an anchor, for an alias).
    let span = spanned.defined.span();
    let spelling = || -> Option<String> {
        let start = usize::try_from(span.byte_offset()?).ok()?;
        let len = usize::try_from(span.byte_len()?).ok()?;
        src.get(start..start.checked_add(len)?).map(str::to_owned)
    };
    let scalar = |typed: Typed, fallback: String| {
        Kind::Scalar(Scalar {
            text: spelling().unwrap_or(fallback),
            typed,
        })
    };
    let kind = match spanned.value {
        Tree::Null => scalar(Typed::Null, String::new()),
        Tree::Bool(b) => scalar(Typed::Bool(b), b.to_string()),
        Tree::Int(i) => scalar(Typed::Int(i), i.to_string()),
        Tree::Float(f) => scalar(Typed::Float(f), f.to_string()),
        Tree::Str(text) => Kind::Scalar(Scalar {
            text,
            typed: Typed::Str,
        }),
        Tree::Seq(items) => Kind::Seq(items.into_iter().map(|n| located(n, src)).collect()),
        Tree::Map(entries) => Kind::Map(
            entries
                .into_iter()
                .map(|(k, v)| (located(k, src), located(v, src)))
                .collect(),
        ),
    };
    Node { at, kind }
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_none<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Tree, D::Error> {
        deserializer.deserialize_any(TreeVisitor)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Tree, E> {
        Ok(Tree::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Tree, E> {
        Ok(Tree::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Tree, E> {
        Ok(Tree::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Tree, E> {
        Ok(Tree::Int(v))
    }
    fn visit_u128<E>(self, v: u128) -> Result<Tree, E> {
        Ok(i128::try_from(v).map_or(Tree::Float(v as f64), Tree::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Tree, E> {
        Ok(Tree::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Tree, E> {
        Ok(Tree::Str(v))
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Tree, E> {
        String::from_utf8(v.to_vec())
            .map(Tree::Str)
            .map_err(|_| E::custom("binary value is not UTF-8 text"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Tree::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key()? {
            entries.push((key, map.next_value()?));
        }
        Ok(Tree::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(src: &str) -> Node {
        let mut docs = parse(src).expect("parses");
        assert_eq!(docs.len(), 1);
        docs.remove(0)
    }

    fn entries(node: &Node) -> &[(Node, Node)] {
        match &node.kind {
            Kind::Map(e) => e,
            other => panic!("not a map: {other:?}"),
        }
    }

    #[test]
    fn scalars_keep_their_spelling_and_position() {
        let doc = one("a: on\nb: 1.50\nc: 0x1F\nd: \"q\\tx\"\ne:\nf: -3\n");
        let e = entries(&doc);
        let text = |i: usize| e[i].1.scalar().unwrap().text.as_str();
        let typed = |i: usize| e[i].1.scalar().unwrap().typed;
        assert_eq!((text(0), typed(0)), ("on", Typed::Bool(true)));
        assert_eq!((text(1), typed(1)), ("1.50", Typed::Float(1.5)));
        assert_eq!((text(2), typed(2)), ("0x1F", Typed::Int(31)));
        assert_eq!((text(3), typed(3)), ("q\tx", Typed::Str));
        assert!(e[4].1.is_null());
        assert_eq!(typed(5), Typed::Int(-3));
        assert_eq!(e[1].0.at, Pos::new(2, 1));
        assert_eq!(e[1].1.at, Pos::new(2, 4));
    }

    #[test]
    fn aliases_point_at_their_use() {
        let doc = one("a: &x {u: 1}\nb: *x\n");
        let e = entries(&doc);
        assert_eq!(e[1].1.at, Pos::new(2, 4));
        assert_eq!(entries(&e[1].1)[0].0.scalar().unwrap().text, "u");
    }

    #[test]
    fn empty_documents_are_skipped() {
        assert!(parse("").unwrap().is_empty());
        assert!(parse("# only a comment\n").unwrap().is_empty());
        assert_eq!(parse("a: 1\n---\nb: 2\n").unwrap().len(), 2);
    }

    #[test]
    fn syntax_errors_are_located() {
        let err = parse("a: 1\nb: [1\n").unwrap_err();
        assert_eq!(err.at.line, 2);
        assert!(err.message.contains("bracket"), "{}", err.message);

        let err = parse("a: 1\na: 2\n").unwrap_err();
        assert_eq!(err.at, Pos::new(2, 1));
        assert!(err.message.contains("duplicate"), "{}", err.message);
    }
}
