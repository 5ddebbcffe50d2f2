//! Keys: readable examples, tags, shards, hashing, Cluster slots, and that keys parse back
//! (injective).

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;
use crate::request::Value;
use crate::rule::Unit;

/// A token bucket's key: the layout every release wrote.
fn tb_key(prefix: &str, domain: &str, entries: &[Entry], tag: RuleTag) -> String {
    bucket_key(prefix, domain, entries, tag, Algorithm::TokenBucket)
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

fn over(requests_per_unit: u32, unit: Unit) -> RuleTag {
    RuleTag::Override(LimitOverride {
        requests_per_unit,
        unit,
    })
}

#[test]
fn readable_examples() {
    let e = entries(&[("tenant", "acme"), ("route", "export")]);
    assert_eq!(
        tb_key("sluice:", "edge", &e, RuleTag::Configured),
        "sluice:{edge|tenant=acme}|route=export"
    );
    assert_eq!(
        tb_key("sluice:", "edge", &e, over(10, Unit::Second)),
        "sluice:{edge|tenant=acme}|route=export~o10/second"
    );
    assert_eq!(
        tb_key("", "edge", &e[..1], RuleTag::Configured),
        "{edge|tenant=acme}"
    );
    assert_eq!(
        tb_key(
            "p:",
            "d",
            &entries(&[("a", "1"), ("b", "2"), ("c", "3")]),
            RuleTag::Configured
        ),
        "p:{d|a=1}|b=2|c=3"
    );
    assert_eq!(
        tb_key(
            "p:",
            "api",
            &entries(&[("remote_address", "10.0.0.1")]),
            RuleTag::Configured
        ),
        "p:{api|remote_address=10.0.0.1}"
    );
    assert_eq!(
        tb_key(
            "p:",
            "api",
            &entries(&[("path", "/v1/a b?x=1&y={z}")]),
            RuleTag::Configured
        ),
        "p:{api|path=/v1/a%20b%3Fx%3D1%26y%3D%7Bz%7D}"
    );
    assert_eq!(tb_key("p:", "", &[], RuleTag::Configured), "p:{|}");
    assert_eq!(
        tb_key("sluice:", "edge", &e, RuleTag::Shard(3)),
        "sluice:{edge|tenant=acme~s3}|route=export"
    );
    assert_eq!(
        tb_key("sluice:", "edge", &e[..1], RuleTag::Shard(63)),
        "sluice:{edge|tenant=acme~s63}"
    );
    assert_eq!(tb_key("p:", "d", &[], RuleTag::Shard(0)), "p:{d|~s0}");
    assert_eq!(
        tb_key("p:", "d", &entries(&[("k", "é~#%|")]), RuleTag::Configured),
        "p:{d|k=%C3%A9%7E%23%25%7C}"
    );
}

#[test]
fn algorithms_other_than_the_token_bucket_are_tagged() {
    let e = entries(&[("tenant", "acme"), ("route", "export")]);
    let key = |tag, algorithm| bucket_key("sluice:", "edge", &e, tag, algorithm);
    assert_eq!(
        key(RuleTag::Configured, Algorithm::TokenBucket),
        "sluice:{edge|tenant=acme}|route=export"
    );
    assert_eq!(
        key(RuleTag::Configured, Algorithm::FixedWindow),
        "sluice:{edge|tenant=acme}|route=export~fw"
    );
    assert_eq!(
        key(RuleTag::Configured, Algorithm::SlidingWindow),
        "sluice:{edge|tenant=acme}|route=export~sw"
    );
    assert_eq!(
        key(over(10, Unit::Second), Algorithm::Gcra),
        "sluice:{edge|tenant=acme}|route=export~o10/second~gcra"
    );
    let one = bucket_key(
        "p:",
        "d",
        &e[..1],
        RuleTag::Configured,
        Algorithm::FixedWindow,
    );
    assert_eq!(one, "p:{d|tenant=acme}~fw");
    assert_eq!(slot(&one), slot("p:{d|tenant=acme}"));
    assert_eq!(
        key(RuleTag::Shard(12), Algorithm::Gcra),
        "sluice:{edge|tenant=acme~s12}|route=export~gcra"
    );
}

#[test]
fn shards_move_the_slot_and_strip_back_to_the_unsharded_key() {
    let e = entries(&[("tenant", "acme"), ("route", "export")]);
    let plain = tb_key("sluice:", "edge", &e, RuleTag::Configured);
    let slots: HashSet<u16> = (0..4)
        .map(|i| {
            let key = tb_key("sluice:", "edge", &e, RuleTag::Shard(i));
            assert_eq!(hash_tag(&key), format!("edge|tenant=acme~s{i}"));
            assert_eq!(without_shard(&key), plain);
            slot(&key)
        })
        .collect();
    assert_eq!(slots.len(), 4, "four shards, four slots: {slots:?}");
    assert!(!slots.contains(&slot(&plain)));
    assert!(matches!(
        without_shard(&plain),
        std::borrow::Cow::Borrowed(_)
    ));
    for a in Algorithm::ALL {
        let key = bucket_key("p:", "d", &e[..1], RuleTag::Shard(7), a);
        assert_eq!(
            without_shard(&key),
            bucket_key("p:", "d", &e[..1], RuleTag::Configured, a)
        );
    }
    let no_entries = tb_key("p:", "d", &[], RuleTag::Shard(5));
    assert_eq!(without_shard(&no_entries), "p:{d|}");
}

#[test]
fn overlong_component_is_hashed_and_short_ones_are_not() {
    let at_limit = "a".repeat(MAX_COMPONENT);
    let key = tb_key("", "d", &entries(&[("k", &at_limit)]), RuleTag::Configured);
    assert_eq!(key, format!("{{d|k={at_limit}}}"));

    let long = "a".repeat(MAX_COMPONENT + 1);
    let key = tb_key("", "d", &entries(&[("k", &long)]), RuleTag::Configured);
    let digest = sha1_smol::Sha1::from(long.as_bytes()).digest().to_string();
    assert_eq!(key, format!("{{d|k=#{digest}}}"));
    // Escaping counts: 43 spaces are 129 escaped bytes.
    let spaces = " ".repeat(43);
    let key = tb_key("", "d", &entries(&[(&spaces, "v")]), RuleTag::Configured);
    assert!(key.starts_with("{d|#") && key.ends_with("=v}"), "{key}");
}

#[test]
fn write_appends_and_reserves_exactly_once() {
    let e = entries(&[("tenant", "a\u{0}b"), ("long", &"x".repeat(500))]);
    let mut buf = String::from("keep|");
    write_bucket_key(
        &mut buf,
        "p:",
        "dom ain",
        &e,
        over(u32::MAX, Unit::Minute),
        Algorithm::TokenBucket,
    );
    let expected = format!(
        "keep|p:{{dom%20ain|tenant=a%00b}}|long=#{}~o4294967295/minute",
        sha1_smol::Sha1::from("x".repeat(500).as_bytes()).digest()
    );
    assert_eq!(buf, expected);

    // Reserving on an empty String allocates exactly the estimate; any later growth would at
    // least double it. Without an override tag the estimate is exact.
    let mut fresh = String::new();
    write_bucket_key(
        &mut fresh,
        "p:",
        "dom ain",
        &e,
        RuleTag::Configured,
        Algorithm::TokenBucket,
    );
    assert_eq!(fresh.capacity(), fresh.len());
    for algorithm in Algorithm::ALL {
        let mut fresh = String::new();
        write_bucket_key(&mut fresh, "p:", "d", &e, RuleTag::Configured, algorithm);
        assert_eq!(fresh.capacity(), fresh.len(), "{algorithm}");
    }
    let mut tagged = String::new();
    write_bucket_key(
        &mut tagged,
        "p:",
        "d",
        &e[..1],
        over(7, Unit::Second),
        Algorithm::Gcra,
    );
    assert!(
        tagged.capacity() < tagged.len() + 20,
        "{}",
        tagged.capacity()
    );
    let mut widest = String::new();
    write_bucket_key(
        &mut widest,
        "p:",
        "d",
        &e[..1],
        over(u32::MAX, Unit::Minute),
        Algorithm::TokenBucket,
    );
    assert_eq!(widest.capacity(), widest.len());
    for shard in [0, 9, 10, 63, 99, 100, u8::MAX] {
        let mut sharded = String::new();
        write_bucket_key(
            &mut sharded,
            "p:",
            "d",
            &e,
            RuleTag::Shard(shard),
            Algorithm::FixedWindow,
        );
        assert_eq!(sharded.capacity(), sharded.len(), "shard {shard}");
    }
}

#[test]
fn a_shared_value_is_written_as_its_pattern_and_never_as_a_request_value() {
    let shared: Vec<Option<std::sync::Arc<str>>> = vec![None, Some("/files/*".into())];
    let mut key = String::new();
    let e = entries(&[("tenant", "acme"), ("path", "/files/a.txt")]);
    write_shared_bucket_key(
        &mut key,
        "sluice:",
        "edge",
        &e,
        &shared,
        RuleTag::Configured,
        Algorithm::TokenBucket,
    );
    assert_eq!(key, "sluice:{edge|tenant=acme}|path=#*/files/*");
    assert_eq!(key.capacity(), key.len(), "reserved exactly");
    // Every value the pattern stands for, the pattern's own text included, is elsewhere.
    for value in ["/files/*", "#*/files/*", "%23*/files/*", "\0/files/*"] {
        let plain = tb_key(
            "sluice:",
            "edge",
            &entries(&[("tenant", "acme"), ("path", value)]),
            RuleTag::Configured,
        );
        assert_ne!(plain, key, "{value}");
    }
    // Nothing shared: byte-identical to the plain key.
    let mut unshared = String::new();
    write_shared_bucket_key(
        &mut unshared,
        "sluice:",
        "edge",
        &e,
        &[None, None],
        RuleTag::Configured,
        Algorithm::TokenBucket,
    );
    assert_eq!(unshared, tb_key("sluice:", "edge", &e, RuleTag::Configured));
}

#[test]
fn known_redis_slots() {
    assert_eq!(slot("foo"), 12182);
    assert_eq!(slot("123456789"), 12739);
    assert_eq!(crc16(b"123456789"), 0x31C3);
    assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
    assert_eq!(slot("{user1000}.following"), slot("user1000"));
    assert_eq!(slot("foo{bar}{zap}"), slot("bar"));
}

#[test]
fn hash_tag_follows_redis_cluster_rules() {
    assert_eq!(hash_tag("{user1000}.following"), "user1000");
    assert_eq!(hash_tag("foo{}{bar}"), "foo{}{bar}");
    assert_eq!(hash_tag("foo{{bar}}zap"), "{bar");
    assert_eq!(hash_tag("foo{bar}{zap}"), "bar");
    assert_eq!(hash_tag("foo{bar"), "foo{bar");
    assert_eq!(hash_tag("plain"), "plain");
    assert_eq!(
        hash_tag("sluice:{edge|tenant=acme}|route=export"),
        "edge|tenant=acme"
    );
}

/// Inverse of the escaping, for the tests' parser: `None` for a hashed component.
fn unescape(s: &str) -> Option<Vec<u8>> {
    if s.starts_with('#') {
        return None;
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).expect("hex escape"));
            i += 3;
        } else {
            assert!(is_plain(b[i]), "unescaped byte {:?} in {s:?}", b[i] as char);
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// A component as it must appear: its raw bytes, or the digest of the raw bytes when hashed.
fn decoded_matches(encoded: &str, raw: &[u8]) -> bool {
    match unescape(encoded) {
        Some(bytes) => bytes == raw,
        None => encoded[1..] == sha1_smol::Sha1::from(raw).digest().to_string(),
    }
}

/// Splits a key back into (domain, [(key, value)], tags) using only the format's separators;
/// the tags inside the hash tag (the shard) come first.
fn parse(key: &str, prefix: &str) -> (String, Vec<(String, String)>, Vec<String>) {
    let rest = key.strip_prefix(prefix).expect("prefix");
    let rest = rest.strip_prefix('{').expect("tag opens after the prefix");
    let (inside, after) = rest.split_once('}').expect("tag closes");
    let mut inner = inside.split('~');
    let inside = inner.next().expect("split yields at least one part");
    let mut tags: Vec<String> = inner.map(str::to_string).collect();
    let mut parts = after.split('~');
    let body = parts.next().expect("split yields at least one part");
    tags.extend(parts.map(str::to_string));
    let (domain, first) = inside.split_once('|').expect("domain separator");
    let mut pairs = Vec::new();
    let split = |s: &str| {
        let (k, v) = s.split_once('=').expect("pair separator");
        (k.to_string(), v.to_string())
    };
    if !first.is_empty() {
        pairs.push(split(first));
    }
    if !body.is_empty() {
        let body = body.strip_prefix('|').expect("entry separator");
        pairs.extend(body.split('|').map(split));
    }
    (domain.to_string(), pairs, tags)
}

/// Strings rich in separators, escapes and awkward bytes, plus arbitrary unicode.
fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(
            prop::sample::select(vec![
                "{", "}", ":", "|", "=", "%", "_", "~", "#", "\0", "\r", "\n", " ", "a", "Z",
                "0", "é", "\u{1F600}", "%7B", "#0", "~o1/second",
            ]),
            0..12,
        )
        .prop_map(|parts| parts.concat()),
        2 => any::<String>(),
        1 => "[a-z]{120,140}",
    ]
}

