//! Per-rule decision counters: envoyproxy/ratelimit's `ratelimit_service_rate_limit_*` family.
//!
//! Every rule of the active config gets one [`RuleCounters`] (plain atomics) when the config is
//! first seen: its attribute set is built then, so counting a decision is an index, a pointer
//! compare and a few relaxed atomic adds — no hashing, no allocation. The SDK reads the atomics
//! through observable counters at collection time ([`super::metrics`]).
//!
//! A rule that keeps its place in the descriptor tree (same domain and path) keeps its counters
//! across reloads, so a limit edit does not reset them. A rule that leaves the config leaves the
//! export with it.
//!
//! Cardinality is bounded by the config: one series per rule and counter, plus, for a
//! `detailed_metric` rule, one per distinct descriptor value up to `detailed_max` (later values
//! are counted in the rule's own series), so at most `rules + detailed_rules × detailed_max`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use arc_swap::ArcSwap;
use opentelemetry::KeyValue;

use crate::config::Config;
use crate::decision::{Basis, Decision, Status};
use crate::request::{Entry, LimitRequest};
use crate::rule::{Charge, FailureMode, Rule};

/// The per-rule counters, in envoyproxy/ratelimit's names (its Prometheus mapper's output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    TotalHits,
    OverLimit,
    NearLimit,
    WithinLimit,
    ShadowMode,
    OverLimitWithLocalCache,
    /// sluice's own: always-charges that did not fit (`charge: always`).
    ChargesInDebt,
}

impl Counter {
    pub const ALL: [Counter; 7] = [
        Counter::TotalHits,
        Counter::OverLimit,
        Counter::NearLimit,
        Counter::WithinLimit,
        Counter::ShadowMode,
        Counter::OverLimitWithLocalCache,
        Counter::ChargesInDebt,
    ];

    pub const fn metric_name(self) -> &'static str {
        match self {
            Counter::TotalHits => "ratelimit_service_rate_limit_total_hits",
            Counter::OverLimit => "ratelimit_service_rate_limit_over_limit",
            Counter::NearLimit => "ratelimit_service_rate_limit_near_limit",
            Counter::WithinLimit => "ratelimit_service_rate_limit_within_limit",
            Counter::ShadowMode => "ratelimit_service_rate_limit_shadow_mode",
            Counter::OverLimitWithLocalCache => {
                "ratelimit_service_rate_limit_over_limit_with_local_cache"
            }
            Counter::ChargesInDebt => "sluice_charges_in_debt_total",
        }
    }

    pub const fn description(self) -> &'static str {
        match self {
            Counter::TotalHits => "Hits (hits_addend, default 1) that reached the rule",
            Counter::OverLimit => "Hits the rule's bucket could not pay",
            Counter::NearLimit => {
                "Allowed hits that left the bucket past the near-limit ratio of its capacity"
            }
            Counter::WithinLimit => "Hits the rule's bucket paid",
            Counter::ShadowMode => "Over-limit hits of a shadow-mode rule (answered OK)",
            Counter::OverLimitWithLocalCache => {
                "Over-limit hits answered from the local over-limit cache without asking the backend"
            }
            Counter::ChargesInDebt => {
                "Charges of a `charge: always` rule counted although they did not fit: each drove or kept its key in debt (below empty, or past the window's limit)"
            }
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// What one descriptor status adds to its rule's counters, in hits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub total_hits: u64,
    pub over_limit: u64,
    pub near_limit: u64,
    pub within_limit: u64,
    pub shadow_mode: u64,
    pub over_limit_with_local_cache: u64,
    /// Charges (not hits) that put or kept an always-charged key in debt.
    pub charges_in_debt: u64,
}

impl Tally {
    fn get(&self, counter: Counter) -> u64 {
        match counter {
            Counter::TotalHits => self.total_hits,
            Counter::OverLimit => self.over_limit,
            Counter::NearLimit => self.near_limit,
            Counter::WithinLimit => self.within_limit,
            Counter::ShadowMode => self.shadow_mode,
            Counter::OverLimitWithLocalCache => self.over_limit_with_local_cache,
            Counter::ChargesInDebt => self.charges_in_debt,
        }
    }
}

