//! The Lua limit script as a Redis command: encoding a request's hits (each with its algorithm),
//! the EVALSHA → EVAL fallback, and decoding the flat integer reply. See `lua/limit.lua` for the
//! contract.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use crate::algorithm::{Algorithm, Demand, Verdict};
use crate::backend::{BackendError, Hit};

/// The script source, sent with `SCRIPT LOAD` at start and with `EVAL` after a `NOSCRIPT`.
pub(super) const SOURCE: &str = include_str!("../../../../lua/limit.lua");

/// The SHA1 Redis files the script under.
pub(super) static SHA: LazyLock<String> =
    LazyLock::new(|| sha1_smol::Sha1::from(SOURCE).digest().to_string());

/// Integers per key in the reply: allowed, remaining, retry_after_ms, until_full_ms, granted.
const REPLY_WIDTH: usize = 5;

/// Wire value of `retry_after_ms` meaning "never" (the demand exceeds the capacity).
const WIRE_NEVER: i64 = -1;
/// Wire value of a count that saturated (Rust's `f64 as u64` of anything from 2^64 up).
const WIRE_SATURATED: i64 = -2;

const FLAG_REFUND: u64 = 1;
const FLAG_SHADOW: u64 = 2;
const FLAG_QUOTA: u64 = 4;
const FLAG_ALWAYS: u64 = 8;
/// The lease size rides above the four flag bits:
/// `flags = refund + shadow + quota + always + LEASE_UNIT * lease`.
const LEASE_UNIT: u64 = 16;

/// What a call passes besides the hits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct CallArgs {
    /// The test-only clock override; production passes `None` so the script reads `TIME`.
    pub now_ms: Option<u64>,
    /// Added to every key's TTL (drawn per call from `0..expiry_jitter_max`).
    pub jitter_ms: u64,
    /// A read-only call (`ARGV[2] = peek`, see `lua/limit.lua`): its hits ask nothing, and
    /// its reply is [`super::inspect`]'s to decode.
    pub peek: bool,
}

/// Values per key after the keys: algorithm, capacity, requests_per_unit, unit_ms, tokens, flags.
const ARGS_PER_KEY: usize = 6;
/// Upper bound on the encoded bytes of one key's values (a u64 has at most 20 digits).
const ARG_BYTES_PER_KEY: usize = 1 + 20 + 20 + 20 + 20 + 1;

/// Added to the algorithm code of the first key of every request of a batch after the first:
/// the script decides each such group as its own call would (see `lua/limit.lua`).
const GROUP_START: u8 = 16;

/// Builds `EVALSHA <sha> ...` (or `EVAL <source> ...`) for `hits`, each paired with whether it
/// starts a new request's group; `count` is their number. Both buffers are sized up front, so
/// building the command allocates twice, not per argument.
fn command<'a, I>(verb: &str, script: &str, hits: I, count: usize, args: CallArgs) -> Cmd
where
    I: Iterator<Item = (&'a Hit, bool)> + Clone,
{
    let key_bytes: usize = hits.clone().map(|(hit, _)| hit.key.len()).sum();
    let mut cmd = Cmd::with_capacity(
        4 + count * (1 + ARGS_PER_KEY),
        verb.len() + script.len() + 20 + key_bytes + 40 + count * ARG_BYTES_PER_KEY,
    );
    cmd.arg(verb).arg(script).arg(count);
    for (hit, _) in hits.clone() {
        cmd.arg(hit.key.as_str());
    }
    match args.now_ms {
        Some(ms) => cmd.arg(ms),
        None => cmd.arg(""),
    };
    if args.peek {
        cmd.arg("peek");
    } else {
        cmd.arg(args.jitter_ms);
    }
    let hits_again = hits.clone();
    for (hit, starts_group) in hits {
        let Demand {
            algorithm,
            params,
            tokens,
            refund,
            shadow,
            quota,
            lease,
            always,
            holder: _,
        } = hit.demand;
        let bits = [
            (refund, FLAG_REFUND),
            (shadow, FLAG_SHADOW),
            (quota, FLAG_QUOTA),
            (always, FLAG_ALWAYS),
        ]
        .iter()
        .filter(|(set, _)| *set)
        .fold(0, |flags, (_, bit)| flags | bit);
        // Config bounds a lease to a bucket size (u32), so the product is exact in Lua's doubles.
        let flags = bits + lease.saturating_mul(LEASE_UNIT);
        let code = algorithm.wire_code() + if starts_group { GROUP_START } else { 0 };
        cmd.arg(code)
            .arg(params.capacity)
            .arg(params.requests_per_unit)
            .arg(params.unit_ms)
            .arg(tokens)
            .arg(flags);
    }
    // Then the holder of every in-flight key, in key order.
    for (hit, _) in hits_again {
        if hit.demand.algorithm == Algorithm::InFlight {
            cmd.arg(holder_member(hit.demand.holder));
        }
    }
    cmd
}

/// An in-flight holder as its ZSET member: 16 hex digits.
pub(super) fn holder_member(holder: u64) -> String {
    format!("{holder:016x}")
}

/// Runs the script over `hits` (all in one slot) in one round trip; after a `NOSCRIPT` (a
/// restarted or failed-over server, or `SCRIPT FLUSH`) one `EVAL`, which also re-caches it.
pub(super) async fn run<'a, C, I>(
    conn: &mut C,
    hits: I,
    count: usize,
    args: CallArgs,
) -> Result<Value, RedisError>
where
    C: ConnectionLike,
    I: Iterator<Item = &'a Hit> + Clone,
{
    call(conn, hits.map(|hit| (hit, false)), count, args).await
}

