//! Checks that need a domain's defaults, run once every file of a domain is read (and merged):
//! fields that mean nothing for the algorithm or `charge` a rule ends up with, and the names
//! `replaces` may refer to across the files.

use super::Sink;
use super::compile;
use super::raw::Sp;
use super::spec::{DescriptorSpec, RuleSpec};
use super::yaml::Pos;
use crate::algorithm::Algorithm;
use crate::rule::{Charge, Origin};

/// Where a domain's rules get their algorithm when they name none.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AlgorithmDefault<'a> {
    /// The domain's `algorithm` and the file it is written in.
    pub domain: Option<(&'a Sp<Algorithm>, &'a str)>,
    /// `--default-algorithm`.
    pub global: Algorithm,
}

/// Fields that mean nothing for the algorithm a rule ends up with: `burst` with a window. Run once
/// the domain's default is known (after merging the files of a domain).
pub(crate) fn algorithm_fields(
    descriptors: &[DescriptorSpec],
    default: AlgorithmDefault<'_>,
    sink: &mut Sink,
) {
    for d in descriptors {
        for rule in d.limits() {
            limit_algorithm_fields(rule, default, sink);
        }
        algorithm_fields(&d.children, default, sink);
    }
}

/// [`algorithm_fields`] of one limit.
fn limit_algorithm_fields(rule: &RuleSpec, default: AlgorithmDefault<'_>, sink: &mut Sink) {
    if let Some(lease_at) = rule.lease_at {
        let (algorithm, from) = resolved_algorithm(rule, default);
        if !algorithm.takes_lease() {
            sink.error(
                lease_at,
                format!(
                    "`lease` does not apply to `{algorithm}` (from {from}): a token taken in one window could be spent in the next; use `token_bucket` or `gcra` to lease"
                ),
            );
        }
    }
    if let Some(reserve_at) = rule.reserve_at {
        let (algorithm, from) = resolved_algorithm(rule, default);
        if !algorithm.takes_lease() {
            sink.error(
                reserve_at,
                format!(
                    "`reserve` does not apply to `{algorithm}` (from {from}): a window that has ended cannot take back the unused part of a reservation made in it; use `token_bucket` or `gcra`"
                ),
            );
        }
    }
    if let Some(burst_at) = rule.burst_at {
        let (algorithm, from) = resolved_algorithm(rule, default);
        if !algorithm.takes_burst() {
            sink.error(
                burst_at,
                format!(
                    "`burst` does not apply to `{algorithm}` (from {from}): a window admits `requests_per_unit` per window; remove it, or use `token_bucket` or `gcra` for a burst"
                ),
            );
        }
    }
}

/// The algorithm a rule ends up with ([`compile::resolved_algorithm`]), and where it comes from
/// in words (for messages).
fn resolved_algorithm(rule: &RuleSpec, default: AlgorithmDefault<'_>) -> (Algorithm, String) {
    let (algorithm, origin) = compile::resolved_algorithm(
        rule.algorithm.as_ref().map(|a| a.value),
        default.domain.map(|(domain, _)| domain.value),
        default.global,
    );
    let from = match (origin, default.domain) {
        (Origin::Rule, _) => "its `algorithm`".to_owned(),
        (Origin::Domain, Some((domain, file))) => format!(
            "the domain's `algorithm` at {file}:{}:{}",
            domain.at.line, domain.at.column
        ),
        (Origin::Domain | Origin::Default, _) => "--default-algorithm".to_owned(),
    };
    (algorithm, from)
}

/// Where a domain's rules get their `charge` when they name none.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChargeDefault<'a> {
    /// The domain's `charge` and the file it is written in.
    pub domain: Option<(&'a Sp<Charge>, &'a str)>,
    /// `--default-charge`.
    pub global: Charge,
}

/// `lease` on a rule whose charges always land: a lease pays hits from tokens taken earlier, so
/// a charge that did not fit could never be counted in full. Run once the domain's default is
/// known.
pub(crate) fn charge_fields(
    descriptors: &[DescriptorSpec],
    default: ChargeDefault<'_>,
    sink: &mut Sink,
) {
    for d in descriptors {
        if let Some(rule) = &d.rule
            && let Some(lease_at) = rule.lease_at
        {
            let from = match (&rule.charge, default.domain) {
                (Some(own), _) => (own.value == Charge::Always).then(|| "its `charge`".to_owned()),
                (None, Some((domain, file))) => (domain.value == Charge::Always).then(|| {
                    format!(
                        "the domain's `charge` at {file}:{}:{}",
                        domain.at.line, domain.at.column
                    )
                }),
                (None, None) => {
                    (default.global == Charge::Always).then(|| "--default-charge".to_owned())
                }
            };
            if let Some(from) = from {
                sink.error(
                    lease_at,
                    format!(
                        "`lease` does not apply to a rule whose charges always land (`charge: always`, from {from}): a leased hit is paid before the backend sees it, so a charge that does not fit could not be counted; remove `lease` or set `charge: if_allowed`"
                    ),
                );
            }
        }
        charge_fields(&d.children, default, sink);
    }
}

/// Every named rule under `descriptors` with its descriptor's position, depth-first in config
/// order (for checks across the files of a merged domain).
pub(crate) fn named_rules<'a>(descriptors: &'a [DescriptorSpec], out: &mut Vec<(&'a str, Pos)>) {
    for d in descriptors {
        for name in d.limits().filter_map(|r| r.name.as_deref()) {
            out.push((name, d.at));
        }
        named_rules(&d.children, out);
    }
}
