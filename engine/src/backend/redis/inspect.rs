//! Reading and resetting keys for the admin listener. A peek is `lua/limit.lua` in its read-only
//! mode (`ARGV[2] = peek`), one key per call: the same code that decides brings the key to
//! Redis's now, and nothing is written, the TTL included. A reset is `PEXPIRE key 0`, which
//! deletes the key with a command the least-privilege ACL user already has.
//!
//! Each call goes to the node that holds the key (the server, Sentinel mode's current master,
//! the slot's master in the Cluster view; a Cluster redirect is not followed, so a key caught
//! mid-migration fails and is tried again by the operator). Neither passes through the circuit
//! breakers, so an operator's look at a key never opens or closes one, and each is bounded by
//! the Redis deadline, at least [`ADMIN_TIMEOUT`].

use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionLike;

use super::call::{bounded, classify};
use super::{Link, RedisBackend, script};
use crate::algorithm::{
    Algorithm, BucketState, GcraState, Peek, Reserved, SlidingState, Slots, State, WindowState,
};
use crate::backend::{BackendError, Hit, KeyPeek};

/// Least time an admin call is given: it is no decision, and a loaded server may take longer than
/// `--redis-timeout` to answer it.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Items of a peek reply per key: the verdict's 5, the PTTL, three state fields.
const PEEK_WIDTH: usize = 9;
/// `PTTL`'s answer for a key that does not exist.
const NO_KEY: i64 = -2;

enum Op<'a> {
    Peek(&'a Hit, script::CallArgs),
    Reset(&'a str),
}

async fn run<C: ConnectionLike>(conn: &mut C, op: &Op<'_>) -> Result<Value, BackendError> {
    match op {
        Op::Peek(hit, args) => script::call(conn, std::iter::once((*hit, false)), 1, *args)
            .await
            .map_err(classify),
        Op::Reset(key) => redis::cmd("PEXPIRE")
            .arg(*key)
            .arg(0)
            .query_async(conn)
            .await
            .map_err(classify),
    }
}

impl RedisBackend {
    /// Reads each hit's key without writing anything.
    pub(super) async fn peek_each(&self, hits: &[Hit]) -> Vec<Result<KeyPeek, BackendError>> {
        let args = script::CallArgs {
            now_ms: self.test_clock.as_ref().map(|clock| clock.now_ms()),
            jitter_ms: 0,
            peek: true,
        };
        let mut out = Vec::with_capacity(hits.len());
        for hit in hits {
            let mut quiet = hit.clone();
            quiet.demand.tokens = 0;
            quiet.demand.refund = false;
            quiet.demand.shadow = false;
            quiet.demand.quota = false;
            quiet.demand.lease = 0;
            let reply = self.on_owner(&hit.key, Op::Peek(&quiet, args)).await;
            out.push(reply.and_then(|reply| decode(&reply, hit.demand.algorithm)));
        }
        out
    }

    /// Deletes each hit's key; true where it existed.
    pub(super) async fn reset_each(&self, hits: &[Hit]) -> Vec<Result<bool, BackendError>> {
        let mut out = Vec::with_capacity(hits.len());
        for hit in hits {
            let reply = self.on_owner(&hit.key, Op::Reset(&hit.key)).await;
            out.push(reply.and_then(|reply| match reply {
                Value::Int(n) => Ok(n == 1),
                other => Err(BackendError::Protocol(format!(
                    "PEXPIRE answered {}",
                    script::describe(&other)
                ))),
            }));
        }
        out
    }

    /// Runs `op` on the node holding `key`.
    async fn on_owner(&self, key: &str, op: Op<'_>) -> Result<Value, BackendError> {
        let timeout = self.command_timeout.max(ADMIN_TIMEOUT);
        match &self.link {
            Link::Standalone(manager, _, _) => {
                let mut conn = manager.clone();
                bounded(timeout, run(&mut conn, &op)).await
            }
            Link::Sentinel(link) => {
                let mut conn = link.master_connection()?;
                bounded(timeout, run(&mut conn, &op)).await
            }
            Link::Cluster(link) => {
                let mut conn = link.owner_connection(key)?;
                bounded(timeout, run(&mut conn, &op)).await
            }
        }
    }
}

/// A peek reply for one key of `algorithm`: [`PEEK_WIDTH`] items, now, then `r` and the
/// positions of the keys that held foreign data.
fn decode(reply: &Value, algorithm: Algorithm) -> Result<KeyPeek, BackendError> {
    let shape = || {
        BackendError::Protocol(format!(
            "peek reply: expected {} items, got {}",
            PEEK_WIDTH + 2,
            script::describe(reply)
        ))
    };
    let Value::Array(items) = reply else {
        return Err(shape());
    };
    if items.len() < PEEK_WIDTH + 2 {
        return Err(shape());
    }
    let verdict = script::verdict(&items[..5])?;
    let pttl = script::int(&items[5])?;
    let fields = [field(&items[6])?, field(&items[7])?, field(&items[8])?];
    let now_ms = script::count_from_wire(script::int(&items[PEEK_WIDTH])?)?;
    let foreign = script::int(&items[PEEK_WIDTH + 1])? > 0;
    Ok(KeyPeek {
        now_ms,
        peek: Peek {
            state: state_of(algorithm, fields)?,
            verdict,
        },
        stored: pttl != NO_KEY && !foreign,
        ttl_ms: u64::try_from(pttl).ok(),
        foreign,
    })
}

/// A state field as the script formats it (`%.17g`, or empty past the algorithm's last).
fn field(value: &Value) -> Result<Option<f64>, BackendError> {
    let text = match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text.as_str()),
        _ => None,
    };
    match text {
        Some("") => Ok(None),
        Some(text) => text.parse().map(Some).map_err(|_| {
            BackendError::Protocol(format!("peek reply: state field {text:?} is not a number"))
        }),
        None => Err(BackendError::Protocol(format!(
            "peek reply: state field {}",
            script::describe(value)
        ))),
    }
}

