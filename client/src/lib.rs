#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod backoff;
mod breaker;
mod client;
mod config;
mod connection;
mod decision;
mod deny_cache;
mod error;
mod fallback;
pub mod headers;
#[cfg(feature = "tower")]
mod layer;
mod lease;
mod limiter;
mod metrics;
mod policy;
pub mod rules;
mod shards;
mod slot;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

pub use backoff::Backoff;
pub use client::{Bucket, Client, Window, WindowMode};
pub use config::{Backend, Config};
pub use connection::Target;
pub use decision::{Decision, Grant, Source};
pub use error::{Error, Result};
#[cfg(feature = "tower")]
pub use layer::{RateLimit, RateLimitLayer};
pub use limiter::Limiter;
pub use metrics::{Counters, Event, Metrics};
pub use policy::{FailMode, Policy, PolicyBuilder, Rule};

/// What local state is kept per: (policy id, shadow group?, subject).
pub(crate) type SubjectKey = (u64, bool, Box<str>);

/// Locks a mutex; a poisoned one (a panic elsewhere while held) still
/// holds consistent plain data here, so it is used as is.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whole milliseconds of `d`, saturating (a `Duration` can hold more).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
