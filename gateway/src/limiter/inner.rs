//! What a limiter's clones share (the connection, the local maps, the
//! breakers, the counters), and the one place each part is reached: the
//! deny cache is read by [`Inner::remembered`], a breaker's refusal by
//! [`Inner::breaker_refuses`], a shard admits a call by
//! [`Inner::admit_call`], and so on. The paths of the limiter (its other
//! files) use these and nothing else of it.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rl_client::internal::{millis, Breaker, Ticket};
use rl_client::{Client, Decision, Error, Result, Target};

use crate::config::LimiterConfig;

use crate::deny_cache::DenyCache;
use crate::fallback::{Answer, Fallback, Scale};
use crate::lease::{Lease, Leases};
use crate::metrics::{Counters, Event, Metrics};
use crate::shards::Shards;
use crate::subject::Subject;

/// A call the shard's breaker admitted: the breaker, and the ticket to
/// report the outcome with.
pub(super) type Admitted = (Arc<Breaker>, Ticket);

pub(super) struct Inner {
    client: Client,
    config: LimiterConfig,
    gateways: AtomicU32,
    shards: Shards,
    deny: DenyCache,
    leases: Leases,
    fallback: Fallback,
    counters: Counters,
    sink: Option<Arc<dyn Metrics>>,
    /// The runtime the limiter was made in: background work (lease top-ups,
    /// the cluster's slot map) always has one to run on.
    runtime: tokio::runtime::Handle,
}

impl Inner {
    pub(super) fn new(config: LimiterConfig, sink: Option<Arc<dyn Metrics>>) -> Result<Inner> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::invalid(
                "Limiter::new must be called inside a tokio runtime: lease top-ups run in the background there",
            )
        })?;
        config.validate()?;
        let client = Client::new(&config.connection)?;
        let cluster = matches!(config.connection.target, Target::Cluster(_));
        let shards = Shards::new(
            cluster,
            config.connection.breaker_trip_after,
            millis(config.connection.breaker_open_for),
            config.connection.breaker_failure_rate,
            millis(config.topology_refresh),
        );
        Ok(Inner {
            client,
            gateways: AtomicU32::new(config.gateways),
            shards,
            deny: DenyCache::new(config.deny_cache_entries, millis(config.deny_hold_max)),
            leases: Leases::new(config.lease_entries),
            fallback: Fallback::new(config.fallback_entries),
            counters: Counters::default(),
            sink,
            runtime,
            config,
        })
    }

    /// The typed calls, on the limiter's connection.
    pub(super) fn client(&self) -> &Client {
        &self.client
    }

    pub(super) fn config(&self) -> &LimiterConfig {
        &self.config
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.config.connection.clock.now_ms()
    }

    pub(super) fn gateways(&self) -> u32 {
        self.gateways.load(Ordering::Relaxed)
    }

    pub(super) fn set_gateways(&self, gateways: u32) {
        self.gateways.store(gateways.max(1), Ordering::Relaxed);
    }

    pub(super) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Counts `event`, and hands it to the metrics sink if there is one.
    pub(super) fn record(&self, event: Event, policy: &str, rule: Option<&str>) {
        // At most once per shard per breaker_open_for: no flood in an outage.
        if event == Event::BreakerOpened {
            tracing::warn!(target: "rl_client", policy, "circuit breaker opened: a Redis shard fails; its subjects use the fallback");
        }
        self.counters.record(event, policy, rule);
        if let Some(sink) = &self.sink {
            sink.record(event, policy, rule);
        }
    }

    /// Background work goes on the runtime the limiter was made in. If that
    /// runtime has shut down the task is dropped, and with it what it holds
    /// (a lease call under way), which clears its flags.
    pub(super) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(task);
    }

    /// The refusal the deny cache remembers for `key` and `cost` at `now`.
    pub(super) fn remembered(&self, key: &impl Subject, cost: u64, now: u64) -> Option<Decision> {
        self.deny.check(key, cost, now)
    }

    /// Remembers Redis's answer for `key` if it is a refusal with a retry
    /// time, held at least `hold_ms`.
    pub(super) fn remember(&self, key: &impl Subject, cost: u64, answer: &Decision, now: u64, hold_ms: u64) {
        self.deny.refused(key, cost, answer, now, hold_ms);
    }

    /// Whether the breaker of `subject`'s shard refuses every call at `now`.
    pub(super) fn breaker_refuses(&self, subject: &str, now: u64) -> bool {
        self.shards.refuses(subject, now)
    }

    /// Whether a call on `subject`'s keys may go to its shard at `now`:
    /// its breaker and ticket, or `None` while the breaker is open.
    pub(super) fn admit_call(&self, subject: &str, now: u64) -> Option<Admitted> {
        self.shards.admit(subject, now)
    }

    /// Which shard serves `subject` (`None` until a cluster's slot map is read).
    pub(super) fn shard_of(&self, subject: &str) -> Option<usize> {
        self.shards.shard_of(subject)
    }

    /// Every known shard and whether its breaker is open at `now`.
    pub(super) fn shard_states(&self, now: u64) -> Vec<(String, bool)> {
        self.shards.states(now)
    }

    /// Drops every local entry of `subject` (deny cache, leases, fallback),
    /// in every group: how many.
    pub(super) fn forget(&self, subject: &str) -> usize {
        self.deny.forget(subject) + self.leases.forget(subject) + self.fallback.forget(subject)
    }

    /// The subject's lease, created empty if it has none.
    pub(super) fn lease(&self, key: &impl Subject) -> Arc<Mutex<Lease>> {
        self.leases.entry(key)
    }

    /// Takes `cost` from the subject's local stand-ins of `scale`'s rules.
    /// With `after_refusal` (the breaker is open) the deny cache's answer
    /// comes first, kept in the stand-ins' entry. `Err(i)`: rule `i` is a
    /// window whose share is below one token.
    pub(super) fn local_take(
        &self,
        key: &impl Subject,
        scale: &Scale,
        cost: u64,
        now: u64,
        after_refusal: bool,
    ) -> std::result::Result<Answer, usize> {
        if after_refusal {
            self.fallback.take_unless_refused(key, scale, cost, now, || self.remembered(key, cost, now))
        } else {
            self.fallback.take(key, scale, cost, now).map(Answer::Local)
        }
    }

    /// Reads a cluster's slot map when due, in the background.
    pub(super) fn refresh_topology(self: &Arc<Self>, now: u64) {
        // Standalone: nothing to refresh.
        if !self.shards.is_cluster() || !self.shards.refresh_due(now) {
            return;
        }
        // Dropped unfinished (its runtime shut down): the refresh counts as
        // failed, so the flag never stays set.
        struct Pending(Arc<Inner>);
        impl Drop for Pending {
            fn drop(&mut self) {
                let i = &self.0;
                if i.shards.is_refreshing() {
                    i.shards.failed(i.now_ms());
                }
            }
        }
        let pending = Pending(self.clone());
        self.spawn(async move {
            let i = &pending.0;
            match i.client.slot_map(i.config.connection.connect_timeout).await {
                Ok(map) if !map.is_empty() => i.shards.installed(&map, i.now_ms()),
                _ => i.shards.failed(i.now_ms()),
            }
        });
    }
}
