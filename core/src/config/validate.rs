//! Meaning checks on the raw model of one file, producing the checked model `compile` builds from.
//!
//! Every problem is reported with the position of the value (or field) at fault; checking goes on
//! past each one so a single run lists them all.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::Sink;
use super::in_flight;
use super::raw::{Field, RawDescriptor, RawDomain, RawRateLimit, RawReplace, Sp};
use super::spec::{DescriptorSpec, DomainSpec, RuleSpec};
use super::yaml::Pos;
use crate::algorithm::Algorithm;
use crate::rule::{Charge, FailureMode, Limit, MAX_WINDOW_SECS, RateLimit, Unit};

/// Limits for `requests_per_unit`, `burst` and `cost`: bucket sizes are `u32` on the wire
/// (`RateLimitResponse.RateLimit.requests_per_unit`), and a cost above any capacity is meaningless.
const COUNT_MAX: i128 = u32::MAX as i128;

/// Bounds of `shards`: one shard is no split, and more than 64 sub-keys per descriptor buys
/// nothing a Cluster of realistic size can use while multiplying the state kept.
pub(crate) const SHARDS_MIN: i128 = 2;
pub(crate) const SHARDS_MAX: i128 = 64;

/// Checks one file. `None` when the domain itself is unusable; problems are in `sink` either way.
pub(crate) fn domain(raw: &RawDomain, sink: &mut Sink) -> Option<DomainSpec> {
    let failure_mode = failure_mode(&raw.failure_mode, sink);
    let algorithm = algorithm(&raw.algorithm, sink);
    let charge = charge(&raw.charge, sink);
    let name = match &raw.domain {
        Field::Absent => {
            sink.error(raw.at, "missing required field `domain`");
            None
        }
        Field::Invalid => None,
        Field::Given(name) if name.value.is_empty() => {
            sink.error(name.at, "`domain` must not be empty");
            None
        }
        Field::Given(name) => Some(name.clone()),
    };
    let mut names = HashMap::new();
    let descriptors = level(&raw.descriptors, &mut names, sink);
    Some(DomainSpec {
        name: name?,
        failure_mode,
        algorithm,
        charge,
        descriptors,
    })
}

/// One list of sibling descriptors. `names` holds the domain's `rate_limit.name`s seen so far.
fn level(
    raws: &[RawDescriptor],
    names: &mut HashMap<String, Pos>,
    sink: &mut Sink,
) -> Vec<DescriptorSpec> {
    let mut seen: HashMap<(&str, Option<&str>), Pos> = HashMap::new();
    let mut specs = Vec::with_capacity(raws.len());
    for raw in raws {
        let key = match &raw.key {
            Field::Absent => {
                sink.error(raw.at, "descriptor is missing required field `key`");
                None
            }
            Field::Invalid => None,
            Field::Given(key) if key.value.is_empty() => {
                sink.error(key.at, "descriptor `key` must not be empty");
                None
            }
            Field::Given(key) => Some(key.value.as_str()),
        };
        let value = raw
            .value
            .given()
            .map(|v| v.value.as_str())
            .filter(|v| !v.is_empty());
        // A malformed value is already reported; comparing it as "no value" would add noise.
        if let (Some(key), false) = (key, matches!(raw.value, Field::Invalid)) {
            match seen.entry((key, value)) {
                Entry::Occupied(first) => {
                    let what = match value {
                        Some(value) => format!("`{key}` = `{value}`"),
                        None => format!("`{key}` (no value)"),
                    };
                    sink.error(
                        raw.at,
                        format!(
                            "duplicate descriptor {what} at this level (first at line {})",
                            first.get().line
                        ),
                    );
                }
                Entry::Vacant(slot) => {
                    slot.insert(raw.at);
                }
            }
        }
        let rule = rule(raw, names, sink);
        let children = level(&raw.descriptors, names, sink);
        let share_threshold = flag(&raw.share_threshold);
        if let (true, Field::Given(at)) = (
            share_threshold && !value.is_some_and(|v| v.contains('*')),
            &raw.share_threshold,
        ) {
            sink.error(
                at.key_at,
                "`share_threshold` applies only to a wildcard value (one holding `*`): the values it matches share one bucket",
            );
        }
        if let Some(key) = key {
            specs.push(DescriptorSpec {
                at: raw.at,
                key: key.to_owned(),
                value: value.map(str::to_owned),
                rule,
                children,
                share_threshold,
                value_to_metric: flag(&raw.value_to_metric),
            });
        }
    }
    specs
}

