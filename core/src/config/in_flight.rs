//! `in_flight` on a descriptor: a cap on requests in flight instead of a `rate_limit`.
//!
//! ```yaml
//! - key: inflight
//!   in_flight: {max: 2, holder: request_id, max_hold: 300s}
//! ```
//!
//! The rule it makes counts slots ([`Algorithm::InFlight`]); its reported limit is `max` per
//! second (Envoy's `current_limit` needs a unit; the cap has none).

use super::Sink;
use super::raw::{Field, RawDescriptor, RawInFlight, Sp};
use super::yaml::Pos;
use crate::algorithm::Algorithm;
use crate::rule::{InFlightRule, Limit, RateLimit, Unit};

/// `max_hold` when absent: long enough for any ordinary request, short enough that a crashed
/// Envoy's slots come back within minutes.
pub(crate) const DEFAULT_MAX_HOLD_MS: u64 = 300_000;
/// The longest `max_hold`: one day.
const MAX_HOLD_MAX_MS: u64 = 86_400_000;

/// What a descriptor's `in_flight` makes of its rule: the limit reported, the algorithm (where
/// `in_flight` is written) and the holder and hold.
pub(crate) struct Checked {
    pub limit: Limit,
    pub algorithm: Sp<Algorithm>,
    pub rule: InFlightRule,
}

/// Checks `raw.in_flight` (given): alone on its node (no `rate_limit`, `cost`), `max` >= 1, a
/// `holder` other than the node's own key and not the key of a child, a positive `max_hold`.
pub(crate) fn check(
    raw: &RawDescriptor,
    in_flight: &Sp<RawInFlight>,
    sink: &mut Sink,
) -> Option<Checked> {
    let mut ok = true;
    if raw.rate_limit.is_present() {
        sink.error(
            in_flight.key_at,
            "a descriptor takes `in_flight` or `rate_limit`, not both: put the other on a descriptor of its own",
        );
        ok = false;
    }
    if raw.rate_limits.is_present() {
        sink.error(
            in_flight.key_at,
            "a descriptor takes `in_flight` or `rate_limits`, not both: put the other on a descriptor of its own",
        );
        ok = false;
    }
    if let Some(cost) = raw.cost.given() {
        sink.error(
            cost.key_at,
            "`cost` does not apply to `in_flight`: a request holds one slot",
        );
        ok = false;
    }
    if let Some(charge) = raw.charge.given() {
        sink.error(
            charge.key_at,
            "`charge` does not apply to `in_flight`: a slot is taken only when free",
        );
        ok = false;
    }
    let value = &in_flight.value;
    let max = match &value.max {
        Field::Absent => {
            sink.error(in_flight.at, "`in_flight` is missing required field `max`");
            None
        }
        Field::Invalid => None,
        Field::Given(max) if (1..=i128::from(u32::MAX)).contains(&max.value) => {
            Some(max.value as u32)
        }
        Field::Given(max) => {
            sink.error(
                max.at,
                format!(
                    "`max` must be an integer from 1 to {}, got {}",
                    u32::MAX,
                    max.value
                ),
            );
            None
        }
    };
    let holder = holder(raw, in_flight, "in_flight", sink);
    let max_hold_ms = max_hold(&value.max_hold, sink);
    if !ok {
        return None;
    }
    Some(Checked {
        limit: Limit::Bucket(RateLimit {
            requests_per_unit: max?,
            unit: Unit::Second,
            unit_multiplier: 1,
            burst: None,
        }),
        algorithm: Sp {
            value: Algorithm::InFlight,
            at: in_flight.at,
            key_at: in_flight.key_at,
        },
        rule: InFlightRule {
            holder: holder?.into(),
            max_hold_ms: max_hold_ms?,
        },
    })
}

/// What a `reserve` sits beside on its descriptor's rule.
pub(crate) struct Beside<'a> {
    pub lease_at: Option<Pos>,
    pub shards: bool,
    pub quota_mode: bool,
    pub limit: &'a Limit,
}