/// Bytes that are mostly not UTF-8: obs-text, stray continuation bytes, and the escaped and
/// lossy spellings of those bytes (`%FF`, `\xFF`, U+FFFD) as lookalikes.
fn raw_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        4 => prop::sample::select(vec![
            &b"\xff"[..], b"\x80", b"\xc3", b"\xc3\x28", b"\xed\xa0\x80", b"%FF", b"\\xFF",
            "\u{FFFD}".as_bytes(), b"a", b"|", b"=", b"~", b"#", b"{",
        ])
        .prop_map(<[u8]>::to_vec),
        1 => any::<u8>().prop_map(|b| vec![b]),
    ];
    prop::collection::vec(piece, 0..12).prop_map(|parts| parts.concat())
}

/// A request value: text (as [`component`]) or bytes that are mostly not UTF-8.
fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => component().prop_map(Value::from),
        2 => raw_bytes().prop_map(Value::from),
        1 => prop::collection::vec(any::<u8>(), 120..140).prop_map(Value::from),
    ]
}

fn entry_list() -> impl Strategy<Value = Vec<Entry>> {
    prop::collection::vec(
        (component(), value()).prop_map(|(k, v)| Entry::new(k, v)),
        0..4,
    )
}

/// `value` with `suffix` appended, bytes and all.
fn appended(value: &Value, suffix: &str) -> Value {
    [value.as_bytes(), suffix.as_bytes()].concat().into()
}