/// The rule a descriptor defines, if it has a well-formed `rate_limit`.
fn rule(
    raw: &RawDescriptor,
    names: &mut HashMap<String, Pos>,
    sink: &mut Sink,
) -> Option<RuleSpec> {
    if let Field::Given(cap) = &raw.in_flight {
        if let Some(reserve) = raw.reserve.given() {
            sink.error(
                reserve.key_at,
                "`reserve` applies to a `rate_limit`, not to `in_flight`: a slot is not a cost",
            );
        }
        return in_flight_rule(raw, cap, sink);
    }
    let cost = count("cost", &raw.cost, sink);
    let charge = charge(&raw.charge, sink);
    let failure_mode = failure_mode(&raw.failure_mode, sink);
    let rate_limit = match (&raw.rate_limit, &raw.rate_limits) {
        (Field::Given(_), Field::Given(list)) => {
            sink.error(
                list.key_at,
                "a descriptor has `rate_limit` or `rate_limits`, not both: write one limit as `rate_limit`, several as `rate_limits`",
            );
            return None;
        }
        (Field::Absent, Field::Given(list)) => {
            if let Some(reserve) = raw.reserve.given() {
                sink.error(
                    reserve.key_at,
                    "`reserve` applies to a single `rate_limit`, not to `rate_limits`",
                );
                return None;
            }
            return several(raw, list, (cost, charge, failure_mode), names, sink);
        }
        (Field::Given(rl), _) => rl,
        (Field::Invalid, _) | (_, Field::Invalid) => return None,
        (Field::Absent, Field::Absent) => {
            // Rule settings on a pure tree node would silently do nothing: they are not inherited.
            let stray = [
                ("cost", raw.cost.given().map(|f| f.key_at)),
                ("charge", raw.charge.given().map(|f| f.key_at)),
                ("failure_mode", raw.failure_mode.given().map(|f| f.key_at)),
                ("reserve", raw.reserve.given().map(|f| f.key_at)),
            ];
            for (field, at) in stray {
                if let Some(at) = at {
                    sink.error(
                        at,
                        format!(
                            "`{field}` applies only to a descriptor with a `rate_limit` (it is not inherited)"
                        ),
                    );
                }
            }
            return None;
        }
    };
    let mut spec = spec(raw, rate_limit, (cost, charge, failure_mode), names, sink)?;
    if let Some(reserve) = raw.reserve.given() {
        let beside = in_flight::Beside {
            lease_at: spec.lease_at,
            shards: spec.shards.is_some(),
            quota_mode: spec.quota_mode,
            limit: &spec.limit,
        };
        spec.reserve = Some(in_flight::check_reserve(raw, reserve, &beside, sink)?);
        spec.reserve_at = Some(reserve.key_at);
    }
    Some(spec)
}

/// What a descriptor's rules share: its `cost`, `charge` and `failure_mode`, read once.
type RuleFields = (Option<u32>, Option<Sp<Charge>>, Option<FailureMode>);

