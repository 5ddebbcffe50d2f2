//! The raw model: one struct per mapping of the schema, every field optional and located.
//!
//! Reading checks shape only — known field names, and that each field is a string, boolean,
//! integer, list or mapping as the schema says — and reports every problem it meets instead of
//! stopping. What values mean (units, ranges, duplicates, references) is checked in `validate`.
//!
//! A new optional field (say `shards` under `rate_limit`) is one struct member, one name in the
//! mapping's field list and one line in its reader.

use super::Sink;
use super::yaml::{Kind, Node, Pos, Typed};

/// A value read from the source, with the positions of its field name and of the value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sp<T> {
    pub value: T,
    /// Position of the value.
    pub at: Pos,
    /// Position of the field name (equal to `at` for list items).
    pub key_at: Pos,
}

/// An optional field. `Invalid` was present but had the wrong shape and has been reported, so
/// later checks neither use it nor call it missing.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) enum Field<T> {
    #[default]
    Absent,
    Invalid,
    Given(Sp<T>),
}

impl<T> Field<T> {
    pub fn given(&self) -> Option<&Sp<T>> {
        match self {
            Field::Given(sp) => Some(sp),
            _ => None,
        }
    }

    pub fn is_absent(&self) -> bool {
        matches!(self, Field::Absent)
    }

    /// Present in the source, whether or not it was well-formed.
    pub fn is_present(&self) -> bool {
        !self.is_absent()
    }
}

/// One config file: one domain.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RawDomain {
    pub at: Pos,
    pub domain: Field<String>,
    pub failure_mode: Field<String>,
    pub algorithm: Field<String>,
    pub charge: Field<String>,
    pub descriptors: Vec<RawDescriptor>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RawDescriptor {
    pub at: Pos,
    pub key: Field<String>,
    pub value: Field<String>,
    pub rate_limit: Field<RawRateLimit>,
    /// Several limits on one descriptor, all enforced (a sluice extension); each item has the
    /// shape of a `rate_limit`. `Absent` when not written.
    pub rate_limits: Field<Vec<Sp<RawRateLimit>>>,
    pub in_flight: Field<RawInFlight>,
    /// `reserve`: reservations on the descriptor's `rate_limit` (`max` is never read).
    pub reserve: Field<RawInFlight>,
    pub shadow_mode: Field<bool>,
    pub quota_mode: Field<bool>,
    pub detailed_metric: Field<bool>,
    pub cost: Field<i128>,
    pub charge: Field<String>,
    pub failure_mode: Field<String>,
    pub share_threshold: Field<bool>,
    pub value_to_metric: Field<bool>,
    /// envoyproxy/ratelimit's free-form `metadata`, as JSON.
    pub metadata: Field<serde_json::Value>,
    pub descriptors: Vec<RawDescriptor>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RawRateLimit {
    pub unit: Field<String>,
    pub unit_multiplier: Field<i128>,
    pub requests_per_unit: Field<i128>,
    pub burst: Field<i128>,
    pub lease: Field<i128>,
    pub shards: Field<i128>,
    pub algorithm: Field<String>,
    pub name: Field<String>,
    pub unlimited: Field<bool>,
    pub replaces: Vec<RawReplace>,
}

/// `in_flight`: a cap on requests in flight instead of a `rate_limit`.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RawInFlight {
    pub max: Field<i128>,
    pub holder: Field<String>,
    pub max_hold: Field<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RawReplace {
    pub at: Pos,
    pub name: Field<String>,
}

const DOMAIN_FIELDS: &[&str] = &[
    "domain",
    "failure_mode",
    "algorithm",
    "charge",
    "descriptors",
];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "cost",
    "charge",
    "failure_mode",
    "share_threshold",
    "value_to_metric",
    "metadata",
    "in_flight",
    "reserve",
];
const RATE_LIMIT_FIELDS: &[&str] = &[
    "unit",
    "unit_multiplier",
    "requests_per_unit",
    "burst",
    "lease",
    "shards",
    "algorithm",
    "name",
    "unlimited",
    "replaces",
];
const REPLACE_FIELDS: &[&str] = &["name"];
const IN_FLIGHT_FIELDS: &[&str] = &["max", "holder", "max_hold"];
const RESERVE_FIELDS: &[&str] = &["holder", "max_hold"];

