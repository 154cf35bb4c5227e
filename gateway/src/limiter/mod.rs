//! The limiter a gateway calls on every request: typed calls guarded by a
//! timeout and a per-shard breaker, with leases for busy subjects, a deny
//! cache for refused ones, a local fallback, and shadow rules.
//!
//! One home per path: `check.rs` the single checks and adjustments,
//! `evaluate.rs` the one evaluation path they, batches and shadow rules
//! share (deny cache first, then each group from its lease or Redis, the
//! first refusal deciding), `leased.rs` a busy subject's group, `batch.rs`
//! several checks in one round trip per shard, `permit.rs` in-flight
//! permits, `call.rs` a call through its shard's breaker, `outage.rs` what
//! decides when Redis cannot, and `inner.rs` what the clones share.
//!
//! Error direction, path by path (the crate README has the table):
//! - a call answered by Redis is exact (the module's guarantee);
//! - leased tokens are taken before they are spent: never over, only under;
//! - the deny cache only refuses, until the retry time Redis named: never over;
//! - the outage fallback allows about `slack` times the limit fleet-wide:
//!   a bucket at most `max(slack x capacity, gateways)` at once and `slack`
//!   x its rate after (a share below one token is one token per gateway),
//!   a window at most `slack` x its limit in any window;
//! - window rules are evaluated after the buckets; a request refused by a
//!   window gives its bucket tokens back (RL.REFUND), missing until then
//!   and lost if that call fails: under, never over.

mod batch;
mod call;
mod check;
mod evaluate;
mod inner;
mod leased;
mod outage;
mod permit;

use std::sync::Arc;

pub use batch::Check;
pub use permit::{NoPermit, Permit};

use rl_client::{Client, Clock, Result};

use crate::config::LimiterConfig;

use crate::metrics::{Counters, Event, Metrics};
use inner::Inner;

/// Decides requests against [`Policy`](crate::Policy) rules. Cheap to
/// clone; clones share everything (connection, caches, breakers, counters).
///
/// ```no_run
/// use rl_gateway::{Config, Limiter, LimiterConfig, Policy, Rule};
///
/// # async fn run() -> Result<(), rl_gateway::Error> {
/// let config = LimiterConfig { gateways: 12, ..LimiterConfig::new(Config::standalone("redis://127.0.0.1:6379/")) };
/// let limiter = Limiter::new(config)?;
/// let api = Policy::builder("api")
///     .rule(Rule::per_second("per_second", 100).burst(200))
///     .rule(Rule::per_minute("per_minute", 5000))
///     .build()?;
///
/// let d = limiter.check(&api, "user42").await?;
/// if !d.allowed {
///     let rule = api.rule(d.rule).map_or("?", |r| r.name());
///     println!("429: over '{rule}', retry in {:?}", d.retry_after);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl Limiter {
    /// A limiter for `config`: a [`LimiterConfig`], or an rl-client
    /// [`Config`](crate::Config) alone for every default of the limiter's
    /// own. Does not wait for Redis: it connects in the background, so a
    /// gateway starts (on its fallback) while Redis is down. Call it inside
    /// a tokio runtime (an error otherwise): its background work runs there.
    pub fn new(config: impl Into<LimiterConfig>) -> Result<Limiter> {
        Ok(Limiter::counting_switches(Inner::new(config.into(), None)?))
    }

    /// Like [`Limiter::new`], also sending every event to `metrics`.
    pub fn with_metrics(config: impl Into<LimiterConfig>, metrics: Arc<dyn Metrics>) -> Result<Limiter> {
        Ok(Limiter::counting_switches(Inner::new(config.into(), Some(metrics))?))
    }

    /// The connection's moves to another server become events.
    fn counting_switches(inner: Inner) -> Limiter {
        let inner = Arc::new(inner);
        let weak = Arc::downgrade(&inner);
        inner.client().connection().on_switch(move |_| {
            if let Some(inner) = weak.upgrade() {
                inner.record(Event::ServerSwitch, "", None);
            }
        });
        Limiter { inner }
    }

    /// Counts an event decided outside the limiter (live rules' shadow refusals).
    pub fn record(&self, event: Event, policy: &str, rule: Option<&str>) {
        self.inner.record(event, policy, rule);
    }

    /// The fleet size changed (from service discovery): leases and the
    /// fallback are sized from it.
    pub fn set_gateways(&self, gateways: u32) {
        self.inner.set_gateways(gateways);
    }

    /// Drops what this gateway keeps in memory for `subject`, under every
    /// policy: its remembered refusals (the deny cache), its leases (their
    /// tokens dropped, never handed back to Redis: under, never over) and
    /// its outage fallback buckets. Returns how many entries were dropped.
    /// The subject's next request asks Redis. Redis is not touched: to
    /// unlock a subject, clear its keys there too (`rlctl unlock` does
    /// both, telling every gateway through the rules channel). In-flight
    /// slots held by running requests are theirs and are left alone.
    pub fn forget_subject(&self, subject: &str) -> usize {
        self.inner.forget(subject)
    }

    /// Totals of every [`Event`] since the limiter was made.
    pub fn counters(&self) -> &Counters {
        self.inner.counters()
    }

    /// Every shard the limiter knows and whether its circuit breaker is open
    /// now: `host:port` of a cluster's primaries (`unknown` until the slot
    /// map is read), or `standalone`.
    pub fn shards(&self) -> Vec<(String, bool)> {
        self.inner.shard_states(self.inner.now_ms())
    }

    /// The clock it decides from memory by ([`Config::clock`](crate::Config::clock)).
    pub fn clock(&self) -> &Clock {
        &self.inner.config().connection.clock
    }

    /// The typed, unguarded calls on the same connection.
    pub fn client(&self) -> &Client {
        self.inner.client()
    }
}
