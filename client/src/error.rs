//! The one error type of the crate.

use std::fmt;

/// Why a call failed.
///
/// rl-gateway's `Limiter` never returns the Redis-side variants: it
/// answers those from its fallback. Only [`Error::Invalid`] reaches its
/// callers, for bad input.
#[derive(Debug)]
pub enum Error {
    /// Bad input, refused before anything is sent; the text names the argument.
    Invalid(String),
    /// No answer within the configured timeout.
    Timeout,
    /// The circuit breaker of the shard is open: nothing was sent.
    BreakerOpen,
    /// The connection or the server failed, or the server answered an error.
    Redis(redis::RedisError),
    /// The server answered, but not the reply the command promises.
    Reply(String),
    /// The configured backend lacks this command (the Lua backend has no
    /// windows and no CL.THROTTLE).
    Unsupported(&'static str),
    /// Live rules refused something: a rule set (refused whole, the rules
    /// in force stay), an override, a store change. The text says which
    /// ("rule set rejected: ...", "override rejected: ...") and names each
    /// rule and field at fault, one per line.
    Rules(String),
}

impl Error {
    /// True when the failure says the shard is unhealthy (it counts towards
    /// opening its breaker); false when the shard answered but refused the
    /// call itself (a wrong key type, a bad argument).
    pub fn is_shard_failure(&self) -> bool {
        match self {
            Error::Timeout | Error::BreakerOpen => true,
            Error::Redis(e) => {
                use redis::{ErrorKind, ServerErrorKind as S};
                match e.kind() {
                    ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
                    ErrorKind::Server(
                        S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly | S::Moved | S::Ask,
                    ) => true,
                    // A script running too long blocks the whole shard.
                    _ => e.code() == Some("BUSY"),
                }
            }
            Error::Invalid(_) | Error::Reply(_) | Error::Unsupported(_) | Error::Rules(_) => false,
        }
    }

    /// [`Error::Invalid`] with `text`.
    pub fn invalid(text: impl Into<String>) -> Error {
        Error::Invalid(text.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(text) => write!(f, "invalid argument: {text}"),
            Error::Timeout => f.write_str("redis did not answer within the timeout"),
            Error::BreakerOpen => f.write_str("circuit breaker open for this shard"),
            Error::Redis(e) => write!(f, "redis: {e}"),
            Error::Reply(text) => write!(f, "unexpected reply: {text}"),
            Error::Unsupported(what) => write!(f, "the backend does not support {what}"),
            Error::Rules(text) => f.write_str(text),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

/// A parameter out of range is bad input, worded by the core.
impl From<rl_core::ParamError> for Error {
    fn from(e: rl_core::ParamError) -> Self {
        Error::Invalid(e.to_string())
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
