//! The replica heartbeat as a Redis command (see `lua/heartbeat.lua` for the contract).
//!
//! Sent with `EVAL` every time: it runs once per interval per replica, so the script cache and
//! its `NOSCRIPT` path would save nothing worth the extra code.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

use super::call::classify;
use crate::backend::BackendError;

const SOURCE: &str = include_str!("../../../../lua/heartbeat.lua");

pub(super) fn command(key: &str, member: &str, ttl: Duration) -> Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SOURCE)
        .arg(1)
        .arg(key)
        .arg(member)
        .arg((ttl.as_millis() as u64).max(1));
    cmd
}

/// What one heartbeat found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Beat {
    /// Live replicas, this one included.
    pub live: u64,
    /// The set's key held something else (foreign data) and was replaced.
    pub repaired: bool,
}

/// Runs the heartbeat.
pub(super) async fn run<C: ConnectionLike>(conn: &mut C, cmd: &Cmd) -> Result<Beat, BackendError> {
    let reply: Value = cmd.query_async(conn).await.map_err(classify)?;
    decode(&reply)
}

fn decode(reply: &Value) -> Result<Beat, BackendError> {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(live), Value::Int(repaired @ (0 | 1))] if *live >= 1 => Ok(Beat {
                live: *live as u64,
                repaired: *repaired == 1,
            }),
            _ => Err(unexpected(reply)),
        },
        other => Err(unexpected(other)),
    }
}

fn unexpected(reply: &Value) -> BackendError {
    BackendError::Protocol(format!(
        "heartbeat reply: expected a count >= 1 and a repaired flag, got {reply:?}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_shape_and_reply() {
        let cmd = command("sluice:replicas", "pod-a", Duration::from_secs(5));
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[0], b"EVAL");
        assert_eq!(
            &args[2..],
            [&b"1"[..], b"sluice:replicas", b"pod-a", b"5000"]
        );
        let pair = |live, repaired| Value::Array(vec![Value::Int(live), Value::Int(repaired)]);
        assert_eq!(
            decode(&pair(3, 0)),
            Ok(Beat {
                live: 3,
                repaired: false
            })
        );
        assert_eq!(decode(&pair(1, 1)).map(|b| b.repaired), Ok(true));
        assert!(decode(&pair(0, 0)).is_err());
        assert!(decode(&pair(2, 2)).is_err());
        assert!(decode(&Value::Int(3)).is_err());
        assert!(decode(&Value::Nil).is_err());
    }
}
