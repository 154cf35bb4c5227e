//! Settings of a [`Client`](crate::Client) and a [`Limiter`](crate::Limiter),
//! with the defaults of the design notes.

use std::time::Duration;

use crate::clock::Clock;
use crate::error::{Error, Result};

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// One server (or a primary behind a failover proxy): `redis://host:port/`.
    Standalone(String),
    /// Redis Cluster: the URLs of some of its nodes, to discover the rest.
    Cluster(Vec<String>),
}

/// How the bucket commands run on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The redis-rl module's native commands (RL.TAKE, RL.LEASE, ...).
    Module,
    /// The same token-bucket algorithm as a Lua script through EVALSHA, for
    /// servers that cannot load modules. Token buckets only (take, peek,
    /// force, lease, refund), with capacity x period_ms <= 2^52.
    Lua,
}

/// Everything configurable, with the defaults below. Start from
/// [`Config::standalone`] or [`Config::cluster`] and change fields:
///
/// ```
/// use std::time::Duration;
/// use rl_client::{Backend, Config};
///
/// let config = Config {
///     gateways: 12,
///     backend: Backend::Lua,
///     timeout: Duration::from_millis(10),
///     ..Config::standalone("redis://10.0.0.5:6379/")
/// };
/// # let _ = config;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Where Redis is.
    pub target: Target,
    /// A lease relay (rl-relay, `redis://host:port/`) in front of `target`:
    /// calls go to it while it answers, and to `target` directly while its
    /// breaker is open (the breaker settings below apply to it as to a
    /// shard). Default none: calls go to `target`.
    pub relay: Option<String>,
    /// Default [`Backend::Module`].
    pub backend: Backend,
    /// Longest wait for any call to Redis; past it the call counts as failed
    /// and the fallback answers. Default 50 ms: a timeout below Redis's tail
    /// latency under load turns load into an outage of the limits (the
    /// crate README's fleet simulation shows it with 5 ms).
    pub timeout: Duration,
    /// Longest wait to (re)connect, in the background. Default 250 ms.
    pub connect_timeout: Duration,
    /// Gateways sharing the limits (the fleet size, from service discovery;
    /// change it live with [`Limiter::set_gateways`](crate::Limiter::set_gateways)).
    /// Sizes leases and the outage fallback. Default 1.
    pub gateways: u32,
    /// A lease is this much of this gateway's share of the rate. Default 1 s:
    /// a shorter window means smaller batches, so more calls per busy
    /// subject on every gateway.
    pub lease_window: Duration,
    /// Leased tokens unspent this long after their last refill are dropped
    /// (never handed back), so a lowered limit bites within it. Default 2 s:
    /// every gateway holding a lease calls at least once per `lease_ttl`.
    pub lease_ttl: Duration,
    /// Consecutive failures that open a shard's breaker. Default 5.
    pub breaker_trip_after: u32,
    /// The share of failed calls that opens a shard's breaker, counted per
    /// second once 20 calls of that second have reported: a Redis slow for
    /// a fraction of calls fails some, seldom five in a row. Default 0.5.
    pub breaker_failure_rate: f64,
    /// How long an open breaker skips its shard before one probe. Default 2 s.
    pub breaker_open_for: Duration,
    /// The outage fallback allows `limit x slack / gateways` on each gateway:
    /// traffic is never spread perfectly evenly. A fail-open bucket rule
    /// whose share of its capacity is below one token gets one token per
    /// gateway, refilled at its share of the rate: fleet-wide at most
    /// `max(slack x capacity, gateways)` at once, then `slack` x the rate
    /// (see the crate README); mark small security limits fail-closed.
    /// Default 2.0.
    pub fallback_slack: f64,
    /// Most subjects remembered as refused. Default 100,000.
    pub deny_cache_entries: usize,
    /// Most subjects holding a lease. Default 10,000.
    pub lease_entries: usize,
    /// Most subjects with a local fallback bucket. Default 100,000.
    pub fallback_entries: usize,
    /// How often a cluster's slot map is read again to key breakers by
    /// shard. Default 10 s.
    pub topology_refresh: Duration,
    /// The clock leases, the deny cache, breakers and the fallback read.
    /// Default [`Clock::System`]; tests and simulations hand a limiter a
    /// [`ManualClock`](crate::ManualClock).
    pub clock: Clock,
    /// Longest time a refusal is remembered (the deny cache) before Redis
    /// is asked again, whatever the retry time Redis named or this
    /// gateway's share of the refill: a subject whose keys were cleared, or
    /// whose limit was raised, is admitted within it without any gateway
    /// being told. A refusal answered from memory still names the module's
    /// retry time, counted down. Default 5 s: a subject refused everywhere
    /// then costs at most `gateways / 5` calls a second.
    pub deny_hold_max: Duration,
}