/// Every field name envoyproxy/ratelimit accepts. It checks names, not places: one of these in a
/// mapping where it means nothing (`unit` on a descriptor) loads there and is ignored, so sluice
/// warns instead of refusing a config the reference loads.
const ENVOY_FIELDS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// Reads a document's root mapping; `None` (reported) when it is not one.
pub(crate) fn read_domain(doc: &Node, sink: &mut Sink) -> Option<RawDomain> {
    let fields = Fields::read(doc, "the config file", DOMAIN_FIELDS, sink)?;
    Some(RawDomain {
        at: doc.at,
        domain: fields.string("domain", sink),
        failure_mode: fields.string("failure_mode", sink),
        algorithm: fields.string("algorithm", sink),
        charge: fields.string("charge", sink),
        descriptors: fields.descriptors(sink),
    })
}

fn read_descriptor(node: &Node, sink: &mut Sink) -> Option<RawDescriptor> {
    let fields = Fields::read(node, "a descriptor", DESCRIPTOR_FIELDS, sink)?;
    Some(RawDescriptor {
        at: node.at,
        key: fields.string("key", sink),
        value: fields.string("value", sink),
        rate_limit: fields.rate_limit(sink),
        rate_limits: fields.rate_limits(sink),
        in_flight: fields.in_flight(sink),
        reserve: fields.reserve(sink),
        shadow_mode: fields.boolean("shadow_mode", sink),
        quota_mode: fields.boolean("quota_mode", sink),
        detailed_metric: fields.boolean("detailed_metric", sink),
        cost: fields.integer("cost", sink),
        charge: fields.string("charge", sink),
        failure_mode: fields.string("failure_mode", sink),
        share_threshold: fields.boolean("share_threshold", sink),
        value_to_metric: fields.boolean("value_to_metric", sink),
        metadata: fields.json("metadata", sink),
        descriptors: fields.descriptors(sink),
    })
}

fn read_rate_limit(fields: &Fields, sink: &mut Sink) -> RawRateLimit {
    RawRateLimit {
        unit: fields.string("unit", sink),
        unit_multiplier: fields.integer("unit_multiplier", sink),
        requests_per_unit: fields.integer("requests_per_unit", sink),
        burst: fields.integer("burst", sink),
        lease: fields.integer("lease", sink),
        shards: fields.integer("shards", sink),
        algorithm: fields.string("algorithm", sink),
        name: fields.string("name", sink),
        unlimited: fields.boolean("unlimited", sink),
        replaces: fields
            .list("replaces", sink)
            .iter()
            .filter_map(|item| {
                let entry = Fields::read(item, "a `replaces` entry", REPLACE_FIELDS, sink)?;
                Some(RawReplace {
                    at: item.at,
                    name: entry.string("name", sink),
                })
            })
            .collect(),
    }
}

/// The known fields of one mapping, after unknown ones have been reported.
struct Fields<'n> {
    entries: Vec<(&'static str, &'n Node, &'n Node)>,
}

