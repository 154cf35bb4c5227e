//! Settings of a [`Limiter`](crate::Limiter): the connection (rl-client's
//! [`Config`]) and what the gateway decides beside it (fleet size, leases,
//! the deny cache, the fallback, the shard table), with the defaults of the
//! design notes.

use std::time::Duration;

use rl_client::{Config, Error, Result};

/// Everything a limiter is built from, with the defaults below. Start from
/// [`LimiterConfig::new`] (or hand [`Limiter::new`](crate::Limiter::new) a
/// [`Config`] alone: every default) and change fields:
///
/// ```
/// use std::time::Duration;
/// use rl_gateway::{Backend, Config, LimiterConfig};
///
/// let config = LimiterConfig {
///     gateways: 12,
///     ..LimiterConfig::new(Config {
///         backend: Backend::Lua,
///         timeout: Duration::from_millis(10),
///         ..Config::standalone("redis://10.0.0.5:6379/")
///     })
/// };
/// # let _ = config;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LimiterConfig {
    /// Where Redis is and how to reach it: target, relay, backend, TLS,
    /// timeouts, the breaker settings (a shard's breaker here, the relay's
    /// in rl-client) and the clock (leases, the deny cache, breakers and
    /// the fallback read it).
    pub connection: Config,
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
    /// The outage fallback allows `limit x slack / gateways` on each gateway:
    /// traffic is never spread perfectly evenly. A fail-open bucket rule
    /// whose share of its capacity is below one token gets one token per
    /// gateway, refilled at its share of the rate: fleet-wide at most
    /// `max(slack x capacity, gateways)` at once, then `slack` x the rate
    /// (see the guide); mark small security limits fail-closed.
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
    /// Longest time a refusal is remembered (the deny cache) before Redis
    /// is asked again, whatever the retry time Redis named or this
    /// gateway's share of the refill: a subject whose keys were cleared, or
    /// whose limit was raised, is admitted within it without any gateway
    /// being told. A refusal answered from memory still names the module's
    /// retry time, counted down. Default 5 s: a subject refused everywhere
    /// then costs at most `gateways / 5` calls a second.
    pub deny_hold_max: Duration,
}

impl LimiterConfig {
    /// A limiter on `connection`, with every default of its own.
    pub fn new(connection: Config) -> LimiterConfig {
        LimiterConfig {
            connection,
            gateways: 1,
            lease_window: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(2),
            fallback_slack: 2.0,
            deny_cache_entries: 100_000,
            lease_entries: 10_000,
            fallback_entries: 100_000,
            topology_refresh: Duration::from_secs(10),
            deny_hold_max: Duration::from_secs(5),
        }
    }

    /// The limiter's own settings checked (the connection's are checked
    /// when its client is made): a bad one is named.
    pub(crate) fn validate(&self) -> Result<()> {
        let positive = [
            ("lease_window", self.lease_window),
            ("lease_ttl", self.lease_ttl),
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
            ("deny_cache_entries", self.deny_cache_entries),
            ("lease_entries", self.lease_entries),
            ("fallback_entries", self.fallback_entries),
        ];
        for (name, value) in counts {
            if value == 0 {
                return Err(Error::invalid(format!("config {name} must be at least 1")));
            }
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

/// A connection alone is a limiter with every default.
impl From<Config> for LimiterConfig {
    fn from(connection: Config) -> LimiterConfig {
        LimiterConfig::new(connection)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_design_notes() {
        let c = LimiterConfig::new(Config::standalone("redis://127.0.0.1/"));
        assert_eq!(
            (c.lease_ttl, c.lease_window, c.fallback_slack),
            (Duration::from_secs(2), Duration::from_secs(1), 2.0)
        );
        assert!(c.validate().is_ok());
    }

    #[test]
    fn bad_settings_are_named() {
        let base = LimiterConfig::new(Config::cluster(["redis://127.0.0.1:7000/"]));
        let e = LimiterConfig { gateways: 0, ..base.clone() }.validate().unwrap_err();
        assert!(e.to_string().contains("gateways must be at least 1"));
        let e = LimiterConfig { fallback_slack: f64::NAN, ..base }.validate().unwrap_err();
        assert!(e.to_string().contains("fallback_slack"));
    }
}
