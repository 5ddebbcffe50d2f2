//! Hostile input through the real gRPC path: every case gets a defined answer (INVALID_ARGUMENT
//! naming the field, or a decision), the server keeps serving others afterwards, and the memory
//! backend stays within its bounds under a flood of distinct keys.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use prost::Message;
use sluice_harness::rls::*;
use sluice_harness::sluice::TestServer;
use tonic::Code;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: ip
    rate_limit: {unit: day, requests_per_unit: 10}
"#;

const MIB: usize = 1024 * 1024;

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.into(),
        value: value.into(),
    }
}

/// The normal request every case is followed by: the server must still decide it.
async fn still_serving(s: &mut TestServer) {
    let r = s
        .ok(req("edge", vec![desc(&[("tenant", "bystander")])]))
        .await;
    assert_eq!(r.statuses.len(), 1);
    assert!(r.statuses[0].current_limit.is_some());
}

async fn rejected(s: &mut TestServer, request: RateLimitRequest, field: &str) {
    let err = s.call(request).await.expect_err("rejected");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with(field),
        "message `{}` should name `{field}`",
        err.message()
    );
    still_serving(s).await;
}

#[tokio::test]
async fn oversized_requests_get_invalid_argument_naming_the_bound() {
    let mut s = TestServer::start(&[("edge.yaml", CONFIG)]).await;

    let many_descriptors = || {
        req(
            "edge",
            (0..10_000)
                .map(|i| desc(&[("tenant", &i.to_string())]))
                .collect(),
        )
    };
    let many_entries = || {
        let entries = (0..10_000).map(|i| entry(&format!("k{i}"), "v")).collect();
        req(
            "edge",
            vec![RateLimitDescriptor {
                entries,
                ..Default::default()
            }],
        )
    };
    let mib_value = || req("edge", vec![desc(&[("tenant", &"v".repeat(MIB))])]);
    let mib_key = || req("edge", vec![desc(&[(&"k".repeat(MIB), "v")])]);
    let mib_domain = || req(&"d".repeat(MIB), vec![desc(&[("tenant", "v")])]);
    let four_mib = || {
        let value = "x".repeat(4000);
        req(
            "edge",
            (0..4 * MIB)
                .step_by(4000)
                .map(|_| desc(&[("tenant", &value)]))
                .collect(),
        )
    };
    assert!(four_mib().encoded_len() > 4 * MIB);

    // Each count and length bound names its field; the message bound (4 MiB) comes first.
    rejected(&mut s, four_mib(), "message").await;
    rejected(&mut s, many_descriptors(), "descriptors:").await;
    rejected(&mut s, many_entries(), "descriptors[0].entries:").await;
    rejected(&mut s, mib_key(), "descriptors[0].entries[0].key").await;
    // The route config decides these shapes, so each is counted for the operator.
    for problem in ["message_bytes", "descriptors", "entries", "key_bytes"] {
        let label = format!("problem=\"{problem}\"");
        assert_eq!(
            metric(&s, "sluice_request_problems_total", &label),
            1,
            "{problem}"
        );
    }
    // A value is the client's: any length is decided.
    let r = s.ok(mib_value()).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));
    // The domain has no bound of its own beyond the message; it is simply unknown.
    let r = s.ok(mib_domain()).await;
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    s.stop().await;

    // With room for the message, the descriptor count is the bound crossed.
    let mut s = TestServer::start_with(&[("edge.yaml", CONFIG)], |st| {
        st.max_message_bytes = 6 * MIB;
    })
    .await;
    rejected(&mut s, four_mib(), "descriptors:").await;
    s.stop().await;
}

#[tokio::test]
async fn messages_above_the_transport_ceiling_are_refused_before_decoding() {
    let mut s = TestServer::start(&[("edge.yaml", CONFIG)]).await;
    let value = "x".repeat(1 << 16);
    let huge = req(
        "edge",
        (0..((9 * MIB) >> 16))
            .map(|_| desc(&[("tenant", &value)]))
            .collect(),
    );
    assert!(huge.encoded_len() > 8 * MIB);
    let err = s.call(huge).await.expect_err("refused");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    still_serving(&mut s).await;
    s.stop().await;
}