/// The rule of one `rate_limit` (or one entry of `rate_limits`) on descriptor `raw`, whose `cost`,
/// `charge` and `failure_mode` are already read.
fn spec(
    raw: &RawDescriptor,
    rate_limit: &Sp<RawRateLimit>,
    (cost, charge, failure_mode): RuleFields,
    names: &mut HashMap<String, Pos>,
    sink: &mut Sink,
) -> Option<RuleSpec> {
    let limit = limit(rate_limit, sink);
    let name = rule_name(&rate_limit.value.name, names, sink);
    let replaces = replaces(&rate_limit.value.replaces, name.as_deref(), sink);
    let algorithm = algorithm(&rate_limit.value.algorithm, sink);
    let lease = lease(rate_limit, limit.as_ref(), sink);
    let shards = shards(rate_limit, limit.as_ref(), (cost, &raw.cost), lease, sink);
    Some(RuleSpec {
        limit: limit?,
        name,
        replaces,
        shadow_mode: flag(&raw.shadow_mode),
        quota_mode: flag(&raw.quota_mode),
        detailed_metric: flag(&raw.detailed_metric),
        metadata: raw.metadata.given().map(|m| m.value.clone()),
        cost: cost.map_or(1, u64::from),
        charge,
        failure_mode,
        algorithm,
        burst_at: rate_limit.value.burst.given().map(|b| b.key_at),
        lease,
        lease_at: rate_limit.value.lease.given().map(|l| l.key_at),
        shards,
        window_tag: None,
        also: Vec::new(),
        in_flight: None,
        reserve: None,
        reserve_at: None,
    })
}

/// The rule of a descriptor with `in_flight` ([`in_flight::check`]); unnamed (nothing replaces
/// a cap), one slot per request.
fn in_flight_rule(
    raw: &RawDescriptor,
    cap: &Sp<super::raw::RawInFlight>,
    sink: &mut Sink,
) -> Option<RuleSpec> {
    let failure_mode = failure_mode(&raw.failure_mode, sink);
    let checked = in_flight::check(raw, cap, sink)?;
    Some(RuleSpec {
        limit: checked.limit,
        name: None,
        replaces: Vec::new(),
        shadow_mode: flag(&raw.shadow_mode),
        quota_mode: flag(&raw.quota_mode),
        detailed_metric: flag(&raw.detailed_metric),
        metadata: raw.metadata.given().map(|m| m.value.clone()),
        cost: 1,
        failure_mode,
        algorithm: Some(checked.algorithm),
        burst_at: None,
        lease: None,
        lease_at: None,
        shards: None,
        in_flight: Some(checked.rule),
        reserve: None,
        reserve_at: None,
        charge: None,
        window_tag: None,
        also: Vec::new(),
    })
}

/// `rate_limits`: several limits on one descriptor, all enforced. Each entry is a bucket limit
/// of its own window (no two alike), without the fields that shape one rule's single bucket.
fn several(
    raw: &RawDescriptor,
    list: &Sp<Vec<Sp<RawRateLimit>>>,
    rule_fields: RuleFields,
    names: &mut HashMap<String, Pos>,
    sink: &mut Sink,
) -> Option<RuleSpec> {
    if list.value.is_empty() {
        sink.error(list.at, "`rate_limits` must hold at least one limit");
        return None;
    }
    let mut specs: Vec<RuleSpec> = Vec::with_capacity(list.value.len());
    let mut windows: HashMap<u64, Pos> = HashMap::new();
    let mut ok = true;
    for item in &list.value {
        ok &= single_bucket_fields_absent(&item.value, sink);
        let Some(mut spec) = spec(raw, item, rule_fields.clone(), names, sink) else {
            ok = false;
            continue;
        };
        let Limit::Bucket(rate) = spec.limit else {
            if let Some(zero) = item.value.requests_per_unit.given() {
                sink.error(
                    zero.at,
                    "a `rate_limits` entry must not block (`requests_per_unit: 0`); block with a single `rate_limit`",
                );
            }
            ok = false;
            continue;
        };
        let window = rate.window_secs();
        if let Some(first) = windows.insert(window, item.at) {
            sink.error(
                item.at,
                format!(
                    "two limits of one descriptor with the same window ({}; first at line {}): each limit needs its own window",
                    rate.window(),
                    first.line
                ),
            );
            ok = false;
        }
        spec.window_tag = Some(window);
        specs.push(spec);
    }
    if !ok {
        return None;
    }
    let mut specs = specs.into_iter();
    let mut first = specs.next()?;
    first.also = specs.collect();
    Some(first)
}

