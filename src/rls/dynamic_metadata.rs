//! `RateLimitResponse.dynamic_metadata` as envoyproxy/ratelimit fills it when its
//! `RESPONSE_DYNAMIC_METADATA` is on (sluice: `--response-dynamic-metadata`):
//!
//! - `domain`: the request's domain;
//! - `descriptors`: per request descriptor, `entries` (`"key=value"` strings), `limit` (the
//!   request's own limit override, as text) and `hitsAddend` (the descriptor's) where given;
//! - `hitsAddend`: the request's, when not 0;
//! - `metadata`: the `metadata` of the rules of the descriptors that passed (answered OK and not
//!   `unlimited`), merged in request order — the first one to set a field keeps it, objects
//!   are merged field by field. Absent when none has any.

use std::collections::BTreeMap;

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

use crate::decision::{Basis, Code, Decision};
use crate::request::{LimitRequest, RequestDescriptor};

/// The dynamic metadata of `request` answered by `decision` (statuses in request order).
pub fn build(request: &LimitRequest, decision: &Decision) -> Struct {
    let mut fields = BTreeMap::new();
    fields.insert("domain".to_owned(), string(request.domain.clone()));
    let descriptors = request.descriptors.iter().map(descriptor).collect();
    fields.insert("descriptors".to_owned(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".to_owned(), number(request.hits_addend));
    }
    let mut merged = serde_json::Map::new();
    for (descriptor, status) in request.descriptors.iter().zip(&decision.statuses) {
        let passed = status.code == Code::Ok && status.basis != Basis::Unlimited;
        // A request's own limit is not the rule's: it carries no metadata.
        let rule = status
            .rule
            .as_ref()
            .filter(|_| descriptor.limit_override.is_none());
        if let (true, Some(serde_json::Value::Object(m))) =
            (passed, rule.and_then(|r| r.metadata.as_deref()))
        {
            merge(&mut merged, m);
        }
    }
    if !merged.is_empty() {
        fields.insert(
            "metadata".to_owned(),
            json(&serde_json::Value::Object(merged)),
        );
    }
    Struct {
        fields: fields.into_iter().collect(),
    }
}

fn descriptor(d: &RequestDescriptor) -> Value {
    let entries = d
        .entries
        .iter()
        .map(|e| string(format!("{}={}", e.key, e.value)))
        .collect();
    let mut fields = BTreeMap::new();
    fields.insert("entries".to_owned(), list(entries));
    if let Some(o) = d.limit_override {
        fields.insert(
            "limit".to_owned(),
            string(format!(
                "requests_per_unit:{} unit:{}",
                o.requests_per_unit,
                o.unit.as_str().to_ascii_uppercase()
            )),
        );
    }
    if let Some(n) = d.hits_addend {
        fields.insert("hitsAddend".to_owned(), number(n));
    }
    Value {
        kind: Some(Kind::StructValue(Struct {
            fields: fields.into_iter().collect(),
        })),
    }
}

/// Adds `src`'s fields to `dest`: a field `dest` lacks is taken, one both hold as objects is
/// merged the same way, any other field of `dest` is kept.
fn merge(
    dest: &mut serde_json::Map<String, serde_json::Value>,
    src: &serde_json::Map<String, serde_json::Value>,
) {
    for (k, v) in src {
        match (dest.get_mut(k), v) {
            (None, _) => {
                dest.insert(k.clone(), v.clone());
            }
            (Some(serde_json::Value::Object(d)), serde_json::Value::Object(s)) => merge(d, s),
            (Some(_), _) => {}
        }
    }
}

/// A JSON value as a protobuf `Value` (numbers as doubles, as protobuf has no other).
fn json(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(Struct {
            fields: o.iter().map(|(k, v)| (k.clone(), json(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

fn string(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn number(n: u64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n as f64)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}
