#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod config;
mod deny_cache;
mod fallback;
#[cfg(feature = "global")]
pub mod global;
pub mod guide;
#[cfg(feature = "http")]
pub mod http;
mod inflight_policy;
mod lease;
mod limiter;
#[cfg(feature = "live")]
pub mod live;
mod local_inflight;
mod metrics;
mod names;
mod policy;
mod shards;
mod subject;

pub use config::LimiterConfig;
pub use inflight_policy::{InflightPolicy, InflightPolicyBuilder, InflightRule};
pub use limiter::{Check, Limiter, NoPermit, Permit};
#[cfg(all(feature = "live", feature = "tower"))]
pub use live::LiveDecide;
#[cfg(feature = "live")]
pub use live::{Admission, LiveRules, RedisSource, RuleSetSpec, Verdict};
pub use metrics::{Counters, Event, Metrics};
pub use names::validate_name;
pub use policy::{FailMode, Policy, PolicyBuilder, QuotaUnit, Rule};
pub use subject::{ip_subject, key_subject, subject_fault, MAX_PLAIN_KEY};

/// Pieces of the limiter that the tree's own simulations and benchmarks
/// run apart: the circuit breaker on a virtual clock (rl-relay's scale
/// model) and the count of lock waits (the threads benchmark). Public for
/// them alone (the crates are released together), not a promise to anyone
/// else: a gateway needs none of them.
#[doc(hidden)]
pub mod internal {
    pub use rl_client::internal::{lock_waits, Breaker, Ticket};
}

// The client's names a gateway uses with the limiter: one crate to add.
pub use rl_client::{
    is_wrong_server, period_ms, prometheus_family, prometheus_label, redacted, Acquired, Backend, Bucket, Client,
    Clock, Config, Connection, ConnectionStatus, Decision, Error, Grant, Inflight, ManualClock, NodeAuth, Result,
    Source, Target, Tls, Window, WindowMode, SENTINEL_PORT, SENTINEL_SCHEME, SENTINEL_TLS_SCHEME, TLS_ENV,
};
