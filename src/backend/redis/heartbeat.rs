//! The replica heartbeat as a Redis command (see `lua/heartbeat.lua` for the contract).
//!
//! Sent with `EVAL` every time: it runs once per interval per replica, so the script cache and
//! its `NOSCRIPT` path would save nothing worth the extra code.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

use super::classify;
use crate::backend::BackendError;

const SOURCE: &str = include_str!("../../../lua/heartbeat.lua");

pub(super) fn command(key: &str, member: &str, ttl: Duration) -> Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SOURCE)
        .arg(1)
        .arg(key)
        .arg(member)
        .arg((ttl.as_millis() as u64).max(1));
    cmd
}

/// Runs the heartbeat; the live count.
pub(super) async fn run<C: ConnectionLike>(conn: &mut C, cmd: &Cmd) -> Result<u64, BackendError> {
    let reply: Value = cmd.query_async(conn).await.map_err(classify)?;
    decode(&reply)
}

fn decode(reply: &Value) -> Result<u64, BackendError> {
    match reply {
        Value::Int(n) if *n >= 1 => Ok(*n as u64),
        other => Err(BackendError::Protocol(format!(
            "heartbeat reply: expected a count >= 1, got {other:?}"
        ))),
    }
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
        assert_eq!(decode(&Value::Int(3)), Ok(3));
        assert!(decode(&Value::Int(0)).is_err());
        assert!(decode(&Value::Nil).is_err());
    }
}