/// Fields of a `rate_limits` entry that belong to a rule with a single bucket: refused there.
fn single_bucket_fields_absent(raw: &RawRateLimit, sink: &mut Sink) -> bool {
    let mut ok = true;
    let single = [
        ("unlimited", raw.unlimited.given().map(|f| f.key_at)),
        ("lease", raw.lease.given().map(|f| f.key_at)),
        ("shards", raw.shards.given().map(|f| f.key_at)),
    ];
    for (name, at) in single {
        if let Some(at) = at {
            sink.error(
                at,
                format!("`{name}` applies to a single `rate_limit`, not to a `rate_limits` entry"),
            );
            ok = false;
        }
    }
    if let Some(first) = raw.replaces.first() {
        sink.error(
            first.at,
            "`replaces` applies to a single `rate_limit`, not to a `rate_limits` entry",
        );
        ok = false;
    }
    ok
}

/// `rate_limit.name`: non-empty and unique in its domain (`replaces` names it).
fn rule_name(
    field: &Field<String>,
    names: &mut HashMap<String, Pos>,
    sink: &mut Sink,
) -> Option<String> {
    match field {
        Field::Given(name) if name.value.is_empty() => {
            sink.error(name.at, "`rate_limit.name` must not be empty");
            None
        }
        Field::Given(name) => {
            match names.entry(name.value.clone()) {
                Entry::Occupied(first) => sink.error(
                    name.at,
                    format!(
                        "duplicate rate_limit name `{}` in this domain (first at line {}); `replaces` would be ambiguous",
                        name.value,
                        first.get().line
                    ),
                ),
                Entry::Vacant(slot) => {
                    slot.insert(name.at);
                }
            }
            Some(name.value.clone())
        }
        _ => None,
    }
}

/// `rate_limit.replaces`: each entry names another rule.
fn replaces(entries: &[RawReplace], name: Option<&str>, sink: &mut Sink) -> Vec<String> {
    let mut replaces = Vec::with_capacity(entries.len());
    for entry in entries {
        match &entry.name {
            Field::Absent => sink.error(entry.at, "`replaces` entry is missing `name`"),
            Field::Invalid => {}
            Field::Given(target) if target.value.is_empty() => {
                sink.error(target.at, "`replaces` entry has an empty `name`")
            }
            Field::Given(target) if Some(target.value.as_str()) == name => sink.error(
                target.at,
                format!("rule `{}` cannot replace itself", target.value),
            ),
            Field::Given(target) => replaces.push(target.value.clone()),
        }
    }
    replaces
}

/// `rate_limit.shards: N`: 2..=64, and the limit must split into N whole shards — N divides
/// `requests_per_unit` and `burst` — with a shard still able to pay a whole `lease` batch and one
/// hit's `cost` (a hit costlier than a shard could never pass). `unlimited` is refused in
/// [`limit`].
fn shards(
    rate_limit: &Sp<RawRateLimit>,
    limit: Option<&Limit>,
    (cost, cost_field): (Option<u32>, &Field<i128>),
    lease: Option<u64>,
    sink: &mut Sink,
) -> Option<u32> {
    let raw = &rate_limit.value;
    let given = raw.shards.given()?;
    if !(SHARDS_MIN..=SHARDS_MAX).contains(&given.value) {
        sink.error(
            given.at,
            format!(
                "`shards` must be an integer from {SHARDS_MIN} to {SHARDS_MAX}, got {}",
                given.value
            ),
        );
        return None;
    }
    let n = given.value as u32;
    let Some(Limit::Bucket(rate)) = limit else {
        return Some(n);
    };
    let mut ok = true;
    if rate.requests_per_unit % n != 0 {
        sink.error(
            given.at,
            format!(
                "`shards` ({n}) must divide `requests_per_unit` ({}) so that every shard gets a whole rate",
                rate.requests_per_unit
            ),
        );
        ok = false;
    }
    if let Some(burst) = rate.burst
        && burst % n != 0
    {
        sink.error(
            given.at,
            format!("`shards` ({n}) must divide `burst` ({burst}) so that every shard gets a whole capacity"),
        );
        ok = false;
    }
    if !ok {
        return None;
    }
    let shard_capacity = rate.capacity() / u64::from(n);
    let share = format!(
        "{shard_capacity}: capacity {} / `shards` {n}",
        rate.capacity()
    );
    if let (Some(lease), Some(at)) = (lease, raw.lease.given().map(|l| l.at))
        && lease > shard_capacity
    {
        sink.error(
            at,
            format!("`lease` ({lease}) must not exceed a shard's capacity ({share}): each shard leases on its own"),
        );
        ok = false;
    }
    if let (Some(cost), Some(at)) = (cost, cost_field.given().map(|c| c.at))
        && u64::from(cost) > shard_capacity
    {
        sink.error(
            at,
            format!("`cost` ({cost}) must not exceed a shard's capacity ({share}): a request is judged by one shard, so every hit would be over limit"),
        );
        ok = false;
    }
    ok.then_some(n)
}

