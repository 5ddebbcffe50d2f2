//! How a backend call fails: [`BackendError`], and the deadline a remote call gets by default.
//! A leaf, so the breakers and the backends can name both without importing one another.

use std::time::Duration;

/// The default deadline of one call to a remote backend, well under Envoy's 20 ms filter
/// timeout (past which Envoy lets the request through undecided); also the moment the Redis
/// breakers count a failure in.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_millis(15);

/// Why a backend could not decide. Mapped to the failure policy by the resilience layer and to a
/// gRPC status at the edge.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum BackendError {
    #[error("backend call timed out after {0} ms")]
    Timeout(u64),
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("backend protocol error: {0}")]
    Protocol(String),
    #[error("backend circuit breaker is open")]
    CircuitOpen,
    #[error("backend overloaded: {0}")]
    Overloaded(String),
}

impl BackendError {
    /// Short, stable name of the failure (the `kind` label of the Redis error metric).
    pub const fn kind(&self) -> &'static str {
        match self {
            BackendError::Timeout(_) => "timeout",
            BackendError::Unavailable(_) => "unavailable",
            BackendError::Protocol(_) => "protocol",
            BackendError::CircuitOpen => "circuit_open",
            BackendError::Overloaded(_) => "overloaded",
        }
    }
}