impl<'n> Fields<'n> {
    /// `what` names the mapping in messages ("a descriptor"). Reports a non-mapping and unknown
    /// fields.
    fn read(
        node: &'n Node,
        what: &str,
        allowed: &[&'static str],
        sink: &mut Sink,
    ) -> Option<Fields<'n>> {
        let Kind::Map(pairs) = &node.kind else {
            sink.error(
                node.at,
                format!("{what} must be a mapping, got {}", node.describe()),
            );
            return None;
        };
        let mut entries = Vec::with_capacity(pairs.len());
        for (key, value) in pairs {
            let Some(name) = key.scalar().filter(|s| s.typed != Typed::Null) else {
                sink.error(
                    key.at,
                    format!(
                        "field names must be plain strings, got {} in {what}",
                        key.describe()
                    ),
                );
                continue;
            };
            let name = name.text.as_str();
            match allowed.iter().find(|a| **a == name) {
                Some(known) => entries.push((*known, key, value)),
                None if ENVOY_FIELDS.contains(&name) => sink
                    .warn(
                        key.at,
                        format!(
                            "field `{name}` has no effect in {what} and is ignored (envoyproxy/ratelimit ignores it there too); expected one of: {}",
                            allowed.join(", ")
                        ),
                    ),
                None => sink.error(
                    key.at,
                    format!(
                        "unknown field `{}` in {what}; expected one of: {}",
                        name,
                        allowed.join(", ")
                    ),
                ),
            }
        }
        Some(Fields { entries })
    }

    /// The field, unless absent or null (YAML `name:` with nothing after it means "not given",
    /// as in envoyproxy/ratelimit).
    fn get(&self, name: &str) -> Option<(&'n Node, &'n Node)> {
        self.entries
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, k, v)| (*k, *v))
            .filter(|(_, v)| !v.is_null())
    }

    fn located<T>(value: T, key: &Node, node: &Node) -> Field<T> {
        Field::Given(Sp {
            value,
            at: node.at,
            key_at: key.at,
        })
    }

    /// Any scalar, as written: Go's yaml.v2 reads `value: 200` or `value: on` into a string field
    /// as its text, and configs rely on that.
    fn string(&self, name: &str, sink: &mut Sink) -> Field<String> {
        let Some((key, node)) = self.get(name) else {
            return Field::Absent;
        };
        match node.scalar() {
            Some(s) => Self::located(s.text.clone(), key, node),
            None => {
                sink.error(
                    node.at,
                    format!("`{name}` must be a string, got {}", node.describe()),
                );
                Field::Invalid
            }
        }
    }

    fn boolean(&self, name: &str, sink: &mut Sink) -> Field<bool> {
        let Some((key, node)) = self.get(name) else {
            return Field::Absent;
        };
        match node.scalar().map(|s| s.typed) {
            Some(Typed::Bool(b)) => Self::located(b, key, node),
            _ => {
                sink.error(
                    node.at,
                    format!("`{name}` must be true or false, got {}", node.describe()),
                );
                Field::Invalid
            }
        }
    }

    /// Any YAML value as JSON (mappings with scalar keys, sequences, scalars by their YAML type).
    fn json(&self, name: &str, sink: &mut Sink) -> Field<serde_json::Value> {
        let Some((key, node)) = self.get(name) else {
            return Field::Absent;
        };
        match to_json(node) {
            Ok(value) => Self::located(value, key, node),
            Err(at) => {
                sink.error(at, format!("`{name}`: mapping keys must be plain strings"));
                Field::Invalid
            }
        }
    }

    fn integer(&self, name: &str, sink: &mut Sink) -> Field<i128> {
        let Some((key, node)) = self.get(name) else {
            return Field::Absent;
        };
        match node.scalar().map(|s| s.typed) {
            Some(Typed::Int(i)) => Self::located(i, key, node),
            _ => {
                sink.error(
                    node.at,
                    format!("`{name}` must be an integer, got {}", node.describe()),
                );
                Field::Invalid
            }
        }
    }

    fn list(&self, name: &str, sink: &mut Sink) -> &'n [Node] {
        let Some((_, node)) = self.get(name) else {
            return &[];
        };
        match &node.kind {
            Kind::Seq(items) => items,
            _ => {
                sink.error(
                    node.at,
                    format!("`{name}` must be a list, got {}", node.describe()),
                );
                &[]
            }
        }
    }

    fn descriptors(&self, sink: &mut Sink) -> Vec<RawDescriptor> {
        self.list("descriptors", sink)
            .iter()
            .filter_map(|item| read_descriptor(item, sink))
            .collect()
    }

    /// Unlike other fields, an empty `rate_limit:` is not "absent": a limit left blank is far more
    /// likely a mistake than a wish for no limit, so it is read as an empty mapping and then
    /// reported as missing its unit and rate.
    fn rate_limit(&self, sink: &mut Sink) -> Field<RawRateLimit> {
        let Some((_, key, node)) = self.entries.iter().find(|(n, _, _)| *n == "rate_limit") else {
            return Field::Absent;
        };
        if node.is_null() {
            return Self::located(RawRateLimit::default(), key, node);
        }
        match Fields::read(node, "`rate_limit`", RATE_LIMIT_FIELDS, sink) {
            Some(fields) => Self::located(read_rate_limit(&fields, sink), key, node),
            None => Field::Invalid,
        }
    }
}

