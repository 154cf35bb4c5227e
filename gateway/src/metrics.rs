//! Counters a gateway team watches.
//!
//! A small trait rather than the `metrics` facade: the crate installs no
//! global recorder and pulls in no exporter, tests read the counts directly,
//! and a team already on `metrics`, Prometheus or OpenTelemetry forwards
//! [`Metrics::record`] in a few lines (the crate README shows one). Every
//! [`Limiter`](crate::Limiter) also keeps totals in [`Counters`].

use std::sync::atomic::{AtomicU64, Ordering};

use rl_client::internal::{stripe, STRIPES};

/// Something that happened while deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// A request was allowed (by Redis, a lease, or the fallback).
    Allowed,
    /// A request was refused (by Redis, the deny cache, lease pacing, the
    /// fallback, or a fail-closed rule); the rule is named.
    Refused,
    /// A shadow rule would have refused a request that was allowed.
    ShadowRefused,
    /// A request was paid from leased tokens, without calling Redis.
    LeaseHit,
    /// A request was refused from the deny cache, without calling Redis.
    DenyCacheHit,
    /// A request was refused by lease pacing (a contended bucket, this
    /// gateway's share spent for now), without calling Redis.
    PacingRefusal,
    /// Redis could not answer: a local bucket or a fail-closed rule decided.
    Fallback,
    /// A call to Redis failed (timeout, connection, or an error reply).
    Error,
    /// The server answered a call with an error about the call itself, not
    /// an outage (a limit above its `max-log-limit` or
    /// `max-inflight-limit`, a key of another type): the rule was decided
    /// by its failure mode. Counted with [`Event::Error`].
    ServerRefused,
    /// A shard's circuit breaker opened.
    BreakerOpened,
    /// Calls to Redis moved to another server (a Sentinel switch, a
    /// demoted primary left for the one its `ROLE` names, a DNS name that
    /// moved), or the first connection found the configured server to be a
    /// replica; counted with an empty policy. See
    /// [`Connection::status`](crate::Connection::status).
    ServerSwitch,
}

impl Event {
    /// Every event, in counter order.
    pub const ALL: [Event; 11] = [
        Event::Allowed,
        Event::Refused,
        Event::ShadowRefused,
        Event::LeaseHit,
        Event::DenyCacheHit,
        Event::PacingRefusal,
        Event::Fallback,
        Event::Error,
        Event::ServerRefused,
        Event::BreakerOpened,
        Event::ServerSwitch,
    ];

    /// A metric-style name: `allowed`, `shadow_refused`, ...
    pub fn name(self) -> &'static str {
        match self {
            Event::Allowed => "allowed",
            Event::Refused => "refused",
            Event::ShadowRefused => "shadow_refused",
            Event::LeaseHit => "lease_hits",
            Event::DenyCacheHit => "deny_cache_hits",
            Event::PacingRefusal => "pacing_refusals",
            Event::Fallback => "fallbacks",
            Event::Error => "errors",
            Event::ServerRefused => "server_refusals",
            Event::BreakerOpened => "breaker_opened",
            Event::ServerSwitch => "server_switches",
        }
    }
}

/// Receives every event, labelled with the policy prefix and, where one
/// rule is concerned (refusals, shadow refusals), its name.
pub trait Metrics: Send + Sync + 'static {
    /// Called once per event, on the request path: keep it cheap.
    fn record(&self, event: Event, policy: &str, rule: Option<&str>);
}

/// Totals of every event, kept by each limiter. Every decision adds to
/// them, so each thread adds to its own stripe, a cache line apart: threads
/// deciding at once never write the same line.
#[derive(Debug, Default)]
pub struct Counters {
    stripes: [Stripe; STRIPES],
}

/// One thread's counts, alone on its cache lines (128 bytes: two lines on
/// CPUs that fetch lines in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe([AtomicU64; Event::ALL.len()]);

impl Counters {
    /// The total of one event.
    pub fn get(&self, event: Event) -> u64 {
        self.stripes.iter().map(|s| s.0[event as usize].load(Ordering::Relaxed)).sum()
    }

    /// Every total with its name, for logs and exporters.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        Event::ALL.iter().map(|&e| (e.name(), self.get(e))).collect()
    }
}

impl Metrics for Counters {
    fn record(&self, event: Event, _policy: &str, _rule: Option<&str>) {
        self.stripes[stripe()].0[event as usize].fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_event_apart() {
        let c = Counters::default();
        c.record(Event::Allowed, "api", None);
        c.record(Event::Allowed, "api", None);
        c.record(Event::BreakerOpened, "api", None);
        assert_eq!((c.get(Event::Allowed), c.get(Event::BreakerOpened), c.get(Event::Error)), (2, 1, 0));
        assert_eq!(c.snapshot()[0], ("allowed", 2));
        assert_eq!(c.snapshot().len(), Event::ALL.len());
    }

    #[test]
    fn threads_count_into_their_stripes_and_the_totals_add_up() {
        let c = Counters::default();
        std::thread::scope(|s| {
            for _ in 0..12 {
                s.spawn(|| (0..1000).for_each(|_| c.record(Event::LeaseHit, "api", None)));
            }
        });
        assert_eq!(c.get(Event::LeaseHit), 12_000);
        assert_eq!(std::mem::align_of::<Stripe>(), 128);
    }
}