/// `reserve` on a descriptor with a single `rate_limit`: its holder entry and longest hold, where
/// nothing else decides how its hits are taken — no `lease`, `shards`, `quota_mode` or `charge`,
/// and a bucket to take from. (Beside `rate_limits` or `in_flight`, and with a window algorithm,
/// it is refused where those are read.)
pub(crate) fn check_reserve(
    raw: &RawDescriptor,
    reserve: &Sp<RawInFlight>,
    beside: &Beside<'_>,
    sink: &mut Sink,
) -> Option<InFlightRule> {
    let mut ok = true;
    let mut refuse = |at: Pos, why: &str| {
        sink.error(at, format!("`reserve` does not combine with {why}"));
        ok = false;
    };
    if let Some(at) = beside.lease_at {
        refuse(
            at,
            "`lease`: a leased hit is paid before the reservation is made",
        );
    }
    if beside.shards {
        refuse(
            reserve.key_at,
            "`shards`: a reservation settles on the bucket it took from",
        );
    }
    if beside.quota_mode {
        refuse(
            reserve.key_at,
            "`quota_mode`: a reservation is taken only when it fits",
        );
    }
    if let Some(charge) = raw.charge.given() {
        refuse(
            charge.key_at,
            "`charge`: a reservation is taken only when it fits, and its settlement always lands",
        );
    }
    if !matches!(beside.limit, Limit::Bucket(_)) {
        refuse(
            reserve.key_at,
            "`unlimited` or `requests_per_unit: 0`: there is no bucket to reserve from",
        );
    }
    let holder = holder(raw, reserve, "reserve", sink);
    let max_hold_ms = max_hold(&reserve.value.max_hold, sink);
    if !ok {
        return None;
    }
    Some(InFlightRule {
        holder: holder?.into(),
        max_hold_ms: max_hold_ms?,
    })
}

/// The holder entry of `in_flight` or `reserve` (`field`).
fn holder<'a>(
    raw: &RawDescriptor,
    holding: &'a Sp<RawInFlight>,
    field: &str,
    sink: &mut Sink,
) -> Option<&'a str> {
    let holder = match &holding.value.holder {
        Field::Absent => {
            sink.error(
                holding.at,
                format!("`{field}` is missing required field `holder` (the descriptor entry naming who holds a slot, e.g. `request_id` from Envoy's x-request-id)"),
            );
            return None;
        }
        Field::Invalid => return None,
        Field::Given(h) => h,
    };
    let own_key = raw.key.given().map(|k| k.value.as_str());
    if holder.value.is_empty() {
        sink.error(holder.at, "`holder` must not be empty");
        return None;
    }
    if own_key == Some(holder.value.as_str()) {
        sink.error(
            holder.at,
            format!(
                "`holder` must name another entry than the descriptor's own key `{}`: the holder entry follows it",
                holder.value
            ),
        );
        return None;
    }
    let child = raw
        .descriptors
        .iter()
        .find(|c| c.key.given().is_some_and(|k| k.value == holder.value));
    if let Some(child) = child {
        sink.error(
            child.at,
            format!(
                "a descriptor under a `{field}` one cannot use its holder key `{}`: that entry names the holder",
                holder.value
            ),
        );
        return None;
    }
    Some(&holder.value)
}

/// `max_hold`: a duration (`300s`, `2s`, `500ms`, `5m`, `1h`), from 1 ms to a day; default 300 s.
fn max_hold(field: &Field<String>, sink: &mut Sink) -> Option<u64> {
    let given = match field {
        Field::Absent => return Some(DEFAULT_MAX_HOLD_MS),
        Field::Invalid => return None,
        Field::Given(g) => g,
    };
    match parse_duration_ms(&given.value) {
        Some(ms) if (1..=MAX_HOLD_MAX_MS).contains(&ms) => Some(ms),
        _ => {
            sink.error(
                given.at,
                format!(
                    "`max_hold` must be a duration from 1ms to 24h such as `300s`, `500ms`, `5m`, got `{}`",
                    given.value
                ),
            );
            None
        }
    }
}

/// `<whole number><ms|s|m|h>`, in ms.
pub(crate) fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    n.checked_mul(per)
}

#[cfg(test)]
mod tests {
    use super::parse_duration_ms;
    use crate::config::load_sources;