impl Fields<'_> {
    /// `rate_limits`: a list of `rate_limit`-shaped mappings (each item located at itself).
    fn rate_limits(&self, sink: &mut Sink) -> Field<Vec<Sp<RawRateLimit>>> {
        let Some((key, node)) = self.get("rate_limits") else {
            return Field::Absent;
        };
        if !matches!(node.kind, Kind::Seq(_)) {
            sink.error(
                node.at,
                format!("`rate_limits` must be a list, got {}", node.describe()),
            );
            return Field::Invalid;
        }
        let items = self
            .list("rate_limits", sink)
            .iter()
            .filter_map(|item| {
                let fields = Fields::read(item, "a `rate_limits` entry", RATE_LIMIT_FIELDS, sink)?;
                Some(Sp {
                    value: read_rate_limit(&fields, sink),
                    at: item.at,
                    key_at: item.at,
                })
            })
            .collect();
        Self::located(items, key, node)
    }

    fn in_flight(&self, sink: &mut Sink) -> Field<RawInFlight> {
        self.holding("in_flight", IN_FLIGHT_FIELDS, sink)
    }

    fn reserve(&self, sink: &mut Sink) -> Field<RawInFlight> {
        self.holding("reserve", RESERVE_FIELDS, sink)
    }

    /// `in_flight` or `reserve`: a holder entry and a longest hold (and a cap, for `in_flight`).
    fn holding(&self, name: &str, allowed: &[&'static str], sink: &mut Sink) -> Field<RawInFlight> {
        let Some((key, node)) = self.get(name) else {
            return Field::Absent;
        };
        let what = format!("`{name}`");
        match Fields::read(node, &what, allowed, sink) {
            Some(fields) => Self::located(
                RawInFlight {
                    max: if allowed.contains(&"max") {
                        fields.integer("max", sink)
                    } else {
                        Field::Absent
                    },
                    holder: fields.string("holder", sink),
                    max_hold: fields.string("max_hold", sink),
                },
                key,
                node,
            ),
            None => Field::Invalid,
        }
    }
}

/// A YAML node as JSON; `Err` holds the place of a mapping key that is not a scalar.
fn to_json(node: &Node) -> Result<serde_json::Value, Pos> {
    use serde_json::Value;
    Ok(match &node.kind {
        Kind::Scalar(s) => match s.typed {
            Typed::Null => Value::Null,
            Typed::Bool(b) => Value::Bool(b),
            Typed::Int(i) => i64::try_from(i)
                .map(Value::from)
                .unwrap_or_else(|_| Value::from(i as f64)),
            Typed::Float(f) => serde_json::Number::from_f64(f)
                .map(Value::Number)
                .unwrap_or_else(|| Value::String(s.text.clone())),
            Typed::Str => Value::String(s.text.clone()),
        },
        Kind::Seq(items) => Value::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        Kind::Map(pairs) => {
            let mut map = serde_json::Map::new();
            for (k, v) in pairs {
                let key = k.scalar().ok_or(k.at)?;
                map.insert(key.text.clone(), to_json(v)?);
            }
            Value::Object(map)
        }
    })
}