#[tokio::test]
async fn empty_fields_get_invalid_argument_or_a_decision() {
    let mut s = TestServer::start(&[("edge.yaml", CONFIG)]).await;
    rejected(&mut s, RateLimitRequest::default(), "domain").await;
    rejected(&mut s, req("edge", vec![]), "descriptors").await;
    rejected(
        &mut s,
        req("edge", vec![desc(&[("", "")])]),
        "descriptors[0].entries[0].key",
    )
    .await;
    rejected(&mut s, req("", vec![]), "domain").await;

    // An empty value is a value: its own bucket.
    let r = s.ok(req("edge", vec![desc(&[("tenant", "")])])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));
    // Unknown domains and unmatched descriptors are OK with no limit.
    let r = s
        .ok(req("no-such-domain", vec![desc(&[("tenant", "a")])]))
        .await;
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    let r = s.ok(req("edge", vec![desc(&[("color", "red")])])).await;
    assert!(r.statuses[0].current_limit.is_none());
    still_serving(&mut s).await;
    s.stop().await;
}

#[tokio::test]
async fn control_characters_and_braces_are_plain_values_with_their_own_buckets() {
    let mut s = TestServer::start(&[("edge.yaml", CONFIG)]).await;
    let nasty = [
        "a\0b",
        "a\r\nb",
        "a\nb",
        "{edge|tenant=a}",
        "}",
        "{",
        "a%0D%0Ab",
        "a%00b",
        "a b",
        "\u{202e}rtl",
        "a|b=c",
        "#0000000000000000000000000000000000000000",
    ];
    // Drain the first one completely.
    for _ in 0..3 {
        let r = s.ok(req("edge", vec![desc(&[("tenant", nasty[0])])])).await;
        assert_eq!(r.overall_code, OK);
    }
    let r = s.ok(req("edge", vec![desc(&[("tenant", nasty[0])])])).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    // Every other value, however similar once escaped, still has its full bucket; each one
    // hit twice shows it is one stable bucket.
    for value in &nasty[1..] {
        for remaining in [2, 1] {
            let r = s.ok(req("edge", vec![desc(&[("tenant", value)])])).await;
            assert_eq!(r.overall_code, OK, "{value:?}");
            assert_eq!(r.statuses[0].limit_remaining, remaining, "{value:?}");
        }
    }
    // Keys with separators and braces reach no rule and break nothing.
    let r = s
        .ok(req(
            "edge",
            vec![desc(&[("tenant}", "x"), ("{", "}"), ("|", "=")])],
        ))
        .await;
    assert_eq!(r.overall_code, OK);
    // Header values in responses stay printable.
    for h in &r.response_headers_to_add {
        assert!(h.value.chars().all(|c| !c.is_control()), "{h:?}");
    }
    still_serving(&mut s).await;
    s.stop().await;
}

/// The sum of the `name` series whose labels contain `label`, from the Prometheus text.
fn metric(s: &TestServer, name: &str, label: &str) -> u64 {
    let text = s.running.as_ref().unwrap().metrics.prometheus_text();
    let text = text.expect("metrics on").expect("encoded");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

#[tokio::test]
async fn extreme_hits_addend_is_a_decision_up_to_the_bound() {
    const MAX: u64 = u32::MAX as u64;
    let mut s = TestServer::start(&[("edge.yaml", CONFIG)]).await;
    let over_limit = |s: &TestServer| {
        metric(
            s,
            "ratelimit_service_rate_limit_over_limit",
            "key=\"tenant\"",
        )
    };
    let mut r = req("edge", vec![desc(&[("tenant", "big")])]);
    r.hits_addend = u32::MAX;
    assert_eq!(s.ok(r).await.overall_code, OVER_LIMIT);
    assert_eq!(
        over_limit(&s),
        MAX,
        "the request-level field's range is the default bound"
    );
    let mut d = desc(&[("tenant", "big")]);
    d.hits_addend = Some(UInt64Value { value: MAX });
    let resp = s.ok(req("edge", vec![d.clone()])).await;
    assert_eq!(resp.overall_code, OVER_LIMIT);
    assert!(header(&resp, "retry-after").is_none(), "never satisfiable");
    // Two descriptors on one bucket at the bound: still a decision.
    assert_eq!(
        s.ok(req("edge", vec![d.clone(), d.clone()]))
            .await
            .overall_code,
        OVER_LIMIT
    );
    assert_eq!(over_limit(&s), 4 * MAX);
    // Past the bound a count is clamped to it: still OVER_LIMIT (a refusal would be an error,
    // which Envoy lets through by default), and a counter moves by the bound, not by 2^64.
    for value in [MAX + 1, u64::MAX] {
        let mut far = desc(&[("tenant", "big")]);
        far.hits_addend = Some(UInt64Value { value });
        let resp = s.ok(req("edge", vec![far])).await;
        assert_eq!(resp.overall_code, OVER_LIMIT, "{value}");
    }
    assert_eq!(over_limit(&s), 6 * MAX);
    // A refund at the bound is capped at capacity.
    d.is_negative_hits = true;
    let resp = s.ok(req("edge", vec![d])).await;
    assert_eq!(
        (resp.overall_code, resp.statuses[0].limit_remaining),
        (OK, 3)
    );
    // Nothing was taken by the rejected calls.
    let r = s.ok(req("edge", vec![desc(&[("tenant", "big")])])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    still_serving(&mut s).await;
    s.stop().await;
}

#[tokio::test]
async fn untrusted_caller_policy_through_grpc() {
    let mut s = TestServer::start_with(&[("edge.yaml", CONFIG)], |st| {
        st.security.callers.ignore_limit_override = true;
        st.security.callers.ignore_negative_hits = true;
        st.security.callers.max_hits_addend = 2;
    })
    .await;
    // An override asking for a million per second gets the configured 3 per minute.
    let mut d = desc(&[("tenant", "o")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1_000_000,
        unit: 1,
    });
    let r = s.ok(req("edge", vec![d.clone()])).await;
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (3, 4), "3 per DAY");
    assert_eq!(r.statuses[0].limit_remaining, 2);
    // An ignored override is not validated either.
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 0,
        unit: 0,
    });
    assert_eq!(
        s.ok(req("edge", vec![d])).await.statuses[0].limit_remaining,
        1
    );

    // hits_addend is clamped to 2, request- and descriptor-level.
    let mut r = req("edge", vec![desc(&[("ip", "h")])]);
    r.hits_addend = 3;
    assert_eq!(s.ok(r).await.statuses[0].limit_remaining, 8);
    let mut d = desc(&[("ip", "h")]);
    d.hits_addend = Some(UInt64Value { value: u64::MAX });
    assert_eq!(
        s.ok(req("edge", vec![d])).await.statuses[0].limit_remaining,
        6
    );

    // A refund gives nothing back (and, ignored, is not bounded either).
    let mut d = desc(&[("ip", "h")]);
    d.is_negative_hits = true;
    d.hits_addend = Some(UInt64Value { value: 5 });
    let r = s.ok(req("edge", vec![d])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 6));
    let r = s.ok(req("edge", vec![desc(&[("ip", "h")])])).await;
    assert_eq!(r.statuses[0].limit_remaining, 5);
    s.stop().await;
}