/// Runs the script once over the hits of several requests, each decided as its own call
/// would be, in order (a batch; see `lua/limit.lua`). The reply lists every hit in order.
pub(super) async fn run_batch<C>(
    conn: &mut C,
    requests: &[&[Hit]],
    args: CallArgs,
) -> Result<Value, RedisError>
where
    C: ConnectionLike,
{
    let count = requests.iter().map(|hits| hits.len()).sum();
    call(conn, grouped(requests), count, args).await
}

/// Every hit of `requests` in order, with whether it starts a request after the first.
fn grouped<'a>(requests: &'a [&'a [Hit]]) -> impl Iterator<Item = (&'a Hit, bool)> + Clone + 'a {
    requests.iter().enumerate().flat_map(|(request, hits)| {
        hits.iter()
            .enumerate()
            .map(move |(at, hit)| (hit, request > 0 && at == 0))
    })
}

/// EVALSHA, and EVAL after a NOSCRIPT.
pub(super) async fn call<'a, C, I>(
    conn: &mut C,
    hits: I,
    count: usize,
    args: CallArgs,
) -> Result<Value, RedisError>
where
    C: ConnectionLike,
    I: Iterator<Item = (&'a Hit, bool)> + Clone,
{
    let evalsha = command("EVALSHA", &SHA, hits.clone(), count, args);
    match evalsha.query_async::<Value>(conn).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            command("EVAL", SOURCE, hits, count, args)
                .query_async::<Value>(conn)
                .await
        }
        other => other,
    }
}

/// `ASKING` then `EVAL` on one connection: the answer to an ASK redirect (a slot migrating to
/// this node). `EVAL`, since the importing node may not have the script cached.
pub(super) async fn run_asking<'a, C, I>(
    conn: &mut C,
    hits: I,
    count: usize,
    args: CallArgs,
) -> Result<Value, RedisError>
where
    C: ConnectionLike,
    I: Iterator<Item = &'a Hit> + Clone,
{
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore().add_command(command(
        "EVAL",
        SOURCE,
        hits.map(|hit| (hit, false)),
        count,
        args,
    ));
    let mut replies: Vec<Value> = pipe.query_async(conn).await?;
    replies
        .pop()
        .ok_or_else(|| RedisError::from((ErrorKind::Parse, "empty reply to ASKING + EVAL")))
}

/// `SCRIPT LOAD <source>`; the reply is the SHA, checked by [`check_loaded`].
pub(super) fn load_command() -> Cmd {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(SOURCE);
    cmd
}

/// Confirms a `SCRIPT LOAD` reply names the script this build carries.
pub(super) fn check_loaded(reply: &Value) -> Result<(), BackendError> {
    let sha = match reply {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s.as_str()),
        _ => None,
    };
    match sha {
        Some(sha) if sha.eq_ignore_ascii_case(&SHA) => Ok(()),
        _ => Err(BackendError::Protocol(format!(
            "SCRIPT LOAD answered {reply:?}, expected {}",
            *SHA
        ))),
    }
}

/// Decodes the reply for `count` hits: their verdicts in order, and the positions (from 0) of
/// the keys the script repaired (deleted foreign data under them and decided them fresh). The
/// length and shape are checked up front, so the iterator only fails on an out-of-range value.
pub(super) fn decode(
    reply: &Value,
    count: usize,
) -> Result<
    (
        impl Iterator<Item = Result<Verdict, BackendError>> + '_,
        Vec<usize>,
    ),
    BackendError,
