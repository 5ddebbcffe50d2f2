//! Storage keys: `<prefix>{<domain>|<k1>=<v1>}|<k2>=<v2>...<tags>`, injective and hash-tagged.
//!
//! Every user-supplied component (domain, entry keys and values) is escaped byte by byte (a value
//! is bytes and need not be UTF-8; a UTF-8 value's key is its text's): bytes outside
//! `[A-Za-z0-9._:/@+*-]` become `%XX`, so input can never open or close the hash tag or fake a
//! separator (`{ } | = ~ #` are always escaped). A component whose escaped form is longer than
//! [`MAX_COMPONENT`] bytes becomes `#` + the 40-hex SHA-1 of its raw bytes; `#` never appears in
//! escaped text, so a hashed component cannot equal an escaped one. The key therefore parses back
//! into (domain, entries, tags) unambiguously: distinct inputs give distinct keys.
//!
//! Tags follow the entries, each after a `~` (which escaped text never holds): `~o<n>/<unit>`
//! for a request's `limit` override, then `~fw`, `~sw` or `~gcra` for a rule counted by the fixed
//! window, sliding window or GCRA. A token bucket has no algorithm tag: its keys are the ones
//! sluice always wrote, so upgrading keeps every bucket, and a rule whose algorithm changes on a
//! reload starts afresh under another key instead of misreading the other algorithm's state.
//!
//! The hash tag is `<domain>|<first entry>`, so every descriptor of a request that shares domain
//! and first entry lives in one Redis Cluster slot and is decided by one script call. The prefix
//! is operator configuration, written as is; it must not contain `{` or `}`.
//!
//! One tag goes *inside* the hash tag: `~s<i>`, shard `i` of a rule with `shards: N` (hot-key
//! splitting), written just before the closing `}`. It changes the slot, so the N sub-buckets of
//! one descriptor spread over the Cluster; an unsharded key has no such tag and is byte-identical
//! to what earlier releases wrote.
//!
//! A value shared through `share_threshold` (every value a wildcard matches counts in one bucket)
//! is written as `#*` and the escaped pattern: `#` never appears in escaped text and a hashed
//! component is `#` and hex, so a shared bucket's key cannot equal a key of any request value.
//!
//! Examples: `sluice:{edge|tenant=acme}|route=export` (a token bucket),
//! `sluice:{edge|tenant=acme}|path=#*/files/*` (every `/files/*` path in one bucket),
//! `sluice:{edge|tenant=acme}|route=export~o10/second~fw` (an override, fixed window),
//! `sluice:{edge|tenant=acme~s3}|route=export` (shard 3 of a sharded rule).

use crate::algorithm::Algorithm;
use crate::request::{Entry, LimitOverride};

/// Escaped components longer than this are replaced by their hash (keeps keys short; Redis keys
/// and `redis-cli --scan` output stay readable with pathological values).
pub const MAX_COMPONENT: usize = 128;

/// Length of a hashed component: `#` and 40 hex digits.
const HASHED_LEN: usize = 41;

/// Which rule a bucket belongs to, beyond its descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuleTag {
    /// The rule from the config: adds nothing to the key.
    Configured,
    /// A request's `limit` override: its own bucket, never shared with the configured rule or
    /// another override.
    Override(LimitOverride),
    /// Shard `i` of a configured rule with `shards: N` (`i < N`): one of the rule's N
    /// sub-buckets, tagged inside the hash tag so the shards of one descriptor land on different
    /// Cluster slots. Overrides are never sharded.
    Shard(u8),
    /// One limit of a rule with several (`rate_limits`), by its window in seconds: `~w<secs>`
    /// after the hash tag, so every limit of a descriptor shares its Cluster slot (one script
    /// call) and keeps its state when another limit is added or removed.
    Window(u64),
}

impl RuleTag {
    /// The tag of a configured rule's bucket: its window for a limit of a `rate_limits` list,
    /// nothing otherwise. (A sharded rule's shard is chosen per request.)
    pub const fn configured(rule: &crate::rule::Rule) -> RuleTag {
        match rule.window_tag {
            Some(secs) => RuleTag::Window(secs),
            None => RuleTag::Configured,
        }
    }
}

/// The storage key of one bucket (or window counter, or arrival time).
pub fn bucket_key(
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    tag: RuleTag,
    algorithm: Algorithm,
) -> String {
    let mut out = String::new();
    write_bucket_key(&mut out, prefix, domain, entries, tag, algorithm);
    out
}

/// [`write_bucket_key`] where `shared[i]`, when set, stands for entry `i`'s value: the
/// `share_threshold` pattern its value matched ([`crate::rule::Rule::shared_values`]). An empty
/// `shared` writes exactly what [`write_bucket_key`] writes.
pub fn write_shared_bucket_key(
    out: &mut String,
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    shared: &[Option<std::sync::Arc<str>>],
    tag: RuleTag,
    algorithm: Algorithm,
) {
    write_key(out, prefix, domain, entries, shared, tag, algorithm);
}

/// Appends the storage key of one bucket to `out` (so callers can reuse a buffer). Reserves the
/// exact length first: at most one allocation.
pub fn write_bucket_key(
    out: &mut String,
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    tag: RuleTag,
    algorithm: Algorithm,
) {
    write_key(out, prefix, domain, entries, &[], tag, algorithm);
}