#[tokio::test]
async fn invalid_utf8_and_malformed_protobuf_are_invalid_argument() {
    let mut s = TestServer::start(&[("edge.yaml", CONFIG)]).await;
    let request = req(
        "edge",
        vec![
            desc(&[("tenant", "acme")]),
            desc(&[("tenant", "globex"), ("route", "EXPORT")]),
        ],
    );
    let valid = raw_call(s.grpc_addr(), request.encode_to_vec())
        .await
        .unwrap();
    assert_eq!(valid.statuses.len(), 2);

    // Domain and keys come from Envoy's config, which is UTF-8; values are bytes (decided).
    for (needle, with, field) in [
        (&b"edge"[..], &b"e\xffge"[..], "domain"),
        (b"route", b"r\xed\xa0\x80t", "descriptors[1].entries[1].key"),
        (b"tenant", b"te\xc3\x28nt", "descriptors[0].entries[0].key"),
    ] {
        let err = raw_call(s.grpc_addr(), patched(&request, needle, with))
            .await
            .expect_err("rejected");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert_eq!(err.message(), format!("{field}: not valid UTF-8"));
        still_serving(&mut s).await;
    }

    let mut truncated = request.encode_to_vec();
    truncated.truncate(truncated.len() - 2);
    for bytes in [
        truncated,
        vec![0xff; 64],
        vec![0x12, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80],
    ] {
        let err = raw_call(s.grpc_addr(), bytes).await.expect_err("rejected");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with("message: not a valid"), "{err:?}");
        still_serving(&mut s).await;
    }
    // Zero bytes decode to the empty request, which names its first missing field.
    let err = raw_call(s.grpc_addr(), Vec::new())
        .await
        .expect_err("rejected");
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, "domain: must not be empty")
    );
    s.stop().await;
}

/// `bytes` with a length-delimited unknown field (tag 15) of `len` bytes appended.
fn with_unknown_field(mut bytes: Vec<u8>, len: usize) -> Vec<u8> {
    prost::encoding::encode_key(15, prost::encoding::WireType::LengthDelimited, &mut bytes);
    prost::encoding::encode_varint(len as u64, &mut bytes);
    bytes.resize(bytes.len() + len, b'u');
    bytes
}