impl Config {
    /// One server at `url` (`redis://host:port/`), with every default.
    pub fn standalone(url: impl Into<String>) -> Config {
        Config::with_target(Target::Standalone(url.into()))
    }

    /// A Redis Cluster reached through any of `urls`, with every default.
    pub fn cluster<S: Into<String>>(urls: impl IntoIterator<Item = S>) -> Config {
        Config::with_target(Target::Cluster(urls.into_iter().map(Into::into).collect()))
    }

    fn with_target(target: Target) -> Config {
        Config {
            target,
            relay: None,
            backend: Backend::Module,
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(250),
            gateways: 1,
            lease_window: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(2),
            breaker_trip_after: 5,
            breaker_failure_rate: 0.5,
            breaker_open_for: Duration::from_secs(2),
            fallback_slack: 2.0,
            deny_cache_entries: 100_000,
            lease_entries: 10_000,
            fallback_entries: 100_000,
            topology_refresh: Duration::from_secs(10),
            clock: Clock::System,
            deny_hold_max: Duration::from_secs(5),
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let positive = [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
            ("lease_window", self.lease_window),
            ("lease_ttl", self.lease_ttl),
            ("breaker_open_for", self.breaker_open_for),
            ("topology_refresh", self.topology_refresh),
            ("deny_hold_max", self.deny_hold_max),
        ];
        for (name, value) in positive {
            if value.is_zero() {
                return Err(Error::invalid(format!("config {name} must be above zero")));
            }
        }
        let counts = [
            ("gateways", self.gateways as usize),
            ("breaker_trip_after", self.breaker_trip_after as usize),
            ("deny_cache_entries", self.deny_cache_entries),
            ("lease_entries", self.lease_entries),
            ("fallback_entries", self.fallback_entries),
        ];
        for (name, value) in counts {
            if value == 0 {
                return Err(Error::invalid(format!("config {name} must be at least 1")));
            }
        }
        if !(self.breaker_failure_rate > 0.0 && self.breaker_failure_rate <= 1.0) {
            return Err(Error::invalid(format!(
                "config breaker_failure_rate must be above 0 and at most 1, got {}",
                self.breaker_failure_rate
            )));
        }
        if !(self.fallback_slack.is_finite() && self.fallback_slack >= 1.0) {
            return Err(Error::invalid(format!(
                "config fallback_slack must be a number of at least 1.0, got {}",
                self.fallback_slack
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_design_notes() {
        let c = Config::standalone("redis://127.0.0.1/");
        assert_eq!(c.timeout, Duration::from_millis(50));
        assert_eq!((c.breaker_trip_after, c.breaker_open_for), (5, Duration::from_secs(2)));
        assert_eq!(
            (c.lease_ttl, c.lease_window, c.fallback_slack),
            (Duration::from_secs(2), Duration::from_secs(1), 2.0)
        );
        assert!(c.validate().is_ok());
    }

    #[test]
    fn bad_settings_are_named() {
        let base = Config::cluster(["redis://127.0.0.1:7000/"]);
        let e = Config { gateways: 0, ..base.clone() }.validate().unwrap_err();
        assert!(e.to_string().contains("gateways must be at least 1"));
        let e = Config { timeout: Duration::ZERO, ..base.clone() }.validate().unwrap_err();
        assert!(e.to_string().contains("timeout must be above zero"));
        let e = Config { fallback_slack: f64::NAN, ..base }.validate().unwrap_err();
        assert!(e.to_string().contains("fallback_slack"));
    }
}