fn rule_tag() -> impl Strategy<Value = RuleTag> {
    prop_oneof![
        Just(RuleTag::Configured),
        (any::<u32>(), prop::sample::select(Unit::ALL.to_vec())).prop_map(|(n, u)| over(n, u)),
        any::<u8>().prop_map(RuleTag::Shard),
        any::<u64>().prop_map(RuleTag::Window),
    ]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

type Input = (String, Vec<Entry>, RuleTag, Algorithm);

fn input() -> impl Strategy<Value = Input> {
    (component(), entry_list(), rule_tag(), algorithm())
}

/// A second input that differs from the first in one small, separator-shaped way.
fn near_miss(a: &Input) -> Vec<Input> {
    let (d, e, t, al) = a.clone();
    let mut out = vec![
        (d.clone(), e.clone(), RuleTag::Configured, al),
        (d.clone(), e.clone(), over(1, Unit::Second), al),
        (d.clone(), e.clone(), RuleTag::Shard(0), al),
        (d.clone(), e.clone(), RuleTag::Shard(1), al),
        (d.clone(), e.clone(), RuleTag::Shard(10), al),
        (format!("{d}|"), e.clone(), t, al),
        // A shard's tag spelled into the domain.
        (format!("{d}~s0"), e.clone(), RuleTag::Configured, al),
    ];
    if let RuleTag::Shard(i) = t {
        out.push((d.clone(), e.clone(), RuleTag::Shard(i.wrapping_add(1)), al));
    }
    for other in Algorithm::ALL {
        out.push((d.clone(), e.clone(), t, other));
    }
    if let Some(first) = e.first() {
        // Move the first entry into the domain, merge two entries, split a value.
        out.push((
            format!("{d}|{}={}", first.key, first.value),
            e[1..].to_vec(),
            t,
            al,
        ));
        let mut merged = e.clone();
        merged[0].value = appended(&merged[0].value, "|");
        out.push((d.clone(), merged, t, al));
        let mut moved = e.clone();
        moved[0].key = format!("{}={}", first.key, first.value);
        moved[0].value = Value::from("");
        out.push((d.clone(), moved, t, al));
        out.push((d.clone(), e[..e.len() - 1].to_vec(), t, al));
        // An algorithm's tag spelled into the last value.
        let mut spelled = e.clone();
        if let Some(last) = spelled.last_mut() {
            last.value = appended(&last.value, "~fw");
        }
        out.push((d.clone(), spelled, t, Algorithm::TokenBucket));
        // A shard's tag spelled into the first value, unsharded.
        let mut spelled = e.clone();
        spelled[0].value = appended(&spelled[0].value, "~s0");
        out.push((d.clone(), spelled, RuleTag::Configured, al));
        // The first value's lossy and escaped renderings, when it is not UTF-8.
        if first.value.as_str().is_none() {
            for lookalike in [
                String::from_utf8_lossy(first.value.as_bytes()).into_owned(),
                first.value.to_string(),
            ] {
                let mut spelled = e.clone();
                spelled[0].value = lookalike.into();
                out.push((d.clone(), spelled, t, al));
            }
        }
    }
    out.into_iter().filter(|b| b != a).collect()
}

fn key_of((d, e, t, a): &Input) -> String {
    bucket_key("sl:", d, e, *t, *a)
}

#[test]
fn values_are_keyed_by_their_bytes() {
    let key = |v: Value| tb_key("p:", "d", &[Entry::new("user", v)], RuleTag::Configured);
    assert_eq!(key(b"ab\xff".as_slice().into()), "p:{d|user=ab%FF}");
    assert_eq!(
        key(b"\xc3\x28".as_slice().into()),
        "p:{d|user=%C3(}".replace('(', "%28")
    );
    assert_eq!(
        key(vec![0xc3, 0xa9].into()),
        key("é".into()),
        "UTF-8 bytes are the text's key"
    );
    assert_ne!(key(b"ab\xff".as_slice().into()), key("ab\u{FFFD}".into()));
    assert_ne!(key(b"ab\xff".as_slice().into()), key("ab\\xFF".into()));
    assert_ne!(key(b"ab\xff".as_slice().into()), key("ab%FF".into()));
    let long = [b"x".repeat(200), vec![0xff]].concat();
    assert_eq!(
        key(long.clone().into()),
        format!("p:{{d|user=#{}}}", sha1_smol::Sha1::from(&long).digest()),
        "a long value is hashed from its raw bytes"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn non_utf8_values_never_share_a_key_with_text(bytes in raw_bytes(), text in component()) {
        prop_assume!(std::str::from_utf8(&bytes).is_err());
        let key = |v: Value| tb_key("sl:", "d", &[Entry::new("k", v)], RuleTag::Configured);
        let raw = Value::from(bytes.clone());
        let lossy = String::from_utf8_lossy(&bytes).into_owned();
        for lookalike in [text, lossy, raw.to_string()] {
            prop_assert_ne!(key(raw.clone()), key(lookalike.into()));
        }
    }

    #[test]
    fn key_parses_back_to_its_input((domain, entries, tag, algorithm) in input()) {
        let key = bucket_key("sl:", &domain, &entries, tag, algorithm);
        prop_assert_eq!(key.matches('{').count(), 1, "{}", key);
        prop_assert_eq!(key.matches('}').count(), 1, "{}", key);
        prop_assert!(key.is_ascii());
        prop_assert!(!key.contains(['\0', '\r', '\n', ' ']));
        let (d, pairs, t) = parse(&key, "sl:");
        prop_assert!(decoded_matches(&d, domain.as_bytes()), "{} vs {:?}", d, domain);
        prop_assert_eq!(pairs.len(), entries.len());
        for ((k, v), entry) in pairs.iter().zip(&entries) {
            prop_assert!(decoded_matches(k, entry.key.as_bytes()));
            prop_assert!(decoded_matches(v, entry.value.as_bytes()));
        }
        let mut expected_tags: Vec<String> = match tag {
            RuleTag::Configured => Vec::new(),
            RuleTag::Override(o) => vec![format!("o{}/{}", o.requests_per_unit, o.unit)],
            RuleTag::Shard(i) => vec![format!("s{i}")],
            RuleTag::Window(secs) => vec![format!("w{secs}")],
        };
        expected_tags.extend(algorithm.key_tag().map(str::to_string));
        prop_assert_eq!(t, expected_tags);
        let unsharded = match tag {
            RuleTag::Shard(_) => RuleTag::Configured,
            other => other,
        };
        prop_assert_eq!(
            without_shard(&key),
            bucket_key("sl:", &domain, &entries, unsharded, algorithm)
        );
    }

    #[test]
    fn distinct_inputs_give_distinct_keys(a in input(), b in input()) {
        if a != b {
            prop_assert_ne!(key_of(&a), key_of(&b));
        }
        for c in near_miss(&a) {
            prop_assert_ne!(key_of(&a), key_of(&c), "{:?} vs {:?}", a, c);
        }
    }

    #[test]
    fn hash_tag_depends_only_on_domain_and_first_entry(
        domain in component(),
        first in (component(), value()),
        rest_a in entry_list(),
        rest_b in entry_list(),
        tag_a in rule_tag(),
        tag_b in rule_tag(),
        algorithm_a in algorithm(),
        algorithm_b in algorithm(),
    ) {
        let first = Entry::new(first.0, first.1);
        let with = |rest: &[Entry]| {
            let mut e = vec![first.clone()];
            e.extend_from_slice(rest);
            e
        };
        // The shard is part of the hash tag: compare unsharded keys, then each shard.
        let unsharded = |t: RuleTag| match t {
            RuleTag::Shard(_) => RuleTag::Configured,
            other => other,
        };
        let ka = bucket_key("sl:", &domain, &with(&rest_a), unsharded(tag_a), algorithm_a);
        let kb = bucket_key("other:", &domain, &with(&rest_b), unsharded(tag_b), algorithm_b);
        let alone = tb_key("", &domain, std::slice::from_ref(&first), RuleTag::Configured);
        prop_assert_eq!(hash_tag(&ka), hash_tag(&kb));
        prop_assert_eq!(hash_tag(&ka), &alone[1..alone.len() - 1]);
        prop_assert_eq!(slot(&ka), slot(&kb));
        if let RuleTag::Shard(i) = tag_a {
            let sa = bucket_key("sl:", &domain, &with(&rest_a), tag_a, algorithm_a);
            let sb = bucket_key("other:", &domain, &with(&rest_b), tag_a, algorithm_b);
            prop_assert_eq!(hash_tag(&sa), format!("{}~s{i}", hash_tag(&ka)));
            prop_assert_eq!(slot(&sa), slot(&sb));
        }
    }
}