#[tokio::test]
async fn unknown_fields_count_toward_the_message_bound() {
    let mut s = TestServer::start(&[("edge.yaml", CONFIG)]).await;
    let valid = req("edge", vec![desc(&[("tenant", "unknown")])]).encode_to_vec();
    // A small unknown field is skipped, as protobuf wants.
    let r = raw_call(s.grpc_addr(), with_unknown_field(valid.clone(), 100))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    for len in [4 * MIB, 6 * MIB] {
        let bytes = with_unknown_field(valid.clone(), len);
        let size = bytes.len();
        let err = raw_call(s.grpc_addr(), bytes).await.expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert_eq!(
            err.message(),
            format!("message: {size} bytes exceed the limit of {}", 4 * MIB)
        );
        still_serving(&mut s).await;
    }
    s.stop().await;
}

#[tokio::test]
async fn oversized_headers_are_refused_and_the_connection_recovers() {
    let mut s = TestServer::start(&[("edge.yaml", CONFIG)]).await;
    let mut request = tonic::Request::new(req("edge", vec![desc(&[("tenant", "h")])]));
    request
        .metadata_mut()
        .insert("x-padding", "p".repeat(64 * 1024).parse().unwrap());
    let err = s
        .client
        .should_rate_limit(request)
        .await
        .expect_err("refused");
    // The server's h2 layer closes the connection (GOAWAY header_list_way_too_large).
    assert!(format!("{err:?}").contains("header_list"), "{err:?}");
    // A new connection is served.
    let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{}", s.grpc_addr()),
    )
    .await
    .unwrap();
    let r = client
        .should_rate_limit(req("edge", vec![desc(&[("tenant", "h")])]))
        .await
        .unwrap();
    assert_eq!(r.into_inner().overall_code, OK);
    s.stop().await;
}

#[tokio::test]
async fn distinct_key_flood_stays_within_the_per_rule_bound() {
    const PER_RULE: usize = 128;
    let mut s = TestServer::start_with(&[("edge.yaml", CONFIG)], |st| {
        st.security.memory_max_buckets_per_rule = Some(PER_RULE as u64);
    })
    .await;
    let backend = s
        .running
        .as_ref()
        .unwrap()
        .memory_backend
        .clone()
        .expect("memory backend");

    // Five tenants use their buckets: 1 of 3 tokens left each.
    for t in 0..5 {
        for _ in 0..2 {
            s.ok(req("edge", vec![desc(&[("tenant", &format!("t{t}"))])]))
                .await;
        }
    }
    assert_eq!(backend.live_buckets(), 5);

    // A flood of distinct client addresses, 50 per request: once the rule's share is full, its
    // new buckets are refused and answered by its failure policy (`error` here).
    let mut refused = 0;
    for batch in 0..80 {
        let descriptors = (0..50)
            .map(|i| desc(&[("ip", &format!("10.{batch}.{i}.1"))]))
            .collect();
        match s.call(req("edge", descriptors)).await {
            Ok(r) => assert_eq!(r.overall_code, OK),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                refused += 1;
            }
        }
        assert!(backend.live_buckets() <= PER_RULE + 5);
    }
    assert!(refused > 0);
    assert_eq!(
        backend.live_buckets(),
        PER_RULE + 5,
        "the flooded rule fills its bound"
    );

    // The tenants' buckets were not evicted by the flood.
    for t in 0..5 {
        let r = s
            .ok(req("edge", vec![desc(&[("tenant", &format!("t{t}"))])]))
            .await;
        assert_eq!(
            (r.overall_code, r.statuses[0].limit_remaining),
            (OK, 0),
            "t{t}"
        );
    }
    s.stop().await;
}

// What a real Envoy sends: descriptors with no entries (`skip_if_absent` on an absent header)
// and header values copied byte for byte — obs-text (0x80–0xFF, not UTF-8) and tens of KB.

const BYTES: &str = r#"
domain: bytes
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: agent
    value: "curl*"
    rate_limit: {unit: day, requests_per_unit: 1}
"#;

/// `RateLimitRequest` as Envoy encodes it, with entry values as protobuf `bytes` (the same wire
/// format as its `string`), so a test can send values that are not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct BytesRequest {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<BytesDescriptor>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct BytesDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<BytesEntry>,
    #[prost(message, optional, tag = "2")]
    limit: Option<RateLimitOverride>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct BytesEntry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// One `bytes` request per descriptor list; `None` is a descriptor with no entries.
fn bytes_request(descriptors: &[Option<(&str, &[u8])>]) -> Vec<u8> {
    let descriptor = |d: &Option<(&str, &[u8])>| BytesDescriptor {
        entries: d
            .iter()
            .map(|(k, v)| BytesEntry {
                key: (*k).into(),
                value: v.to_vec(),
            })
            .collect(),
        limit: None,
    };
    BytesRequest {
        domain: "bytes".into(),
        descriptors: descriptors.iter().map(descriptor).collect(),
    }
    .encode_to_vec()
}