    fn errors(text: &str) -> String {
        match load_sources(&[("f.yaml".to_owned(), text.to_owned())]) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    const HEAD: &str = "domain: d\ndescriptors:\n  - key: inflight\n";

    #[test]
    fn a_cap_loads_with_its_holder_and_hold() {
        let text = format!("{HEAD}    in_flight: {{max: 2, holder: request_id, max_hold: 2s}}\n");
        let config = load_sources(&[("f.yaml".to_owned(), text)]).unwrap();
        let rule = config.rules().next().unwrap();
        let f = rule.in_flight.as_ref().unwrap();
        assert_eq!((&*f.holder, f.max_hold_ms), ("request_id", 2_000));
        assert_eq!(rule.algorithm, crate::algorithm::Algorithm::InFlight);
        let defaulted = format!("{HEAD}    in_flight: {{max: 2, holder: request_id}}\n");
        let config = load_sources(&[("f.yaml".to_owned(), defaulted)]).unwrap();
        let hold = config
            .rules()
            .next()
            .unwrap()
            .in_flight
            .as_ref()
            .unwrap()
            .max_hold_ms;
        assert_eq!(hold, 300_000);
    }

    #[test]
    fn mistakes_are_reported_at_their_line() {
        let both = format!(
            "{HEAD}    rate_limit: {{unit: second, requests_per_unit: 1}}\n    in_flight: {{max: 2, holder: r}}\n"
        );
        assert!(errors(&both).contains("f.yaml:5:"), "{}", errors(&both));
        assert!(errors(&both).contains("`in_flight` or `rate_limit`, not both"));
        let zero = format!("{HEAD}    in_flight: {{max: 0, holder: r}}\n");
        assert!(
            errors(&zero).contains("`max` must be an integer from 1"),
            "{}",
            errors(&zero)
        );
        let own = format!("{HEAD}    in_flight: {{max: 1, holder: inflight}}\n");
        assert!(errors(&own).contains("another entry than the descriptor's own key"));
        let unknown = format!("{HEAD}    in_flight: {{max: 1, holder: r, slots: 3}}\n");
        assert!(errors(&unknown).contains("unknown field `slots` in `in_flight`"));
        let hold = format!("{HEAD}    in_flight: {{max: 1, holder: r, max_hold: soon}}\n");
        assert!(errors(&hold).contains("`max_hold` must be a duration"));
        let missing = format!("{HEAD}    in_flight: {{max: 1}}\n");
        assert!(errors(&missing).contains("missing required field `holder`"));
        let child = format!(
            "{HEAD}    in_flight: {{max: 1, holder: r}}\n    descriptors:\n      - key: r\n        rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        );
        assert!(
            errors(&child).contains("cannot use its holder key `r`"),
            "{}",
            errors(&child)
        );
    }

    const TENANT: &str = "domain: d\ndescriptors:\n  - key: tenant\n";

    #[test]
    fn a_reservation_loads_with_its_holder_and_hold() {
        let text = format!(
            "{TENANT}    reserve: {{holder: request_id, max_hold: 90s}}\n    rate_limit: {{unit: minute, requests_per_unit: 300}}\n"
        );
        let config = load_sources(&[("f.yaml".to_owned(), text)]).unwrap();
        let rule = config.rules().next().unwrap();
        let r = rule.reserve.as_ref().unwrap();
        assert_eq!((&*r.holder, r.max_hold_ms), ("request_id", 90_000));
        assert_eq!(rule.algorithm, crate::algorithm::Algorithm::TokenBucket);
        assert_eq!(rule.charge, crate::rule::Charge::IfAllowed);
        // The holder entry reaches the rule whatever its value.
        let entries = [
            crate::request::Entry::new("tenant", "acme"),
            crate::request::Entry::new("request_id", "r-1"),
        ];
        let domain = config.domain("d").unwrap();
        assert_eq!(domain.find(&entries).map(|r| r.id), Some(rule.id));
    }

    #[test]
    fn reservation_mistakes_are_reported_at_their_line() {
        let rate = "    rate_limit: {unit: minute, requests_per_unit: 300";
        let cases = [
            (
                format!("{TENANT}    reserve: {{holder: r}}\n{rate}, algorithm: fixed_window}}\n"),
                "f.yaml:4:5: `reserve` does not apply to `fixed_window` (from its `algorithm`)",
            ),
            (
                format!("{TENANT}    reserve: {{holder: r}}\n{rate}, lease: 10}}\n"),
                "`reserve` does not combine with `lease`",
            ),
            (
                format!("{TENANT}    reserve: {{holder: r}}\n    charge: always\n{rate}}}\n"),
                "f.yaml:5:5: `reserve` does not combine with `charge`",
            ),
            (
                format!("{TENANT}    reserve: {{holder: r}}\n"),
                "f.yaml:4:5: `reserve` applies only to a descriptor with a `rate_limit`",
            ),
            (
                format!(
                    "{TENANT}    reserve: {{holder: r}}\n    rate_limits:\n      - {{unit: second, requests_per_unit: 1}}\n"
                ),
                "`reserve` applies to a single `rate_limit`, not to `rate_limits`",
            ),
            (
                format!("{TENANT}    reserve: {{max_hold: 2s}}\n{rate}}}\n"),
                "`reserve` is missing required field `holder`",
            ),
            (
                format!("{TENANT}    reserve: {{holder: r, max: 2}}\n{rate}}}\n"),
                "unknown field `max` in `reserve`",
            ),
            (
                format!(
                    "{TENANT}    reserve: {{holder: r}}\n    rate_limit: {{unit: minute, requests_per_unit: 0}}\n"
                ),
                "there is no bucket to reserve from",
            ),
        ];
        for (text, expected) in cases {
            let got = errors(&text);
            assert!(got.contains(expected), "{text}\n→ {got}");
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration_ms("300s"), Some(300_000));
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("5m"), Some(300_000));
        assert_eq!(parse_duration_ms("1h"), Some(3_600_000));
        assert_eq!(parse_duration_ms("5"), None);
        assert_eq!(parse_duration_ms("s"), None);
        assert_eq!(parse_duration_ms("2d"), None);
    }
}
