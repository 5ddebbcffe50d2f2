//! One xDS push (the resources of a `DiscoveryResponse`) → the named YAML sources the file loader
//! takes, so a push is validated by exactly the code that validates files, all domains together.
//!
//! Each `RateLimitConfig` is rendered one field per line, and every line remembers the protobuf
//! path it came from; a diagnostic from the loader is then prefixed with that path
//! (`descriptors[1].rate_limit.unit: invalid unit …`), which is what a control-plane operator
//! can act on. Line and column stay as they are and refer to the rendering (logged at debug).

use std::collections::HashMap;
use std::fmt::Write as _;

use envoy_types::pb::envoy::service::discovery::v3::Resource;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::proto::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};
use crate::config::{self, Config, ConfigErrors, Diagnostic};

/// The resource type sluice subscribes to, as envoyproxy/ratelimit does.
pub const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Some control planes wrap each resource in this envelope even on state-of-the-world streams.
const RESOURCE_WRAPPER_TYPE: &str = "type.googleapis.com/envoy.service.discovery.v3.Resource";

/// A resource rendered as a config source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// `xds:<resource name>` (or `xds:resources[i]` when the resource has no name).
    pub source: String,
    pub text: String,
    /// The protobuf path of each line (index 0 is line 1).
    lines: Vec<Line>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Line {
    /// Path of the message holding the field (`descriptors[0].rate_limit`, or `` at the root).
    message: String,
    field: &'static str,
    /// Whether the line opens a list item (`- key: …`), so it also stands for the whole item.
    opens_item: bool,
    /// 1-based column where the value starts.
    value_column: usize,
}

impl Rendered {
    /// The protobuf path a `line:column` of this rendering points at.
    fn path_at(&self, line: usize, column: usize) -> Option<String> {
        let found = self.lines.get(line.checked_sub(1)?)?;
        let join = |a: &str, b: &str| {
            if a.is_empty() {
                b.to_owned()
            } else {
                format!("{a}.{b}")
            }
        };
        if found.opens_item && column < found.value_column {
            // The loader places item-level problems (a duplicate descriptor) at the item itself.
            return Some(found.message.clone());
        }
        Some(join(&found.message, found.field))
    }
}

/// Decodes, renders and validates one push as a whole.
pub fn load_push(resources: &[Any]) -> Result<Config, ConfigErrors> {
    let rendered = render_push(resources)?;
    validate_rendered(&rendered, &config::LoadOptions::default())
}

/// Decodes and renders every resource; every undecodable resource is reported.
pub fn render_push(resources: &[Any]) -> Result<Vec<Rendered>, ConfigErrors> {
    let mut problems = Vec::new();
    let mut rendered = Vec::with_capacity(resources.len());
    for (index, any) in resources.iter().enumerate() {
        match decode(index, any) {
            Ok((name, config)) => rendered.push(render(&source_name(index, &name), &config)),
            Err(message) => problems.push(Diagnostic {
                file: format!("xds:resources[{index}]"),
                line: 0,
                column: 0,
                message,
            }),
        }
    }
    if problems.is_empty() {
        Ok(rendered)
    } else {
        Err(ConfigErrors(problems))
    }
}

/// Runs the file loader over the renderings and puts protobuf paths into its diagnostics.
pub fn validate_rendered(
    rendered: &[Rendered],
    options: &config::LoadOptions,
) -> Result<Config, ConfigErrors> {
    let sources: Vec<(String, String)> = rendered
        .iter()
        .map(|r| (r.source.clone(), r.text.clone()))
        .collect();
    config::load_sources_with(&sources, options).map_err(|ConfigErrors(diagnostics)| {
        let by_source: HashMap<&str, &Rendered> =
            rendered.iter().map(|r| (r.source.as_str(), r)).collect();
        ConfigErrors(
            diagnostics
                .into_iter()
                .map(|mut d| {
                    let path = by_source
                        .get(d.file.as_str())
                        .and_then(|r| r.path_at(d.line, d.column));
                    if let Some(path) = path {
                        d.message = format!("{path}: {}", d.message);
                    }
                    d
                })
                .collect(),
        )
    })
}