/// The counts of one status: `hits` asked for (0 for a refund or a check-only descriptor),
/// `cost` tokens per hit, `near_ratio` the near-limit ratio.
///
/// As envoyproxy/ratelimit counts them: total = within + over for a decided bucket; shadow-mode
/// over-limit hits count as over limit *and* shadow mode; unlimited or replaced rules count
/// nothing. Decisions made by a failure policy count only as hits (they are counted by policy in
/// `sluice_degraded_decisions_total`), since no bucket was asked; so do descriptors left
/// unevaluated because a sibling was rejected from the over-limit cache. A rejection from that
/// cache counts as over limit and as `over_limit_with_local_cache`, as in envoyproxy/ratelimit.
/// A take of a `charge: always` rule that the backend counted although it did not fit is one
/// charge in debt.
pub fn tally(status: &Status, hits: u64, cost: u64, near_ratio: f64) -> Tally {
    let mut t = Tally {
        total_hits: hits,
        ..Tally::default()
    };
    match status.basis {
        Basis::NoRule | Basis::Unlimited => return Tally::default(),
        // No bucket decided: a failure policy, or a sibling descriptor rejected from the
        // over-limit cache before anything was asked.
        Basis::Degraded(_) | Basis::NotEvaluated => {}
        // A blocking rule rejects every hit without a bucket.
        Basis::Blocked => {
            t.over_limit = hits;
            if status.shadow {
                t.shadow_mode = hits;
            }
        }
        Basis::Cached => {
            t.over_limit = hits;
            t.over_limit_with_local_cache = hits;
            if status.shadow {
                t.shadow_mode = hits;
            }
        }
        Basis::Backend if status.over => {
            t.over_limit = hits;
            let always = status
                .rule
                .as_ref()
                .is_some_and(|r| r.charge == Charge::Always);
            if always && hits > 0 {
                t.charges_in_debt = 1;
            }
            if status.shadow {
                t.shadow_mode = hits;
            }
        }
        Basis::Backend => {
            t.within_limit = hits;
            if let Some(limit) = &status.limit {
                t.near_limit = near_hits(hits, cost, limit.capacity, status.remaining, near_ratio);
            }
        }
    }
    t
}

/// Allowed hits that land past the near-limit threshold.
///
/// For a token bucket: the threshold is `⌊capacity × ratio⌋` tokens used; a hit is near limit
/// when the tokens it took end beyond it, i.e. when after the request fewer than
/// `capacity − ⌊capacity × ratio⌋` whole tokens are left. For a bucket that does not refill in
/// between this is envoyproxy/ratelimit's "hits beyond ratio × limit" exactly (capacity 10,
/// ratio 0.8: the 9th and 10th hit); a request of several hits counts only those of its hits
/// whose tokens fall beyond the threshold.
pub fn near_hits(hits: u64, cost: u64, capacity: u64, remaining: u64, ratio: f64) -> u64 {
    let cost = cost.max(1);
    let threshold = (capacity as f64 * ratio).floor() as u64;
    let used = capacity.saturating_sub(remaining);
    if used <= threshold {
        return 0;
    }
    let past = (used - threshold).min(hits.saturating_mul(cost));
    past.div_ceil(cost).min(hits)
}

/// Counters of one rule (or of one descriptor value of a `detailed_metric` rule).
pub struct RuleCounters {
    /// `domain`, `key` (the descriptor path below the domain, as envoyproxy/ratelimit's stat key).
    pub attrs: Box<[KeyValue]>,
    counts: [AtomicU64; Counter::ALL.len()],
    detailed: Option<Detailed>,
}

