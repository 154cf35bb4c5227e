#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod breaker;
mod client;
mod clock;
mod config;
mod connection;
mod decision;
mod deny_cache;
mod endpoint;
mod error;
mod fallback;
mod inflight;
mod inflight_policy;
mod lease;
mod limiter;
mod local_inflight;
mod metrics;
mod names;
mod policy;
mod primary;
mod shards;
pub mod sim;
mod slot;
mod subject;

use std::hash::{Hash, Hasher};
use std::sync::{Mutex, MutexGuard, TryLockError};

use quick_cache::Equivalent;

pub use client::{Bucket, Client, Window};
pub use clock::{Clock, ManualClock};
pub use config::{Backend, Config, NodeAuth, Target, SENTINEL_SCHEME};
pub use connection::Connection;
pub use decision::{Decision, Grant, Source};
pub use endpoint::{redacted, SENTINEL_PORT};
pub use error::{Error, Result};
pub use inflight::{Acquired, Inflight};
pub use inflight_policy::{InflightPolicy, InflightPolicyBuilder, InflightRule};
pub use limiter::{Check, Limiter, NoPermit, Permit};
pub use metrics::{prometheus_label, Counters, Event, Metrics};
pub use names::validate_name;
pub use policy::{period_ms, FailMode, Policy, PolicyBuilder, QuotaUnit, Rule};
pub use primary::{is_wrong_server, ConnectionStatus};
pub use rl_core::WindowMode;
pub use subject::{ip_subject, key_subject, subject_fault, MAX_PLAIN_KEY};

/// What local state is kept per: (policy group id, shadow group?, subject).
pub(crate) type SubjectKey = (u64, bool, Box<str>);

/// A [`SubjectKey`] borrowed from the request: the local maps (leases, deny
/// cache, fallback) are looked up with it without allocating. It hashes
/// and compares as the owned key; an owned one is made only to insert.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SubjectRef<'a>(pub(crate) u64, pub(crate) bool, pub(crate) &'a str);

impl Hash for SubjectRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the tuple hashes: field by field, the Box<str> as its str.
        (self.0, self.1, self.2).hash(state);
    }
}

impl Equivalent<SubjectKey> for SubjectRef<'_> {
    fn equivalent(&self, key: &SubjectKey) -> bool {
        self.0 == key.0 && self.1 == key.1 && self.2 == &*key.2
    }
}

/// A key of local state, owned or borrowed.
pub(crate) trait Subject: Hash + Equivalent<SubjectKey> {
    /// The policy group id.
    fn group(&self) -> u64;
    /// The key to insert.
    fn owned(&self) -> SubjectKey;
}

impl Subject for SubjectKey {
    fn group(&self) -> u64 {
        self.0
    }

    fn owned(&self) -> SubjectKey {
        self.clone()
    }
}

impl Subject for SubjectRef<'_> {
    fn group(&self) -> u64 {
        self.0
    }

    fn owned(&self) -> SubjectKey {
        (self.0, self.1, self.2.into())
    }
}

/// Drops every entry of `map` kept for `subject`, in any group, enforced
/// or shadow: how many there were (counted under each shard's lock, so
/// exactly the ones removed).
pub(crate) fn forget_subject<V, W>(map: &quick_cache::sync::Cache<SubjectKey, V, W>, subject: &str) -> usize
where
    V: Clone,
    W: quick_cache::Weighter<SubjectKey, V> + Clone,
{
    let dropped = std::cell::Cell::new(0);
    map.retain(|key, _| {
        let kept = &*key.2 != subject;
        dropped.set(dropped.get() + usize::from(!kept));
        kept
    });
    dropped.get()
}

/// Locks a mutex; a poisoned one (a panic elsewhere while held) still
/// holds consistent plain data here, so it is used as is. Tried first
/// without blocking: a lock found held is counted ([`sim::lock_waits`]).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => {
            metrics::lock_waited();
            m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::lock_waits;
    use quick_cache::sync::Cache;

    #[test]
    fn a_lock_found_held_is_counted_as_a_wait() {
        let m = Mutex::new(0);
        let before = lock_waits();
        let held = lock(&m);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| *lock(&m) += 1);
            // The waiter counts before it blocks; bounded in time.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while lock_waits() == before {
                assert!(std::time::Instant::now() < deadline, "a wait on a held lock was not counted");
                std::thread::yield_now();
            }
            drop(held);
            waiter.join().unwrap();
        });
        assert_eq!(*lock(&m), 1);
    }

    #[test]
    fn a_borrowed_subject_finds_its_owned_key() {
        let cache: Cache<SubjectKey, u32> = Cache::new(10);
        cache.insert(SubjectRef(7, true, "customer-1").owned(), 1);
        cache.insert((7, false, "customer-1".into()), 2);
        cache.insert((8, true, "customer-1".into()), 3);
        assert_eq!(cache.get(&SubjectRef(7, true, "customer-1")), Some(1));
        assert_eq!(cache.get(&SubjectRef(7, false, "customer-1")), Some(2));
        assert_eq!(cache.get(&SubjectRef(8, true, "customer-1")), Some(3));
        assert_eq!(cache.get(&SubjectRef(7, true, "customer-2")), None);
    }
}