> {
    let (items, repaired) = split_reply(reply, count)?;
    let verdicts = items.chunks_exact(REPLY_WIDTH).map(verdict);
    Ok((verdicts, repaired))
}

/// One key's verdict from its first [`REPLY_WIDTH`] reply items (a shorter slice is a protocol
/// error).
pub(super) fn verdict(items: &[Value]) -> Result<Verdict, BackendError> {
    let [allowed, remaining, retry, until_full, granted, ..] = items else {
        return Err(BackendError::Protocol(format!(
            "script reply: {} items for a key, expected {REPLY_WIDTH}",
            items.len()
        )));
    };
    let allowed = match int(allowed)? {
        0 => false,
        1 => true,
        n => return Err(BackendError::Protocol(format!("allowed flag {n}"))),
    };
    let retry_after_ms = match int(retry)? {
        WIRE_NEVER => None,
        n => Some(count_from_wire(n)?),
    };
    Ok(Verdict {
        allowed,
        remaining: count_from_wire(int(remaining)?)?,
        retry_after_ms,
        until_full_ms: count_from_wire(int(until_full)?)?,
        granted: count_from_wire(int(granted)?)?,
    })
}

/// The reply's per-key items, and the repaired positions that follow them: `r`, then `r`
/// positions in 1..=count.
fn split_reply(reply: &Value, count: usize) -> Result<(&[Value], Vec<usize>), BackendError> {
    let width = count * REPLY_WIDTH;
    let shape_error = |got: String| {
        BackendError::Protocol(format!(
            "script reply for {count} keys: expected {width} integers, a count r and r positions, got {got}"
        ))
    };
    let Value::Array(items) = reply else {
        return Err(shape_error(describe(reply)));
    };
    let repaired = match items.get(width).map(int) {
        Some(Ok(r)) if r >= 0 && items.len() == width + 1 + r as usize => &items[width + 1..],
        _ => return Err(shape_error(describe(reply))),
    };
    let positions = repaired
        .iter()
        .map(|item| match int(item)? {
            n if n >= 1 && n as usize <= count => Ok(n as usize - 1),
            n => Err(shape_error(format!("repaired position {n}"))),
        })
        .collect::<Result<Vec<usize>, BackendError>>()?;
    Ok((&items[..width], positions))
}

pub(super) fn int(value: &Value) -> Result<i64, BackendError> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(BackendError::Protocol(format!(
            "script reply item: expected an integer, got {}",
            describe(other)
        ))),
    }
}

/// A count as the script sends it: non-negative as is; [2^63, 2^64) as value - 2^64, so the
/// two's-complement bits are the value; from 2^64 up as [`WIRE_SATURATED`].
pub(super) fn count_from_wire(n: i64) -> Result<u64, BackendError> {
    match n {
        WIRE_SATURATED => Ok(u64::MAX),
        WIRE_NEVER => Err(BackendError::Protocol(
            "count -1 outside retry_after".into(),
        )),
        n => Ok(n as u64),
    }
}