/// `rate_limit.lease`: a count no larger than the bucket (a bigger batch can never be granted).
/// `unlimited` has no tokens to lease; the algorithm is checked in [`algorithm_fields`].
fn lease(rate_limit: &Sp<RawRateLimit>, limit: Option<&Limit>, sink: &mut Sink) -> Option<u64> {
    let raw = &rate_limit.value.lease;
    let given = raw.given()?;
    let lease = u64::from(count("lease", raw, sink)?);
    match limit {
        Some(Limit::Bucket(rate)) if lease > rate.capacity() => {
            sink.error(
                given.at,
                format!(
                    "`lease` ({lease}) must not exceed the bucket's capacity ({}, `burst` else `requests_per_unit`)",
                    rate.capacity()
                ),
            );
            None
        }
        _ => Some(lease),
    }
}

fn limit(rate_limit: &Sp<RawRateLimit>, sink: &mut Sink) -> Option<Limit> {
    let raw = &rate_limit.value;
    if flag(&raw.unlimited) {
        let mut ok = true;
        for (name, given) in [
            ("unit", raw.unit.given().map(|f| f.key_at)),
            (
                "unit_multiplier",
                raw.unit_multiplier.given().map(|f| f.key_at),
            ),
            (
                "requests_per_unit",
                raw.requests_per_unit.given().map(|f| f.key_at),
            ),
            ("burst", raw.burst.given().map(|f| f.key_at)),
            ("lease", raw.lease.given().map(|f| f.key_at)),
            ("shards", raw.shards.given().map(|f| f.key_at)),
            ("algorithm", raw.algorithm.given().map(|f| f.key_at)),
        ] {
            if let Some(at) = given {
                sink.error(
                    at,
                    format!("`{name}` must not be given with `unlimited: true`"),
                );
                ok = false;
            }
        }
        return ok.then_some(Limit::Unlimited);
    }
    let unit = match &raw.unit {
        Field::Absent => {
            sink.error(
                rate_limit.key_at,
                "`rate_limit` is missing `unit` (or `unlimited: true`)",
            );
            None
        }
        Field::Invalid => None,
        Field::Given(unit) => {
            let parsed = Unit::parse(&unit.value);
            if parsed.is_none() {
                sink.error(
                    unit.at,
                    format!(
                        "invalid unit `{}`; expected one of: {}",
                        unit.value,
                        Unit::ALL.map(Unit::as_str).join(", ")
                    ),
                );
            }
            parsed
        }
    };
    if raw.requests_per_unit.is_absent() {
        sink.error(
            rate_limit.key_at,
            "`rate_limit` is missing `requests_per_unit` (or `unlimited: true`)",
        );
    }
    if let Some(zero) = raw.requests_per_unit.given().filter(|r| r.value == 0) {
        return blocked(rate_limit, zero.at, unit?, sink);
    }
    let requests_per_unit = bounded("requests_per_unit", &raw.requests_per_unit, 0, sink);
    let burst = count("burst", &raw.burst, sink);
    if raw.burst.is_present() && burst.is_none() {
        return None;
    }
    let unit = unit?;
    let unit_multiplier = unit_multiplier(&raw.unit_multiplier, unit, sink)?;
    Some(Limit::Bucket(RateLimit {
        requests_per_unit: requests_per_unit?,
        unit,
        unit_multiplier,
        burst,
    }))
}