/// The resource's name (from the wrapper when there is one) and its config.
fn decode(index: usize, any: &Any) -> Result<(String, RateLimitConfig), String> {
    let (wrapper_name, inner) = if any.type_url == RESOURCE_WRAPPER_TYPE {
        let wrapper = Resource::decode(any.value.as_slice())
            .map_err(|e| format!("cannot decode resources[{index}] as a Resource: {e}"))?;
        let Some(inner) = wrapper.resource else {
            return Err(format!(
                "resources[{index}] is a Resource wrapper with no resource"
            ));
        };
        (wrapper.name, inner)
    } else {
        (String::new(), any.clone())
    };
    if inner.type_url != RATE_LIMIT_CONFIG_TYPE {
        return Err(format!(
            "resources[{index}] has type `{}`; expected `{RATE_LIMIT_CONFIG_TYPE}`",
            inner.type_url
        ));
    }
    let config = RateLimitConfig::decode(inner.value.as_slice())
        .map_err(|e| format!("cannot decode resources[{index}] as a RateLimitConfig: {e}"))?;
    let name = if config.name.is_empty() {
        wrapper_name
    } else {
        config.name.clone()
    };
    Ok((name, config))
}

fn source_name(index: usize, name: &str) -> String {
    if name.is_empty() {
        format!("xds:resources[{index}]")
    } else {
        // The name lands in log lines and error details; keep them one line each.
        let shown: String = name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        format!("xds:{shown}")
    }
}

/// One `RateLimitConfig` as a descriptor file. Proto3 has no field presence for scalars, so an
/// empty string, a zero or `false` is rendered as an absent field, except where the loader must
/// see the zero (`requests_per_unit: 0` blocks; `unit: UNKNOWN` on a limited policy is refused).
pub fn render(source: &str, config: &RateLimitConfig) -> Rendered {
    let mut out = Writer::default();
    out.field(0, false, "", "domain", Some(quote(&config.domain)));
    out.descriptors(0, "", &config.descriptors);
    Rendered {
        source: source.to_owned(),
        text: out.text,
        lines: out.lines,
    }
}

#[derive(Default)]
struct Writer {
    text: String,
    lines: Vec<Line>,
}

impl Writer {
    /// Writes `field: value` (or `field:` opening a block) at `indent`, as a list item if `item`.
    fn field(
        &mut self,
        indent: usize,
        item: bool,
        message: &str,
        field: &'static str,
        value: Option<String>,
    ) {
        let lead = if item {
            format!("{}- ", " ".repeat(indent.saturating_sub(2)))
        } else {
            " ".repeat(indent)
        };
        let head = format!("{lead}{field}:");
        let value_column = head.chars().count() + 2;
        let _ = match value {
            Some(value) => writeln!(self.text, "{head} {value}"),
            None => writeln!(self.text, "{head}"),
        };
        self.lines.push(Line {
            message: message.to_owned(),
            field,
            opens_item: item,
            value_column,
        });
    }

    fn descriptors(&mut self, indent: usize, parent: &str, descriptors: &[RateLimitDescriptor]) {
        if descriptors.is_empty() {
            return;
        }
        self.field(indent, false, parent, "descriptors", None);
        let prefix = if parent.is_empty() {
            String::from("descriptors")
        } else {
            format!("{parent}.descriptors")
        };
        for (i, d) in descriptors.iter().enumerate() {
            let path = format!("{prefix}[{i}]");
            let inner = indent + 4;
            self.field(inner, true, &path, "key", Some(quote(&d.key)));
            if !d.value.is_empty() {
                self.field(inner, false, &path, "value", Some(quote(&d.value)));
            }
            if let Some(policy) = &d.rate_limit {
                self.policy(inner, &path, policy);
            }
            for (set, name) in [
                (d.shadow_mode, "shadow_mode"),
                (d.detailed_metric, "detailed_metric"),
                (d.quota_mode, "quota_mode"),
            ] {
                if set {
                    self.field(inner, false, &path, name, Some("true".into()));
                }
            }
            if let Some(metadata) = d.metadata.as_ref().filter(|m| !m.fields.is_empty()) {
                // JSON is YAML's flow style: one line, read back by the same loader.
                let json = struct_json(metadata).to_string();
                self.field(inner, false, &path, "metadata", Some(json));
            }
            self.descriptors(inner, &path, &d.descriptors);
        }
    }