/// The per-value series of a `detailed_metric` rule, bounded.
struct Detailed {
    domain: Arc<str>,
    max: usize,
    values: RwLock<HashMap<Box<str>, Arc<RuleCounters>>>,
    /// The bound was reached once (logged once).
    full: AtomicBool,
}

/// Longest runtime key kept in a label; longer ones are cut (and may share a series).
const MAX_DETAILED_KEY_BYTES: usize = 256;

impl RuleCounters {
    fn new(domain: &Arc<str>, key: &str, detailed: Option<usize>) -> RuleCounters {
        RuleCounters {
            attrs: vec![
                KeyValue::new("domain", domain.to_string()),
                KeyValue::new("key", key.to_owned()),
            ]
            .into_boxed_slice(),
            counts: Default::default(),
            detailed: detailed.map(|max| Detailed {
                domain: domain.clone(),
                max,
                values: RwLock::new(HashMap::new()),
                full: AtomicBool::new(false),
            }),
        }
    }

    fn for_rule(rule: &Rule, detailed_max: usize) -> RuleCounters {
        let key = rule
            .path
            .strip_prefix(&*rule.domain)
            .and_then(|rest| rest.strip_prefix('.'))
            .unwrap_or(&rule.path);
        RuleCounters::new(&rule.domain, key, per_value(rule).then_some(detailed_max))
    }

    pub fn get(&self, counter: Counter) -> u64 {
        self.counts[counter.index()].load(Ordering::Relaxed)
    }

    /// Adds a status's hits. Each addition is at most `--max-hits-addend` (larger requests are
    /// refused before deciding); a counter that would pass 2^64 - 1 stays there rather than
    /// wrapping to a value a scraper would read as a reset.
    fn add(&self, tally: &Tally) {
        for counter in Counter::ALL {
            let n = tally.get(counter);
            if n > 0 {
                let count = &self.counts[counter.index()];
                if count
                    .fetch_add(n, Ordering::Relaxed)
                    .checked_add(n)
                    .is_none()
                {
                    count.store(u64::MAX, Ordering::Relaxed);
                }
            }
        }
    }

    /// Where a descriptor's counts go: the rule's own series, or its value's for a
    /// `detailed_metric` or `value_to_metric` rule while under the bound.
    fn record(&self, rule: &Rule, entries: &[Entry], tally: &Tally) {
        let Some(detailed) = &self.detailed else {
            self.add(tally);
            return;
        };
        let key = runtime_key(rule, entries);
        let found = detailed
            .values
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key.as_str())
            .cloned();
        let series = found.or_else(|| {
            let mut values = detailed
                .values
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(existing) = values.get(key.as_str()) {
                return Some(existing.clone());
            }
            if values.len() >= detailed.max {
                if !detailed.full.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        domain = %detailed.domain,
                        max = detailed.max,
                        "detailed_metric: value bound reached; further values are counted in the rule's own series"
                    );
                }
                return None;
            }
            let series = Arc::new(RuleCounters::new(&detailed.domain, &key, None));
            values.insert(key.into_boxed_str(), series.clone());
            Some(series)
        });
        match series {
            Some(series) => series.add(tally),
            None => self.add(tally),
        }
    }

    /// This series and, for a detailed rule, its value series.
    fn visit(&self, f: &mut dyn FnMut(&RuleCounters)) {
        f(self);
        if let Some(detailed) = &self.detailed {
            for series in detailed
                .values
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
            {
                f(series);
            }
        }
    }
}

/// A rule whose counts go to per-value series: `detailed_metric`, or `value_to_metric` on some
/// level of its path. Both are bounded by `--detailed-metric-max-values`.
fn per_value(rule: &Rule) -> bool {
    rule.detailed_metric || !rule.metric_levels.is_empty()
}