fn write_key(
    out: &mut String,
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    shared: &[Option<std::sync::Arc<str>>],
    tag: RuleTag,
    algorithm: Algorithm,
) {
    let shared_at = |i: usize| shared.get(i).and_then(Option::as_deref);
    debug_assert!(
        !prefix.contains(['{', '}']),
        "a key prefix with braces would move the hash tag"
    );
    // "{" "|" "}" plus, per entry, "=" and (after the first) "|".
    let mut len = prefix.len() + 3 + component_len(domain.as_bytes());
    for (i, entry) in entries.iter().enumerate() {
        let value_len = match shared_at(i) {
            Some(pattern) => 2 + component_len(pattern.as_bytes()),
            None => component_len(entry.value.as_bytes()),
        };
        len += usize::from(i > 0) + 1 + component_len(entry.key.as_bytes()) + value_len;
    }
    match tag {
        RuleTag::Configured => {}
        // "~o" + u32 digits + "/" + the longest unit name.
        RuleTag::Override(_) => len += 2 + 10 + 1 + 6,
        // "~s" + the index's digits.
        RuleTag::Shard(i) => len += 2 + decimal_digits(i),
        // "~w" + u64 digits.
        RuleTag::Window(_) => len += 2 + 20,
    }
    let algorithm_tag = algorithm.key_tag();
    if let Some(t) = algorithm_tag {
        len += 1 + t.len();
    }
    out.reserve(len);

    out.push_str(prefix);
    out.push('{');
    write_component(out, domain.as_bytes());
    out.push('|');
    for (i, entry) in entries.iter().enumerate() {
        if i == 1 {
            close_hash_tag(out, tag);
        }
        if i >= 1 {
            out.push('|');
        }
        write_component(out, entry.key.as_bytes());
        out.push('=');
        match shared_at(i) {
            Some(pattern) => {
                out.push_str("#*");
                write_component(out, pattern.as_bytes());
            }
            None => write_component(out, entry.value.as_bytes()),
        }
    }
    if entries.len() <= 1 {
        close_hash_tag(out, tag);
    }
    if let RuleTag::Override(o) = tag {
        use std::fmt::Write;
        // Writing to a String cannot fail.
        let _ = write!(out, "~o{}/{}", o.requests_per_unit, o.unit.as_str());
    }
    if let RuleTag::Window(secs) = tag {
        use std::fmt::Write;
        // Writing to a String cannot fail.
        let _ = write!(out, "~w{secs}");
    }
    if let Some(t) = algorithm_tag {
        out.push('~');
        out.push_str(t);
    }
}

/// Ends the hash tag: the shard tag, if any, then `}`.
fn close_hash_tag(out: &mut String, tag: RuleTag) {
    if let RuleTag::Shard(i) = tag {
        use std::fmt::Write;
        // Writing to a String cannot fail.
        let _ = write!(out, "~s{i}");
    }
    out.push('}');
}

const fn decimal_digits(n: u8) -> usize {
    match n {
        0..=9 => 1,
        10..=99 => 2,
        _ => 3,
    }
}

/// `key` without its shard tag (`~s<i>` before the hash tag's `}`): the key the descriptor has
/// when its rule is not sharded. Borrowed when there is no shard tag. Only for keys written by
/// [`write_bucket_key`] (the prefix holds no braces; escaped text holds no `~`).
pub fn without_shard(key: &str) -> std::borrow::Cow<'_, str> {
    let Some(open) = key.find('{') else {
        return key.into();
    };
    let Some(close) = key[open..].find('}').map(|c| open + c) else {
        return key.into();
    };
    match key[open..close].rfind("~s").map(|t| open + t) {
        Some(tag) if close > tag + 2 && key[tag + 2..close].bytes().all(|b| b.is_ascii_digit()) => {
            format!("{}{}", &key[..tag], &key[close..]).into()
        }
        _ => key.into(),
    }
}

/// The part of `key` Redis Cluster hashes: the bytes between the first `{` and the next `}` when
/// that is non-empty, else the whole key.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag, mod 16384.
pub fn slot(key: &str) -> u16 {
    crc16(hash_tag(key).as_bytes()) & 0x3FFF
}

/// Bytes that stand for themselves in a key: readable, and none of them is a separator.
const fn is_plain(b: u8) -> bool {
    matches!(b, b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b':' | b'/' | b'@' | b'+' | b'*' | b'-')
}

fn escaped_len(s: &[u8]) -> usize {
    s.iter().map(|&b| if is_plain(b) { 1 } else { 3 }).sum()
}

fn component_len(s: &[u8]) -> usize {
    match escaped_len(s) {
        n if n > MAX_COMPONENT => HASHED_LEN,
        n => n,
    }
}

const LOWER_HEX: &[u8; 16] = b"0123456789abcdef";

/// Writes one component from its bytes (a value need not be UTF-8; the key is ASCII either way).
fn write_component(out: &mut String, s: &[u8]) {
    if escaped_len(s) > MAX_COMPONENT {
        out.push('#');
        for b in sha1_smol::Sha1::from(s).digest().bytes() {
            out.push(char::from(LOWER_HEX[usize::from(b >> 4)]));
            out.push(char::from(LOWER_HEX[usize::from(b & 0xF)]));
        }
        return;
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in s {
        if is_plain(b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        }
    }
}

/// CRC16-CCITT, XMODEM variant (polynomial 0x1021, initial value 0, no reflection), as in Redis
/// Cluster's `keyHashSlot`.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests;