    fn policy(&mut self, indent: usize, descriptor: &str, policy: &RateLimitPolicy) {
        self.field(indent, false, descriptor, "rate_limit", None);
        let path = format!("{descriptor}.rate_limit");
        let inner = indent + 2;
        // An unlimited policy leaves unit and rate unset; a set one is a contradiction the loader
        // reports, as envoyproxy/ratelimit does.
        if !policy.unlimited || policy.unit != RateLimitUnit::Unknown as i32 {
            self.field(inner, false, &path, "unit", Some(unit_name(policy.unit)));
        }
        if !policy.unlimited || policy.requests_per_unit != 0 {
            self.field(
                inner,
                false,
                &path,
                "requests_per_unit",
                Some(policy.requests_per_unit.to_string()),
            );
        }
        if policy.unlimited {
            self.field(inner, false, &path, "unlimited", Some("true".into()));
        }
        if !policy.name.is_empty() {
            self.field(inner, false, &path, "name", Some(quote(&policy.name)));
        }
        if !policy.replaces.is_empty() {
            self.field(inner, false, &path, "replaces", None);
            for (i, replace) in policy.replaces.iter().enumerate() {
                self.field(
                    inner + 4,
                    true,
                    &format!("{path}.replaces[{i}]"),
                    "name",
                    Some(quote(&replace.name)),
                );
            }
        }
    }
}

/// The unit as the YAML schema spells it; an unknown value keeps its enum name or number so the
/// loader's "invalid unit" message shows what was sent.
fn unit_name(value: i32) -> String {
    match RateLimitUnit::try_from(value) {
        Ok(RateLimitUnit::Unknown) => quote("UNKNOWN"),
        Ok(unit) => unit.as_str_name().to_ascii_lowercase(),
        Err(_) => quote(&value.to_string()),
    }
}