/// envoyproxy/ratelimit's runtime stat key of a descriptor reaching `rule`, joined by `.` and cut
/// at [`MAX_DETAILED_KEY_BYTES`]. Per entry `key`, then `_` and a value where one is named:
/// - a `share_threshold` level: its wildcard pattern (all its values are one bucket);
/// - else under `detailed_metric`: the request's value;
/// - else under `value_to_metric` on that level: the request's value;
/// - else the configured value or pattern (none for a key-only descriptor).
fn runtime_key(rule: &Rule, entries: &[Entry]) -> String {
    let mut key = String::new();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            key.push('.');
        }
        key.push_str(&entry.key);
        let shared = rule.shared_values.get(i).and_then(Option::as_deref);
        let level = rule.metric_levels.get(i);
        // A detailed key always joins key and value with `_`, even an empty value (`key_`), as
        // envoyproxy/ratelimit's detailed stats do; the other shapes drop the `_` with no value.
        // A request value that is not UTF-8 is written as `Value`'s `Display` writes it (`\xFF`).
        let (value, joined) = match (shared, level) {
            (Some(pattern), _) => (pattern.into(), false),
            _ if rule.detailed_metric => (entry.value.to_text(), true),
            (None, Some(level)) if level.value_to_metric => (entry.value.to_text(), false),
            (None, Some(level)) => (level.value.as_deref().unwrap_or("").into(), false),
            (None, None) => (entry.value.to_text(), false),
        };
        if joined || !value.is_empty() {
            key.push('_');
            key.push_str(&value);
        }
        if key.len() > MAX_DETAILED_KEY_BYTES {
            let mut end = MAX_DETAILED_KEY_BYTES;
            while !key.is_char_boundary(end) {
                end -= 1;
            }
            key.truncate(end);
            break;
        }
    }
    key
}

/// Degraded decisions of one domain, by failure policy.
pub struct DomainCounters {
    /// `domain`, `policy` for open, closed, local.
    pub attrs: [Box<[KeyValue]>; 3],
    counts: [AtomicU64; 3],
}

const POLICIES: [FailureMode; 3] = [FailureMode::Open, FailureMode::Closed, FailureMode::Local];

impl DomainCounters {
    fn new(domain: &str) -> DomainCounters {
        DomainCounters {
            attrs: POLICIES.map(|policy| {
                vec![
                    KeyValue::new("domain", domain.to_owned()),
                    KeyValue::new("policy", policy.as_str()),
                ]
                .into_boxed_slice()
            }),
            counts: Default::default(),
        }
    }

    pub fn get(&self, policy_index: usize) -> u64 {
        self.counts[policy_index].load(Ordering::Relaxed)
    }

