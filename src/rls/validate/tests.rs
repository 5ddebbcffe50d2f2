//! Every refusal, and what is decided instead of refused.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;

use super::*;

fn entry(key: &str, value: &[u8]) -> WireEntry {
    WireEntry {
        key: key.into(),
        value: value.to_vec(),
    }
}

fn descriptor(entries: Vec<WireEntry>) -> WireDescriptor {
    WireDescriptor {
        entries,
        ..Default::default()
    }
}

fn request(descriptors: Vec<WireDescriptor>) -> WireRequest {
    WireRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

fn checked(r: WireRequest) -> Checked {
    check_request(r, &RequestBounds::default()).expect("decided")
}

fn refused(r: WireRequest, bounds: &RequestBounds) -> (String, Option<Problem>) {
    let error = check_request(r, bounds).expect_err("refused");
    (error.to_string(), error.problem())
}

#[test]
fn empty_descriptors_and_any_value_bytes_are_decided() {
    let long = vec![b'u'; 60_000];
    let c = checked(request(vec![
        descriptor(vec![entry("user", b"a\xff")]),
        descriptor(Vec::new()),
        descriptor(vec![entry("user", &long), entry("empty", b"")]),
    ]));
    let d = &c.request.descriptors;
    assert_eq!(d[0].entries, [Entry::new("user", b"a\xff".as_slice())]);
    assert!(d[1].entries.is_empty());
    assert_eq!(d[2].entries[0].value.len(), 60_000);
    assert_eq!(d[2].entries[1].value, "");
    assert!(c.dropped_overrides.is_empty());
    let all_empty = checked(request(vec![descriptor(Vec::new()); 3]));
    assert_eq!(all_empty.request.descriptors.len(), 3);
}

#[test]
fn an_override_of_unknown_unit_is_dropped_not_refused() {
    let with_unit = |unit| WireDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 5,
            unit,
        }),
        ..descriptor(vec![entry("k", b"v")])
    };
    let c = checked(request(vec![with_unit(0), with_unit(2), with_unit(99)]));
    let overrides: Vec<_> = c
        .request
        .descriptors
        .iter()
        .map(|d| d.limit_override)
        .collect();
    assert_eq!(
        overrides,
        [
            None,
            Some(LimitOverride {
                requests_per_unit: 5,
                unit: Unit::Minute
            }),
            None
        ]
    );
    assert_eq!(c.dropped_overrides, [(0, 0), (2, 99)]);
}

#[test]
fn what_no_envoy_sends_is_refused_without_a_problem() {
    let bounds = RequestBounds::default();
    let mut no_domain = request(vec![descriptor(vec![entry("k", b"v")])]);
    no_domain.domain.clear();
    assert_eq!(
        refused(no_domain, &bounds),
        ("domain: must not be empty".into(), None)
    );
    assert_eq!(
        refused(request(Vec::new()), &bounds),
        (
            "descriptors: at least one descriptor is required".into(),
            None
        )
    );
    let empty_key = request(vec![
        descriptor(vec![entry("k", b"v")]),
        descriptor(vec![entry("k", b"v"), entry("", b"v")]),
    ]);
    assert_eq!(
        refused(empty_key, &bounds),
        (
            "descriptors[1].entries[1].key: must not be empty".into(),
            None
        )
    );
}

#[test]
fn bounds_an_envoy_route_can_reach_are_problems() {
    let bounds = RequestBounds {
        max_message_bytes: 200,
        max_descriptors: 2,
        max_entries: 2,
        max_key_bytes: 4,
        ..RequestBounds::default()
    };
    let one = || descriptor(vec![entry("k", b"v")]);
    assert_eq!(
        refused(request(vec![one(), one(), one()]), &bounds),
        (
            "descriptors: 3 descriptors exceed the limit of 2".into(),
            Some(Problem::Descriptors)
        )
    );
    let three = descriptor(vec![entry("a", b""), entry("b", b""), entry("c", b"")]);
    assert_eq!(
        refused(request(vec![one(), three]), &bounds),
        (
            "descriptors[1].entries: 3 entries exceed the limit of 2".into(),
            Some(Problem::Entries)
        )
    );
    assert_eq!(
        refused(
            request(vec![descriptor(vec![entry("route", b"")])]),
            &bounds
        ),
        (
            "descriptors[0].entries[0].key: 5 bytes exceed the limit of 4".into(),
            Some(Problem::KeyBytes)
        )
    );
    let big = request(vec![descriptor(vec![entry("k", &[0xff; 300])])]);
    let len = prost::Message::encoded_len(&big);
    assert_eq!(
        refused(big, &bounds),
        (
            format!("message: {len} bytes exceed the limit of 200"),
            Some(Problem::MessageBytes)
        )
    );
}

#[test]
fn the_default_message_bound_holds_a_full_header_block_in_every_descriptor() {
    let bounds = RequestBounds::default();
    let header_block = vec![0xffu8; 60 * 1024];
    let d = descriptor(vec![entry("x-user", &header_block)]);
    let c = check_request(request(vec![d; bounds.max_descriptors]), &bounds);
    assert!(c.is_ok(), "{c:?}");
}