/// A YAML double-quoted scalar. JSON string syntax is a subset of it, and a quoted scalar is
/// always a string, so `value: "on"` or `value: "007"` stay strings.
fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// A protobuf `Struct` as the JSON value it stands for.
fn struct_json(s: &prost_types::Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_json).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Entry;
    use crate::xds::proto::RateLimitReplace;

    fn any(config: &RateLimitConfig) -> Any {
        Any {
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            value: config.encode_to_vec(),
        }
    }

    fn policy(unit: RateLimitUnit, rpu: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: rpu,
            ..Default::default()
        })
    }

    fn descriptor(
        key: &str,
        value: &str,
        rate_limit: Option<RateLimitPolicy>,
    ) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit,
            ..Default::default()
        }
    }

    fn messages(err: ConfigErrors) -> Vec<String> {
        err.0.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn renders_one_field_per_line() {
        let config = RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "tenant".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Week as i32,
                    requests_per_unit: 7,
                    name: "weekly".into(),
                    ..Default::default()
                }),
                shadow_mode: true,
                descriptors: vec![RateLimitDescriptor {
                    key: "route".into(),
                    value: "on".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unlimited: true,
                        replaces: vec![RateLimitReplace {
                            name: "weekly".into(),
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let rendered = render("xds:edge", &config);
        assert_eq!(
            rendered.text,
            "domain: \"edge\"\n\
             descriptors:\n\
             \x20 - key: \"tenant\"\n\
             \x20   rate_limit:\n\
             \x20     unit: week\n\
             \x20     requests_per_unit: 7\n\
             \x20     name: \"weekly\"\n\
             \x20   shadow_mode: true\n\
             \x20   descriptors:\n\
             \x20     - key: \"route\"\n\
             \x20       value: \"on\"\n\
             \x20       rate_limit:\n\
             \x20         unlimited: true\n\
             \x20         replaces:\n\
             \x20           - name: \"weekly\"\n"
        );
        let config =
            validate_rendered(&[rendered], &config::LoadOptions::default()).expect("valid");
        let domain = config.domain("edge").expect("domain");
        assert_eq!(domain.file(), "xds:edge");
        assert_eq!(domain.rules().len(), 2);
    }

    #[test]
    fn strings_that_yaml_would_retype_or_break_stay_strings() {
        let tricky = [
            "on",
            "007",
            "1.50",
            "~",
            "a: b",
            "#x",
            "*",
            "\"q\" \\ \u{7}",
            "x\ny",
            "é",
        ];
        for (i, value) in tricky.iter().enumerate() {
            let config = RateLimitConfig {
                domain: format!("d{i}"),
                descriptors: vec![descriptor("k", value, policy(RateLimitUnit::Second, 1))],
                ..Default::default()
            };
            let loaded = load_push(&[any(&config)]).unwrap_or_else(|e| panic!("{value:?}: {e}"));
            let domain = loaded.domain(&format!("d{i}")).expect("domain");
            assert!(
                domain.find(&[Entry::new("k", *value)]).is_some(),
                "{value:?} does not match itself"
            );
            if *value != "*" {
                assert!(
                    domain.find(&[Entry::new("k", "other")]).is_none(),
                    "{value:?}"
                );
            }
        }
    }

    #[test]
    fn errors_name_the_protobuf_field() {
        let config = RateLimitConfig {
            name: "api".into(),
            domain: "api".into(),
            descriptors: vec![
                descriptor("ok", "", policy(RateLimitUnit::Second, 1)),
                RateLimitDescriptor {
                    key: "tenant".into(),
                    descriptors: vec![
                        descriptor("route", "", policy(RateLimitUnit::Unknown, 5)),
                        // `requests_per_unit: 0` blocks; it is not an error.
                        descriptor("user", "", policy(RateLimitUnit::Minute, 0)),
                        descriptor("user", "", policy(RateLimitUnit::Minute, 3)),
                        RateLimitDescriptor {
                            key: "q".into(),
                            quota_mode: true,
                            rate_limit: policy(RateLimitUnit::Minute, 0),
                            ..Default::default()
                        },
                        descriptor("z", "", policy(RateLimitUnit::Unknown, 1)),
                    ],
                    ..Default::default()
                },
            ],
        };
        let found = messages(load_push(&[any(&config)]).unwrap_err());
        let paths: Vec<&str> = found
            .iter()
            .map(|m| m.split(": ").nth(1).unwrap_or(""))
            .collect();
        assert_eq!(
            paths,
            [
                "descriptors[1].descriptors[0].rate_limit.unit",
                "descriptors[1].descriptors[2]",
                "descriptors[1].descriptors[4].rate_limit.unit",
            ],
            "{found:#?}"
        );
        assert!(found[0].starts_with("xds:api:"), "{}", found[0]);
        assert!(found[0].contains("invalid unit `UNKNOWN`"), "{}", found[0]);
        assert!(
            found[1].contains("duplicate descriptor `user`"),
            "{}",
            found[1]
        );
        // A quota-mode descriptor (here a blocking one) loads as in files: no error of its own.
        assert!(found[2].contains("invalid unit `UNKNOWN`"), "{}", found[2]);
    }

    #[test]
    fn unlimited_with_a_unit_is_rejected_like_a_file() {
        let config = RateLimitConfig {
            domain: "d".into(),
            descriptors: vec![descriptor(
                "k",
                "",
                Some(RateLimitPolicy {
                    unlimited: true,
                    unit: RateLimitUnit::Second as i32,
                    ..Default::default()
                }),
            )],
            ..Default::default()
        };
        let found = messages(load_push(&[any(&config)]).unwrap_err());
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("xds:resources[0]:") && found[0].contains("descriptors[0].rate_limit.unit: `unit` must not be given with `unlimited: true`"),
            "{}",
            found[0]
        );
    }

    #[test]
    fn domains_are_validated_together() {
        let a = RateLimitConfig {
            name: "first".into(),
            domain: "shared".into(),
            ..Default::default()
        };
        let b = RateLimitConfig {
            name: "second".into(),
            domain: "shared".into(),
            ..Default::default()
        };
        let found = messages(load_push(&[any(&a), any(&b)]).unwrap_err());
        assert_eq!(found.len(), 1);
        assert!(
            found[0].starts_with("xds:second:1:9: domain: duplicate domain `shared`: already defined at xds:first:1:9"),
            "{}",
            found[0]
        );
        let c = RateLimitConfig {
            domain: "other".into(),
            ..Default::default()
        };
        let config = load_push(&[any(&a), any(&c)]).expect("two domains");
        assert_eq!(config.domains().count(), 2);
    }

    #[test]
    fn an_empty_push_removes_every_domain() {
        let config = load_push(&[]).expect("empty is valid");
        assert_eq!(config.domains().count(), 0);
    }

    #[test]
    fn wrong_types_and_garbage_are_reported_per_resource() {
        let good = any(&RateLimitConfig {
            domain: "d".into(),
            ..Default::default()
        });
        let wrong_type = Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            value: Vec::new(),
        };
        let garbage = Any {
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            value: vec![0xff, 0xff, 0xff],
        };
        let found = messages(load_push(&[good, wrong_type, garbage]).unwrap_err());
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("xds:resources[1]: resources[1] has type `type.googleapis.com/envoy.config.cluster.v3.Cluster`"), "{}", found[0]);
        assert!(
            found[1]
                .starts_with("xds:resources[2]: cannot decode resources[2] as a RateLimitConfig"),
            "{}",
            found[1]
        );
    }

    #[test]
    fn wrapped_resources_are_unwrapped_and_named() {
        let inner = any(&RateLimitConfig {
            domain: "d".into(),
            ..Default::default()
        });
        let wrapper = Resource {
            name: "wrapped".into(),
            resource: Some(inner),
            ..Default::default()
        };
        let config = load_push(&[Any {
            type_url: RESOURCE_WRAPPER_TYPE.into(),
            value: wrapper.encode_to_vec(),
        }])
        .expect("valid");
        assert_eq!(config.domain("d").expect("domain").file(), "xds:wrapped");
    }

    #[test]
    fn empty_metadata_is_absent_and_set_metadata_is_carried() {
        use prost_types::{Struct, Value};
        let mut d = descriptor("k", "", policy(RateLimitUnit::Second, 1));
        d.metadata = Some(Struct::default());
        let mut config = RateLimitConfig {
            domain: "d".into(),
            descriptors: vec![d],
            ..Default::default()
        };
        load_push(&[any(&config)]).expect("an empty Struct carries nothing");
        config.descriptors[0].metadata = Some(Struct {
            fields: [
                ("team".to_string(), Value::default()),
                (
                    "tier".to_string(),
                    Value {
                        kind: Some(prost_types::value::Kind::StringValue("gold: \"a\"".into())),
                    },
                ),
            ]
            .into(),
        });
        let loaded = load_push(&[any(&config)]).expect("metadata is carried");
        let rule = loaded.rules().next().expect("one rule");
        assert_eq!(
            rule.metadata.as_deref(),
            Some(&serde_json::json!({"team": null, "tier": "gold: \"a\""}))
        );
    }
}
