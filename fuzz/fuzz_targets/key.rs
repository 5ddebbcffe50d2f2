//! Bucket keys: every key parses back into its inputs (so distinct inputs give distinct keys),
//! the hash tag covers exactly the domain, the first entry and the shard, and two inputs share a
//! key only if they are equal — the algorithm and shard included, so two algorithms never share a
//! key and neither do two shards, or a shard and the unsharded bucket.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use sluice::algorithm::Algorithm;
use sluice::key::{RuleTag, bucket_key, hash_tag, slot, without_shard};
use sluice::request::{Entry, LimitOverride};
use sluice::rule::Unit;

#[derive(Arbitrary, Debug, Clone, PartialEq, Eq)]
struct KeyInput {
    domain: String,
    entries: Vec<(String, String)>,
    override_rate: Option<(u32, u8)>,
    /// A shard of a sharded rule (overrides are never sharded: the override wins).
    shard: Option<u8>,
    /// One limit of a `rate_limits` rule, by its window (never sharded or overridden).
    window: Option<u64>,
    algorithm: u8,
}

impl KeyInput {
    fn entries(&self) -> Vec<Entry> {
        self.entries
            .iter()
            .map(|(k, v)| Entry::new(k.as_str(), v.as_str()))
            .collect()
    }

    fn tag(&self) -> RuleTag {
        match (self.override_rate, self.shard) {
            (None, None) => self.window.map_or(RuleTag::Configured, RuleTag::Window),
            (None, Some(i)) => RuleTag::Shard(i),
            (Some((n, u)), _) => RuleTag::Override(LimitOverride {
                requests_per_unit: n,
                unit: Unit::ALL[usize::from(u) % Unit::ALL.len()],
            }),
        }
    }

    fn algorithm(&self) -> Algorithm {
        Algorithm::ALL[usize::from(self.algorithm) % Algorithm::ALL.len()]
    }

    fn key(&self) -> String {
        bucket_key(
            PREFIX,
            &self.domain,
            &self.entries(),
            self.tag(),
            self.algorithm(),
        )
    }
}

const PREFIX: &str = "sl:";

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b".-_:/@+*".contains(&b)
}

/// Whether an encoded component stands for `raw`: its escaped spelling, or `#` and the SHA-1
/// of `raw`.
fn stands_for(encoded: &str, raw: &str) -> bool {
    if let Some(digest) = encoded.strip_prefix('#') {
        return digest == sha1_smol::Sha1::from(raw.as_bytes()).digest().to_string();
    }
    let b = encoded.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let Some(hex) = encoded.get(i + 1..i + 3) else {
                return false;
            };
            let Ok(byte) = u8::from_str_radix(hex, 16) else {
                return false;
            };
            if is_plain(byte) {
                return false; // escaping is canonical
            }
            out.push(byte);
            i += 3;
        } else {
            if !is_plain(b[i]) {
                return false;
            }
            out.push(b[i]);
            i += 1;
        }
    }
    out == raw.as_bytes()
}

/// Splits a key back into (domain, [(key, value)], tags) using only the separators; the tags
/// inside the hash tag (the shard) come first.
fn parse(key: &str) -> (&str, Vec<(&str, &str)>, Vec<&str>) {
    let rest = key.strip_prefix(PREFIX).expect("prefix");
    let rest = rest.strip_prefix('{').expect("tag opens after the prefix");
    let (inside, after) = rest.split_once('}').expect("tag closes");
    let mut inner = inside.split('~');
    let inside = inner.next().expect("split yields at least one part");
    let mut tags: Vec<&str> = inner.collect();
    let mut parts = after.split('~');
    let body = parts.next().expect("split yields at least one part");
    tags.extend(parts);
    let (domain, first) = inside.split_once('|').expect("domain separator");
    let mut pairs = Vec::new();
    if !first.is_empty() {
        pairs.push(first.split_once('=').expect("pair separator"));
    }
    if !body.is_empty() {
        let body = body.strip_prefix('|').expect("entry separator");
        pairs.extend(
            body.split('|')
                .map(|p| p.split_once('=').expect("pair separator")),
        );
    }
    (domain, pairs, tags)
}

fn check_round_trip(input: &KeyInput) -> String {
    let key = input.key();
    assert!(key.is_ascii(), "{key:?}");
    assert_eq!(key.matches('{').count(), 1, "{key:?}");
    assert_eq!(key.matches('}').count(), 1, "{key:?}");
    assert!(
        !key.bytes().any(|b| b.is_ascii_control() || b == b' '),
        "{key:?}"
    );
    let (domain, pairs, tags) = parse(&key);
    assert!(stands_for(domain, &input.domain), "{key:?} vs {input:?}");
    assert_eq!(pairs.len(), input.entries.len(), "{key:?}");
    for ((k, v), (rk, rv)) in pairs.iter().zip(&input.entries) {
        assert!(stands_for(k, rk), "{key:?} vs {input:?}");
        assert!(stands_for(v, rv), "{key:?} vs {input:?}");
    }
    let mut expected_tags: Vec<String> = match input.tag() {
        RuleTag::Configured => Vec::new(),
        RuleTag::Override(o) => vec![format!("o{}/{}", o.requests_per_unit, o.unit)],
        RuleTag::Shard(i) => vec![format!("s{i}")],
        RuleTag::Window(secs) => vec![format!("w{secs}")],
    };
    expected_tags.extend(input.algorithm().key_tag().map(str::to_string));
    assert_eq!(tags, expected_tags, "{key:?}");
    // The Cluster hash tag: the domain, first entry and shard only.
    let shard = match input.tag() {
        RuleTag::Shard(i) => Some(i),
        _ => None,
    };
    let first_only = KeyInput {
        entries: input.entries.iter().take(1).cloned().collect(),
        override_rate: None,
        shard,
        algorithm: 0,
        ..input.clone()
    };
    let alone = first_only.key();
    assert_eq!(hash_tag(&key), hash_tag(&alone));
    assert_eq!(slot(&key), slot(&alone));
    // Stripping the shard gives the unsharded key (a shard's input carries no window).
    let unsharded = match input.tag() {
        RuleTag::Shard(_) => KeyInput {
            shard: None,
            window: None,
            ..input.clone()
        },
        _ => input.clone(),
    };
    assert_eq!(without_shard(&key), unsharded.key(), "{key:?}");
    key
}

fuzz_target!(|pair: (KeyInput, KeyInput)| {
    let (a, b) = pair;
    let (ka, kb) = (check_round_trip(&a), check_round_trip(&b));
    let meaning = |i: &KeyInput| (i.domain.clone(), i.entries.clone(), i.tag(), i.algorithm());
    if meaning(&a) != meaning(&b) {
        assert_ne!(ka, kb, "{a:?} and {b:?} share a key");
    } else {
        assert_eq!(ka, kb);
    }
});