pub(super) fn describe(value: &Value) -> String {
    match value {
        Value::Array(items) => format!("an array of {}", items.len()),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, BucketParams};

    const PARAMS: BucketParams = BucketParams {
        capacity: 10,
        requests_per_unit: 5,
        unit_ms: 1_000,
    };

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                _ => "<not simple>".into(),
            })
            .collect()
    }

    #[test]
    fn command_lists_keys_then_now_and_jitter_then_six_values_per_key() {
        let mut refund = Hit::new("{t}b", PARAMS, 3).using(Algorithm::Gcra);
        refund.demand.refund = true;
        refund.demand.shadow = true;
        let hits = [Hit::new("{t}a", PARAMS, 2), refund];
        let cmd = command(
            "EVALSHA",
            &SHA,
            hits.iter().map(|hit| (hit, false)),
            hits.len(),
            CallArgs::default(),
        );
        assert_eq!(
            args(&cmd),
            [
                "EVALSHA", &SHA, "2", "{t}a", "{t}b", "", "0", "1", "10", "5", "1000", "2", "0",
                "4", "10", "5", "1000", "3", "3"
            ]
        );
        let at = CallArgs {
            now_ms: Some(42),
            jitter_ms: 7,
            peek: false,
        };
        let mut lease = Hit::new("{t}l", PARAMS, 1);
        lease.demand.lease = 9;
        lease.demand.shadow = true;
        let cmd = command(
            "EVALSHA",
            &SHA,
            std::iter::once((&lease, false)),
            1,
            CallArgs::default(),
        );
        assert_eq!(args(&cmd)[10..], ["1", "146"], "shadow (2) + 16 × 9");
        lease.demand.quota = true;
        lease.demand.shadow = false;
        let cmd = command(
            "EVALSHA",
            &SHA,
            std::iter::once((&lease, false)),
            1,
            CallArgs::default(),
        );
        assert_eq!(args(&cmd)[10..], ["1", "148"], "quota (4) + 16 × 9");
        let mut charge = Hit::new("{t}c", PARAMS, 60);
        charge.demand.always = true;
        let cmd = command(
            "EVALSHA",
            &SHA,
            std::iter::once((&charge, false)),
            1,
            CallArgs::default(),
        );
        assert_eq!(args(&cmd)[10..], ["60", "8"], "always (8)");
        let window = Hit::new("{t}a", PARAMS, 2).using(Algorithm::FixedWindow);
        let cmd = command("EVAL", SOURCE, std::iter::once((&window, false)), 1, at);
        assert_eq!(
            args(&cmd)[3..],
            ["{t}a", "42", "7", "2", "10", "5", "1000", "2", "0"]
        );
    }

    #[test]
    fn batch_marks_the_first_key_of_every_later_request() {
        let first = [Hit::new("{a}x", PARAMS, 1), Hit::new("{a}y", PARAMS, 1)];
        let second = [Hit::new("{a}x", PARAMS, 1).using(Algorithm::Gcra)];
        let requests: [&[Hit]; 2] = [&first, &second];
        let count = 3;
        let cmd = command(
            "EVALSHA",
            &SHA,
            grouped(&requests),
            count,
            CallArgs::default(),
        );
        let args = args(&cmd);
        assert_eq!(args[2..6], ["3", "{a}x", "{a}y", "{a}x"]);
        let codes: Vec<&str> = (0..count).map(|i| args[8 + 6 * i].as_str()).collect();
        assert_eq!(codes, ["1", "1", "20"], "gcra (4) + GROUP_START (16)");
    }

    #[test]
    fn decode_maps_wire_values() {
        let reply = Value::Array(
            [
                1, 7, 0, 600, 3, 0, 0, -1, 2000, 0, 0, 3, -2, -4096, 0, 2, 1, 3,
            ]
            .map(Value::Int)
            .to_vec(),
        );
        let (verdicts, repaired) = decode(&reply, 3).unwrap();
        let verdicts: Vec<Verdict> = verdicts.map(Result::unwrap).collect();
        assert_eq!(repaired, [0, 2]);
        assert_eq!(
            verdicts,
            [
                Verdict {
                    allowed: true,
                    remaining: 7,
                    retry_after_ms: Some(0),
                    until_full_ms: 600,
                    granted: 3,
                },
                Verdict {
                    allowed: false,
                    remaining: 0,
                    retry_after_ms: None,
                    until_full_ms: 2000,
                    granted: 0,
                },
                Verdict {
                    allowed: false,
                    remaining: 3,
                    retry_after_ms: Some(u64::MAX),
                    until_full_ms: u64::MAX - 4095,
                    granted: 0,
                },
            ]
        );
    }

    #[test]
    fn decode_rejects_wrong_shapes() {
        let reply = |items: &[i64]| Value::Array(items.iter().copied().map(Value::Int).collect());
        let first = |reply: &Value| decode(reply, 1).map(|(mut v, _)| v.next());
        for bad in [
            &[1, 0, 0, 0][..],
            &[1, 0, 0, 0, 0],
            &[1, 0, 0, 0, 0, 1],
            &[1, 0, 0, 0, 0, 0, 1],
            &[1, 0, 0, 0, 0, 1, 2],
            &[1, 0, 0, 0, 0, 1, 0],
            &[1, 0, 0, 0, 0, -1],
        ] {
            assert!(
                matches!(first(&reply(bad)), Err(BackendError::Protocol(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            first(&reply(&[1, 0, 0, 0, 0, 0])),
            Ok(Some(Ok(_)))
        ));
        let not_int = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"7".to_vec()),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
        ]);
        assert!(matches!(
            first(&not_int),
            Ok(Some(Err(BackendError::Protocol(_))))
        ));
        assert!(
            first(&reply(&[2, 0, 0, 0, 0, 0]))
                .unwrap()
                .unwrap()
                .is_err()
        );
        assert!(decode(&Value::Nil, 1).is_err());
    }

    #[test]
    fn sha_matches_script_load_reply() {
        assert_eq!(SHA.len(), 40);
        assert!(check_loaded(&Value::BulkString(SHA.as_bytes().to_vec())).is_ok());
        assert!(check_loaded(&Value::BulkString(b"0000".to_vec())).is_err());
    }
}