/// The state fields in `lua/limit.lua`'s order for `algorithm`.
fn state_of(algorithm: Algorithm, fields: [Option<f64>; 3]) -> Result<State, BackendError> {
    let missing = || BackendError::Protocol(format!("peek reply: {algorithm} state incomplete"));
    let [a, b, c] = fields;
    let (a, b) = (a.ok_or_else(missing)?, b.ok_or_else(missing)?);
    Ok(match algorithm {
        Algorithm::TokenBucket => State::TokenBucket(BucketState {
            tokens: a,
            updated_ms: b as u64,
        }),
        Algorithm::FixedWindow => State::FixedWindow(WindowState {
            start_ms: a as u64,
            count: b as u64,
        }),
        Algorithm::SlidingWindow => State::SlidingWindow(SlidingState {
            start_ms: a as u64,
            current: b as u64,
            previous: c.ok_or_else(missing)? as u64,
        }),
        Algorithm::Gcra => State::Gcra(GcraState {
            tat_ms: a,
            tat_frac: b,
        }),
        Algorithm::Reservation => State::Reserved(Reserved {
            amount: a as u64,
            expires_ms: b as u64,
        }),
        Algorithm::InFlight => State::InFlight(Slots {
            live: a as u64,
            holds: false,
            first_expiry_ms: b as u64,
            last_expiry_ms: c.ok_or_else(missing)? as u64,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn decodes_a_peek_reply() {
        let reply = Value::Array(vec![
            Value::Int(1),
            Value::Int(6),
            Value::Int(0),
            Value::Int(800),
            Value::Int(0),
            Value::Int(1800),
            bulk("6.5"),
            bulk("1700000000000"),
            bulk(""),
            Value::Int(1_700_000_000_100),
            Value::Int(0),
        ]);
        let peek = decode(&reply, Algorithm::TokenBucket).unwrap();
        assert_eq!(peek.now_ms, 1_700_000_000_100);
        assert_eq!(peek.ttl_ms, Some(1800));
        assert!(peek.stored && !peek.foreign);
        assert_eq!(peek.peek.verdict.remaining, 6);
        assert_eq!(
            peek.peek.state,
            State::TokenBucket(BucketState {
                tokens: 6.5,
                updated_ms: 1_700_000_000_000
            })
        );
        assert!(
            decode(&reply, Algorithm::SlidingWindow).is_err(),
            "3 fields"
        );
        assert!(decode(&Value::Array(vec![Value::Int(1)]), Algorithm::Gcra).is_err());
    }
}