/// `unit_multiplier`: units per window, 1 when absent; the window at most [`MAX_WINDOW_SECS`].
fn unit_multiplier(field: &Field<i128>, unit: Unit, sink: &mut Sink) -> Option<u32> {
    if field.is_absent() {
        return Some(1);
    }
    let multiplier = count("unit_multiplier", field, sink)?;
    let window = u64::from(multiplier) * unit.seconds();
    if window > MAX_WINDOW_SECS {
        sink.error(
            field.given()?.at,
            format!(
                "`unit_multiplier` {multiplier} × {unit} is a window of {window} s; the longest \
                 window is {MAX_WINDOW_SECS} s (10 years)"
            ),
        );
        return None;
    }
    Some(multiplier)
}

/// `requests_per_unit: 0`: as in envoyproxy/ratelimit, the rule rejects every request it
/// reaches. No bucket is kept, so the bucket-shaping fields mean nothing and are refused.
fn blocked(
    rate_limit: &Sp<RawRateLimit>,
    zero_at: Pos,
    unit: Unit,
    sink: &mut Sink,
) -> Option<Limit> {
    let raw = &rate_limit.value;
    let mut ok = true;
    for (name, given) in [
        ("burst", raw.burst.given().map(|f| f.key_at)),
        (
            "unit_multiplier",
            raw.unit_multiplier.given().map(|f| f.key_at),
        ),
        ("lease", raw.lease.given().map(|f| f.key_at)),
        ("shards", raw.shards.given().map(|f| f.key_at)),
    ] {
        if let Some(at) = given {
            sink.error(
                at,
                format!(
                    "`{name}` must not be given with `requests_per_unit: 0` (it keeps no bucket)"
                ),
            );
            ok = false;
        }
    }
    sink.warn(
        zero_at,
        "`requests_per_unit: 0` blocks: every request this rule reaches is answered OVER_LIMIT",
    );
    ok.then_some(Limit::Blocked { unit })
}

/// A positive count that fits a bucket; `None` when absent or reported.
fn count(name: &str, field: &Field<i128>, sink: &mut Sink) -> Option<u32> {
    bounded(name, field, 1, sink)
}

/// A count from `min` that fits a bucket; `None` when absent or reported.
fn bounded(name: &str, field: &Field<i128>, min: i128, sink: &mut Sink) -> Option<u32> {
    let given = field.given()?;
    if (min..=COUNT_MAX).contains(&given.value) {
        Some(given.value as u32)
    } else {
        sink.error(
            given.at,
            format!(
                "`{name}` must be an integer from {min} to {COUNT_MAX}, got {}",
                given.value
            ),
        );
        None
    }
}

fn failure_mode(field: &Field<String>, sink: &mut Sink) -> Option<FailureMode> {
    let given = field.given()?;
    let parsed = FailureMode::parse(&given.value);
    if parsed.is_none() {
        sink.error(
            given.at,
            format!(
                "invalid failure_mode `{}`; expected one of: open, closed, local, error",
                given.value
            ),
        );
    }
    parsed
}

/// A descriptor's or a domain's `charge`, any case.
fn charge(field: &Field<String>, sink: &mut Sink) -> Option<Sp<Charge>> {
    let given = field.given()?;
    let parsed = Charge::parse(&given.value);
    if parsed.is_none() {
        sink.error(
            given.at,
            format!(
                "invalid charge `{}`; expected one of: if_allowed, always",
                given.value
            ),
        );
    }
    Some(Sp {
        value: parsed?,
        at: given.at,
        key_at: given.key_at,
    })
}

/// `rate_limit.algorithm` or a domain's `algorithm`, any case.
fn algorithm(field: &Field<String>, sink: &mut Sink) -> Option<Sp<Algorithm>> {
    let given = field.given()?;
    match Algorithm::parse(&given.value) {
        Some(algorithm) => Some(Sp {
            value: algorithm,
            at: given.at,
            key_at: given.key_at,
        }),
        None => {
            sink.error(
                given.at,
                format!(
                    "invalid algorithm `{}`; expected one of: {}",
                    given.value,
                    Algorithm::names()
                ),
            );
            None
        }
    }
}

fn flag(field: &Field<bool>) -> bool {
    field.given().is_some_and(|f| f.value)
}
