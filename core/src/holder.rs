//! The holder entry of an in-flight cap's descriptor: `[inflight=<tenant>, request_id=<id>]`
//! reaches the `inflight` rule, and its last entry names who holds the slot, not the bucket.

use crate::request::Entry;
use crate::rule::InFlightRule;

/// The entries that name the bucket — the holder entry, when the descriptor ends with it, left
/// out, so one tenant has one bucket whatever its requests' ids — and the holder's value.
pub fn split<'a>(rule: &InFlightRule, entries: &'a [Entry]) -> (&'a [Entry], Option<&'a [u8]>) {
    match entries.split_last() {
        Some((last, rest)) if last.key == *rule.holder => (rest, Some(last.value.as_bytes())),
        _ => (entries, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_entry_named_by_the_rule_is_the_holder() {
        let rule = InFlightRule {
            holder: "request_id".into(),
            max_hold_ms: 1_000,
        };
        let entries = [
            Entry::new("inflight", "acme"),
            Entry::new("request_id", "r1"),
        ];
        let (bucket, holder) = split(&rule, &entries);
        assert_eq!(bucket, &entries[..1]);
        assert_eq!(holder, Some(&b"r1"[..]));
        let (bucket, holder) = split(&rule, &entries[..1]);
        assert_eq!((bucket, holder), (&entries[..1], None));
    }
}