/// (overall code, per status: code and remaining, or `None` without a limit).
async fn decided(s: &TestServer, bytes: Vec<u8>) -> (i32, Vec<(i32, Option<u32>)>) {
    let r = raw_call(s.grpc_addr(), bytes).await.expect("decided");
    let statuses = r
        .statuses
        .iter()
        .map(|st| {
            (
                st.code,
                st.current_limit.as_ref().map(|_| st.limit_remaining),
            )
        })
        .collect();
    (r.overall_code, statuses)
}

#[tokio::test]
async fn an_empty_descriptor_is_ok_and_the_others_are_still_limited() {
    let s = TestServer::start(&[("bytes.yaml", BYTES)]).await;
    let user: &[u8] = b"alice";
    let request = || bytes_request(&[None, Some(("user", user)), None]);
    for remaining in [2, 1, 0] {
        let expected = (OK, vec![(OK, None), (OK, Some(remaining)), (OK, None)]);
        assert_eq!(decided(&s, request()).await, expected);
    }
    let (overall, statuses) = decided(&s, request()).await;
    assert_eq!(overall, OVER_LIMIT);
    assert_eq!(statuses, [(OK, None), (OVER_LIMIT, Some(0)), (OK, None)]);

    // Only empty descriptors: OK, none limited, even with an override that would block.
    let mut blocking = BytesRequest::decode(&*bytes_request(&[None, None])).unwrap();
    blocking.descriptors[1].limit = Some(RateLimitOverride {
        requests_per_unit: 0,
        unit: 1,
    });
    for _ in 0..3 {
        let r = decided(&s, blocking.encode_to_vec()).await;
        assert_eq!(r, (OK, vec![(OK, None), (OK, None)]));
    }
    s.stop().await;
}

#[tokio::test]
async fn a_value_that_is_not_utf8_is_decided_in_its_own_bucket() {
    let s = TestServer::start(&[("bytes.yaml", BYTES)]).await;
    let raw: &[u8] = b"ab\xff";
    // Its lossy and escaped spellings are other clients, drained first.
    for lookalike in ["ab\u{FFFD}", "ab\\xFF", "ab%FF"] {
        for _ in 0..3 {
            decided(&s, bytes_request(&[Some(("user", lookalike.as_bytes()))])).await;
        }
        let (overall, _) =
            decided(&s, bytes_request(&[Some(("user", lookalike.as_bytes()))])).await;
        assert_eq!(overall, OVER_LIMIT, "{lookalike}");
    }
    for remaining in [2, 1, 0] {
        let r = decided(&s, bytes_request(&[Some(("user", raw))])).await;
        assert_eq!(r, (OK, vec![(OK, Some(remaining))]));
    }
    let r = decided(&s, bytes_request(&[Some(("user", raw))])).await;
    assert_eq!(r, (OVER_LIMIT, vec![(OVER_LIMIT, Some(0))]));

    // A configured prefix matches byte-wise: `curl*` holds `curl\xff`.
    let agent: &[u8] = b"curl\xff/8";
    let r = decided(&s, bytes_request(&[Some(("agent", agent))])).await;
    assert_eq!(r, (OK, vec![(OK, Some(0))]));
    let r = decided(&s, bytes_request(&[Some(("agent", agent))])).await;
    assert_eq!(r.0, OVER_LIMIT);
    s.stop().await;
}

#[tokio::test]
async fn values_of_many_kilobytes_are_decided_and_limited() {
    let s = TestServer::start(&[("bytes.yaml", BYTES)]).await;
    for len in [5_000, 60_000] {
        let value = vec![b'u'; len];
        let mut other = value.clone();
        *other.last_mut().unwrap() = 0xff;
        // One header copied into two descriptors: 120 KB for the 60 KB value.
        let twice = || bytes_request(&[Some(("user", &value)), Some(("user", &value))]);
        let r = decided(&s, twice()).await;
        assert_eq!(r, (OK, vec![(OK, Some(1)), (OK, Some(1))]), "{len}");
        let r = decided(&s, bytes_request(&[Some(("user", &value))])).await;
        assert_eq!(r, (OK, vec![(OK, Some(0))]), "{len}");
        let r = decided(&s, twice()).await;
        assert_eq!(r.0, OVER_LIMIT, "{len}");
        // A value differing in its last byte is another client.
        let r = decided(&s, bytes_request(&[Some(("user", &other))])).await;
        assert_eq!(r, (OK, vec![(OK, Some(2))]), "{len}");
    }
    s.stop().await;
}