    fn add(&self, policy: FailureMode) {
        if let Some(i) = POLICIES.iter().position(|p| *p == policy) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The counters of one config's rules, indexed by [`crate::rule::RuleId`].
struct RuleTable {
    config: Arc<Config>,
    /// Each rule with its counters; the rule identifies the config the entry belongs to.
    rules: Vec<(Arc<Rule>, Arc<RuleCounters>)>,
    /// (domain, path) → index in `rules`: continuity across reloads, and statuses from a config
    /// replaced while they were decided.
    by_path: HashMap<(Arc<str>, Arc<str>), usize>,
    domains: HashMap<Arc<str>, Arc<DomainCounters>>,
}

impl RuleTable {
    fn build(config: Arc<Config>, previous: Option<&RuleTable>, detailed_max: usize) -> RuleTable {
        let mut rules = Vec::with_capacity(config.rule_count());
        let mut by_path = HashMap::with_capacity(config.rule_count());
        for rule in config.rules() {
            let identity = (rule.domain.clone(), rule.path.clone());
            let kept = previous
                .and_then(|p| p.by_path.get(&identity).map(|&i| &p.rules[i].1))
                .filter(|c| c.detailed.is_some() == per_value(rule))
                .cloned();
            let counters =
                kept.unwrap_or_else(|| Arc::new(RuleCounters::for_rule(rule, detailed_max)));
            by_path.insert(identity, rules.len());
            rules.push((rule.clone(), counters));
        }
        let domains = config
            .domains()
            .map(|d| {
                let kept = previous.and_then(|p| p.domains.get(&d.name)).cloned();
                let counters = kept.unwrap_or_else(|| Arc::new(DomainCounters::new(&d.name)));
                (d.name.clone(), counters)
            })
            .collect();
        RuleTable {
            config,
            rules,
            by_path,
            domains,
        }
    }

    fn counters(&self, rule: &Arc<Rule>) -> Option<&RuleCounters> {
        match self.rules.get(rule.id.0 as usize) {
            Some((r, c)) if Arc::ptr_eq(r, rule) => Some(c),
            // Decided on a config replaced meanwhile: the same rule by identity, if it stayed.
            _ => self
                .by_path
                .get(&(rule.domain.clone(), rule.path.clone()))
                .map(|&i| &*self.rules[i].1),
        }
    }
}

/// The per-rule and per-domain counters of whichever config is active.
pub struct RuleMetrics {
    config: Arc<ArcSwap<Config>>,
    table: ArcSwap<RuleTable>,
    rebuild: Mutex<()>,
    near_ratio: f64,
    detailed_max: usize,
}

impl RuleMetrics {
    pub fn new(config: Arc<ArcSwap<Config>>, near_ratio: f64, detailed_max: usize) -> Self {
        let table = RuleTable::build(config.load_full(), None, detailed_max);
        RuleMetrics {
            config,
            table: ArcSwap::from_pointee(table),
            rebuild: Mutex::new(()),
            near_ratio,
            detailed_max,
        }
    }

    /// The table of the active config, built on first sight of a new config.
    fn current(&self) -> arc_swap::Guard<Arc<RuleTable>> {
        let table = self.table.load();
        let active = self.config.load();
        if Arc::ptr_eq(&table.config, &active) {
            return table;
        }
        drop(table);
        let _one_at_a_time = self.rebuild.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = self.table.load_full();
        let active = self.config.load_full();
        if !Arc::ptr_eq(&previous.config, &active) {
            let built = RuleTable::build(active, Some(&previous), self.detailed_max);
            self.table.store(Arc::new(built));
        }
        self.table.load()
    }

    /// Counts one decided request. `request` is the one `decision` answers (statuses in order).
    pub fn record(&self, request: &LimitRequest, decision: &Decision) {
        let table = self.current();
        let statuses = request.descriptors.iter().zip(&decision.statuses);
        let other_limits = decision
            .other_limits
            .iter()
            .filter_map(|(i, status)| Some((request.descriptors.get(*i)?, status)));
        for (descriptor, status) in statuses.chain(other_limits) {
            if let Basis::Degraded(policy) = status.basis
                && let Some(domain) = table.domains.get(request.domain.as_str())
            {
                domain.add(policy);
            }
            let Some(rule) = &status.rule else { continue };
            if descriptor.is_negative_hits {
                continue;
            }
            let hits = descriptor.hits(request.hits_addend);
            let tally = tally(status, hits, rule.cost, self.near_ratio);
            if tally == Tally::default() {
                continue;
            }
            if let Some(counters) = table.counters(rule) {
                counters.record(rule, &descriptor.entries, &tally);
            }
        }
    }

    /// Calls `f` with every rule series (and detailed value series) and its value of `counter`.
    pub fn each(&self, counter: Counter, f: &mut dyn FnMut(u64, &[KeyValue])) {
        let table = self.current();
        for (_, counters) in &table.rules {
            counters.visit(&mut |series| f(series.get(counter), &series.attrs));
        }
    }

    /// Calls `f` with every domain's degraded count per policy.
    pub fn each_degraded(&self, f: &mut dyn FnMut(u64, &[KeyValue])) {
        let table = self.current();
        for counters in table.domains.values() {
            for (i, attrs) in counters.attrs.iter().enumerate() {
                f(counters.get(i), attrs);
            }
        }
    }

    /// Upper bound on the series one per-rule metric can have under the active config.
    pub fn series_bound(&self) -> usize {
        let table = self.current();
        table
            .rules
            .iter()
            .map(|(rule, _)| {
                1 + if rule.detailed_metric {
                    self.detailed_max
                } else {
                    0
                }
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{AppliedLimit, Code};
    use crate::rule::Unit;

    fn status(basis: Basis, over: bool, shadow: bool, capacity: u64, remaining: u64) -> Status {
        Status {
            code: if over && !shadow {
                Code::OverLimit
            } else {
                Code::Ok
            },
            basis,
            limit: Some(AppliedLimit {
                requests_per_unit: capacity as u32,
                unit: Unit::Minute,
                unit_multiplier: 1,
                capacity,
                name: None,
            }),
            remaining,
            reset_ms: 0,
            retry_after_ms: None,
            shadow,
            over,
            quota: false,
            rule: None,
        }
    }

    #[test]
    fn near_limit_matches_envoyproxy_for_a_bucket_that_does_not_refill() {
        // Capacity 10, ratio 0.8: envoyproxy counts the 9th and 10th hit as near limit.
        let near: Vec<u64> = (1..=10).map(|n| near_hits(1, 1, 10, 10 - n, 0.8)).collect();
        assert_eq!(near, [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]);
        // Three hits taking the bucket from 7 used to 10: two of them are past 8.
        assert_eq!(near_hits(3, 1, 10, 0, 0.8), 2);
        // Cost 5, capacity 20 (threshold 16): a hit from 15 to 20 used lands past it.
        assert_eq!(near_hits(1, 5, 20, 0, 0.8), 1);
        assert_eq!(near_hits(2, 5, 20, 5, 0.8), 0);
        // Ratio 1: nothing allowed is ever near (used never exceeds capacity).
        assert_eq!(near_hits(1, 1, 10, 0, 1.0), 0);
        assert_eq!(near_hits(0, 1, 10, 0, 0.8), 0);
    }

    #[test]
    fn tallies_follow_envoyproxy() {
        let ok = tally(&status(Basis::Backend, false, false, 10, 5), 2, 1, 0.8);
        assert_eq!(
            ok,
            Tally {
                total_hits: 2,
                within_limit: 2,
                ..Tally::default()
            }
        );
        let over = tally(&status(Basis::Backend, true, false, 10, 0), 1, 1, 0.8);
        assert_eq!(
            (over.total_hits, over.over_limit, over.within_limit),
            (1, 1, 0)
        );
        let shadow = tally(&status(Basis::Backend, true, true, 10, 0), 3, 1, 0.8);
        assert_eq!((shadow.over_limit, shadow.shadow_mode), (3, 3));
        let degraded = tally(
            &status(Basis::Degraded(FailureMode::Closed), true, false, 10, 0),
            1,
            1,
            0.8,
        );
        assert_eq!(
            degraded,
            Tally {
                total_hits: 1,
                ..Tally::default()
            }
        );
        assert_eq!(
            tally(&status(Basis::Unlimited, false, false, 10, 0), 1, 1, 0.8),
            Tally::default()
        );
    }

    /// A charge of a `charge: always` rule counted although it did not fit is one charge in
    /// debt, whatever its hits; a check-only call refused in debt, or an ordinary rule's
    /// refusal, is none.
    #[test]
    fn charges_in_debt_count_always_charges_that_did_not_fit() {
        let config = "domain: d\ndescriptors:\n  - key: t\n    charge: always\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: o\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
        let always = reached(config, &[Entry::new("t", "1")]);
        let ordinary = reached(config, &[Entry::new("o", "1")]);
        let with = |rule: &Arc<Rule>, over: bool| Status {
            rule: Some(rule.clone()),
            ..status(Basis::Backend, over, false, 100, 0)
        };
        let debt = tally(&with(&always, true), 60, 1, 0.8);
        assert_eq!((debt.over_limit, debt.charges_in_debt), (60, 1));
        assert_eq!(tally(&with(&always, true), 0, 1, 0.8).charges_in_debt, 0);
        assert_eq!(tally(&with(&always, false), 60, 1, 0.8).charges_in_debt, 0);
        assert_eq!(tally(&with(&ordinary, true), 60, 1, 0.8).charges_in_debt, 0);
        assert_eq!(
            Counter::ChargesInDebt.metric_name(),
            "sluice_charges_in_debt_total"
        );
    }

    /// The rule `entries` reach in domain `d` of `config`.
    fn reached(config: &str, entries: &[Entry]) -> Arc<Rule> {
        let config =
            crate::config::load_sources(&[("d.yaml".into(), config.into())]).expect("loads");
        config
            .domain("d")
            .and_then(|d| d.find(entries))
            .cloned()
            .expect("a rule")
    }

    #[test]
    fn detailed_keys_are_envoyproxys_and_bounded() {
        let e = |k: &str, v: &str| Entry::new(k, v);
        let config = "domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: route
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
";
        // envoyproxy/ratelimit joins `key_value` for a detailed key even when the value is empty.
        let entries = [e("tenant", "acme"), e("route", "")];
        assert_eq!(
            runtime_key(&reached(config, &entries), &entries),
            "tenant_acme.route_"
        );
        let entries = [e("k", &"é".repeat(300))];
        let long = runtime_key(&reached(config, &entries), &entries);
        assert!(long.len() <= MAX_DETAILED_KEY_BYTES, "{}", long.len());
        let rule = reached(config, &[e("k", "x")]);
        let e = |k: &str, v: &str| Entry::new(k, v);
        let counters = RuleCounters::new(&Arc::from("d"), "k", Some(2));
        let one = Tally {
            total_hits: 1,
            ..Tally::default()
        };
        for value in ["a", "b", "c", "a"] {
            counters.record(&rule, &[e("k", value)], &one);
        }
        let mut seen = Vec::new();
        counters
            .visit(&mut |s| seen.push((s.attrs[1].value.to_string(), s.get(Counter::TotalHits))));
        seen.sort();
        // Two values get their own series; the third is folded into the rule's.
        assert_eq!(
            seen,
            [
                ("k".to_string(), 1),
                ("k_a".to_string(), 2),
                ("k_b".to_string(), 1)
            ]
        );
    }

    #[test]
    fn counters_saturate_instead_of_wrapping() {
        let counters = RuleCounters::new(&Arc::from("d"), "tenant", None);
        let huge = Tally {
            total_hits: u64::MAX - 1,
            ..Tally::default()
        };
        counters.add(&huge);
        counters.add(&huge);
        assert_eq!(counters.get(Counter::TotalHits), u64::MAX);
    }

    /// envoyproxy/ratelimit's `value_to_metric` key: the request's value where a level asks for
    /// it, the configured value or pattern elsewhere, the pattern of a shared wildcard always.
    #[test]
    fn value_to_metric_keys_name_the_runtime_value_where_asked() {
        let config = "domain: d
descriptors:
  - key: route
    value: /api/*
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: user
        value_to_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /files/*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: plain
    value: /x/*
    rate_limit: {unit: second, requests_per_unit: 1}
";
        let key = |pairs: &[(&str, &str)]| {
            let entries: Vec<Entry> = pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
            let rule = reached(config, &entries);
            (per_value(&rule), runtime_key(&rule, &entries))
        };
        assert_eq!(
            key(&[("route", "/api/v1"), ("method", "GET")]),
            (true, "route_/api/v1.method".to_owned()),
            "a key-only level without the flag names only its key"
        );
        assert_eq!(
            key(&[("route", "/api/v1"), ("user", "ann")]),
            (true, "route_/api/v1.user_ann".to_owned())
        );
        assert_eq!(
            key(&[("path", "/files/a")]),
            (true, "path_/files/*".to_owned()),
            "share_threshold wins: one bucket, one series"
        );
        assert!(
            !key(&[("plain", "/x/1")]).0,
            "no flag: the rule's own series"
        );
    }
}
