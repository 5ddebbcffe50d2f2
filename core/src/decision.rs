//! What a rate-limit decision says: one [`Status`] per descriptor, in request order, and the
//! request's overall [`Code`] ([`Decision`]).
//!
//! Plain data over [`crate::rule`]: the service crate's limiter produces it, the gRPC adapter
//! turns it into a response and telemetry counts it. Nothing here decides anything.

use std::sync::Arc;

use crate::rule::{FailureMode, RateLimit, Rule, Unit};

/// The outcome of one descriptor, or of the whole request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit a status reports (`current_limit` in Envoy's response).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// Units per window (`requests_per_unit` per `unit_multiplier` × `unit`).
    pub unit_multiplier: u32,
    pub capacity: u64,
    pub name: Option<Arc<str>>,
}

impl AppliedLimit {
    /// The limit `rate` reports, under the rule's `name` (`None`: unnamed, or an override).
    pub fn new(rate: &RateLimit, name: Option<Arc<str>>) -> Self {
        debug_assert!(rate.unit_multiplier >= 1, "a window of at least one unit");
        AppliedLimit {
            requests_per_unit: rate.requests_per_unit,
            unit: rate.unit,
            unit_multiplier: rate.unit_multiplier,
            capacity: rate.capacity(),
            name,
        }
    }

    /// The window's length in seconds: `unit_multiplier` × `unit`.
    pub const fn window_secs(&self) -> u64 {
        crate::rule::window_secs(self.unit, self.unit_multiplier)
    }
}

/// How a descriptor was judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// No rule reached (or the domain is unknown, or the rule reached is replaced by another
    /// one in the same request, which envoyproxy/ratelimit answers as no limit): not limited.
    NoRule,
    /// An `unlimited: true` rule.
    Unlimited,
    /// A `requests_per_unit: 0` rule or request override: OVER_LIMIT without a bucket, the
    /// backend not asked.
    Blocked,
    /// The shared backend answered.
    Backend,
    /// The backend could not answer; the failure policy decided (`Open`, `Closed` or `Local`;
    /// `Error` fails the whole call instead).
    Degraded(FailureMode),
    /// OVER_LIMIT answered from the local over-limit cache: the backend rejected this bucket
    /// moments ago with a retry-after that has not passed, so it was not asked.
    Cached,
    /// Not evaluated: another descriptor of the request was answered OVER_LIMIT from the
    /// over-limit cache, so the request is rejected and this bucket was neither asked nor
    /// charged. Reported with code OK and no limit (its state is unknown).
    NotEvaluated,
}

/// One descriptor's answer, in request order.
#[derive(Clone, Debug, PartialEq)]
pub struct Status {
    pub code: Code,
    pub basis: Basis,
    pub limit: Option<AppliedLimit>,
    pub remaining: u64,
    /// ms until the bucket is full again (Envoy's `duration_until_reset`).
    pub reset_ms: u64,
    /// Only when this descriptor's bucket could not pay: ms until it can (`None` = never).
    pub retry_after_ms: Option<Option<u64>>,
    /// A shadow-mode rule: over-limit is reported here but never rejects.
    pub shadow: bool,
    /// The bucket could not pay (also true for shadow rules, whose `code` stays OK).
    pub over: bool,
    /// A quota-mode descriptor (`quota_mode: true`, or `--quota-mode`): its own `code` says
    /// whether it is over, but it rejects the request only together with every other quota
    /// descriptor of the request ([`overall`]).
    pub quota: bool,
    /// The rule that decided, for metrics and explain.
    pub rule: Option<Arc<Rule>>,
}

impl Status {
    /// The OK status of a descriptor no bucket limits: `basis` is [`Basis::NoRule`] or
    /// [`Basis::Unlimited`] (which reports `u32::MAX` remaining; any other basis reports 0).
    pub fn unlimited(basis: Basis, rule: Option<Arc<Rule>>) -> Self {
        Status {
            code: Code::Ok,
            basis,
            limit: None,
            remaining: if basis == Basis::Unlimited {
                u32::MAX as u64
            } else {
                0
            },
            reset_ms: 0,
            retry_after_ms: None,
            shadow: false,
            over: false,
            quota: false,
            rule,
        }
    }
}

impl Status {
    /// The status of a descriptor reaching a `requests_per_unit: 0` rule: OVER_LIMIT (OK in
    /// shadow mode) against `{0, unit}`, nothing remaining, a retry-after of never (waiting does
    /// not help, so no `retry-after` header), reset at the next `unit` boundary on the clock as envoyproxy/ratelimit reports it.
    pub fn blocked(rule: Arc<Rule>, unit: Unit, name: Option<Arc<str>>, now_ms: u64) -> Self {
        let shadow = rule.shadow_mode;
        let quota = rule.quota_mode;
        Status {
            quota,
            ..Status::blocking(Some(rule), shadow, unit, name, now_ms)
        }
    }

    /// The status of a descriptor whose request `limit` override is 0 requests per `unit`:
    /// blocked as by such a rule, as envoyproxy/ratelimit does it, but never in shadow mode and
    /// without a name (an override has neither). `rule` is the one the descriptor reached, if
    /// any, whose metrics count the rejection.
    pub fn blocked_by_override(rule: Option<Arc<Rule>>, unit: Unit, now_ms: u64) -> Self {
        Status::blocking(rule, false, unit, None, now_ms)
    }

    fn blocking(
        rule: Option<Arc<Rule>>,
        shadow: bool,
        unit: Unit,
        name: Option<Arc<str>>,
        now_ms: u64,
    ) -> Self {
        let unit_ms = unit.millis();
        Status {
            code: if shadow { Code::Ok } else { Code::OverLimit },
            basis: Basis::Blocked,
            limit: Some(AppliedLimit {
                requests_per_unit: 0,
                unit,
                unit_multiplier: 1,
                capacity: 0,
                name,
            }),
            remaining: 0,
            reset_ms: unit_ms - now_ms % unit_ms,
            retry_after_ms: Some(None),
            shadow,
            over: true,
            quota: false,
            rule,
        }
    }
}

/// The request's overall code from its descriptors' (envoyproxy/ratelimit's rule): OVER_LIMIT
/// when an ordinary descriptor is, or when the request has quota-mode descriptors and every one
/// of them is.
pub fn overall(statuses: &[Status]) -> Code {
    let (mut quota_seen, mut quota_passed) = (false, false);
    for status in statuses {
        let over = status.code == Code::OverLimit;
        if status.quota {
            quota_seen = true;
            quota_passed |= !over;
        } else if over {
            return Code::OverLimit;
        }
    }
    if quota_seen && !quota_passed {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// The answer to a whole request.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub overall: Code,
    pub statuses: Vec<Status>,
    pub unknown_domain: bool,
    /// The other limits of descriptors with several (`rate_limits`): the descriptor's place in
    /// the request and the status of a limit that did not answer for it. Only per-limit metrics
    /// read these; the response carries `statuses`.
    pub other_limits: Vec<(usize, Status)>,
}

impl Decision {
    /// True when a failure policy, not the backend, decided at least one descriptor.
    pub fn degraded(&self) -> bool {
        self.statuses
            .iter()
            .any(|s| matches!(s.basis, Basis::Degraded(_)))
    }

    /// The failure policies that decided some descriptor, each once, in request order.
    pub fn degraded_modes(&self) -> Vec<FailureMode> {
        let mut modes = Vec::new();
        for status in &self.statuses {
            if let Basis::Degraded(mode) = status.basis
                && !modes.contains(&mode)
            {
                modes.push(mode);
            }
        }
        modes
    }
}
