//! A gateway's side of global limits: its region's share table, read from
//! the region's Redis at most once per refresh interval (never per
//! request), the share in force for each (global rule, subject) with the
//! stale-table fallback and the ramp, and the usage it reports, written in
//! the same round trip as the read.
//!
//! ```no_run
//! use std::sync::Arc;
//! use rl_gateway::global::{GatewayConfig, RegionShares};
//! use rl_gateway::{Config, Limiter};
//! use rl_gateway::live::{LiveRules, RuleSetSpec};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = "redis://redis.eu.internal:6379/";
//! let rules = LiveRules::new(Limiter::new(Config::standalone(redis))?, &RuleSetSpec::from_file("rules.toml")?)?;
//! let shares = RegionShares::start(GatewayConfig::new("eu", redis))?;
//! rules.set_region_shares(shares.clone())?;
//! // shares.status().age: the table's age, for the gateway's metrics.
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::global::{GlobalLimit, GlobalSpec, RegionalShares};
use crate::{Clock, Connection, Target};
use arc_swap::ArcSwapOption;

use crate::global::split::SplitParams;
use crate::global::store::{self, Read, StoreError};
use crate::global::table::{GlobalBucket, Share};
use crate::global::usage::UsageCounts;

/// How a gateway reaches its region's share table.
#[derive(Clone)]
pub struct GatewayConfig {
    /// This gateway's region, as global rules name it in `regions`.
    pub region: String,
    /// The region's Redis (the one its gateways enforce limits in).
    pub redis_url: String,
    /// The share table's hash ([`store::DEFAULT_KEY`]).
    pub key: String,
    /// How often the table is read and usage written: one round trip each
    /// time. Default 1 s (a tenth of the balancer's 10 s interval).
    pub refresh: Duration,
    /// How long one round trip may take before it counts as failed.
    /// Default 1 s.
    pub timeout: Duration,
    /// Subjects of each global rule whose usage is reported per refresh,
    /// the busiest first. Default 100.
    pub busiest: usize,
    /// The last shares are kept this long without a balancer write, then
    /// the fixed split applies. Default 5 minutes.
    pub stale_after: Duration,
    /// Between the two: the smaller of the last and the fixed share, so
    /// regions falling back one after another never sum above the limit
    /// (see `stale`). Default 10 s.
    pub settle: Duration,
    /// A table older than this is logged as a warning (once a minute) and
    /// alarms: the balancer is down. Default 60 s.
    pub warn_after: Duration,
    /// The clock table ages grow by between reads (rl-client's: a
    /// simulation or a test hands it a manual clock).
    pub clock: Clock,
    /// TLS settings for a `rediss://` URL (the limiter's `Config::tls`).
    pub tls: crate::Tls,
}

/// The URL without its password: a config may be logged.
impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("region", &self.region)
            .field("redis_url", &crate::redacted(&self.redis_url))
            .field("key", &self.key)
            .field("refresh", &self.refresh)
            .field("timeout", &self.timeout)
            .field("busiest", &self.busiest)
            .field("stale_after", &self.stale_after)
            .field("settle", &self.settle)
            .field("warn_after", &self.warn_after)
            .field("clock", &self.clock)
            .finish()
    }
}

impl GatewayConfig {
    /// The defaults, for a gateway in `region` whose Redis is `redis_url`.
    pub fn new(region: impl Into<String>, redis_url: impl Into<String>) -> GatewayConfig {
        GatewayConfig {
            region: region.into(),
            redis_url: redis_url.into(),
            key: store::DEFAULT_KEY.to_owned(),
            refresh: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            busiest: 100,
            stale_after: Duration::from_secs(300),
            settle: Duration::from_secs(10),
            warn_after: Duration::from_secs(60),
            clock: Clock::System,
            tls: crate::Tls::default(),
        }
    }
}

/// The share table as last read, and when (on the local clock).
struct Loaded {
    read: Read,
    read_at_ms: u64,
}

/// Where the table stands, for a gateway's metrics and health checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharesStatus {
    /// The version of the table in force (0: never written).
    pub version: u64,
    /// Since the balancer last wrote it (its heartbeat), on the region's
    /// clock plus the time since the read; `None` until a first read.
    /// Export it as a gauge (`rl_share_table_age_seconds`); alarm above 60 s.
    pub age: Option<Duration>,
    /// Whether the stale fallback applies (age at or above `stale_after`).
    pub stale: bool,
    /// Reads (syncs) that failed since start.
    pub refresh_failures: u64,
    /// Why the last sync failed, if it did.
    pub last_error: Option<String>,
    /// Age warnings logged since start (at most one a minute while the
    /// table is older than `warn_after`).
    pub age_warnings: u64,
    /// Confirmations of the version in force that failed since start
    /// (refused by an ACL, or no answer): the balancer does not see this
    /// gateway's version, and its raises rest on the barrier for it.
    pub confirm_failures: u64,
}

#[derive(Default)]
struct Stats {
    refresh_failures: u64,
    last_error: Option<String>,
    /// When the age warning was last logged (local clock, ms).
    warned_at_ms: Option<u64>,
    age_warnings: u64,
    /// Whether a global rule not spanning this region was logged.
    warned_region: bool,
    confirm_failures: u64,
    last_confirm_error: Option<String>,
}

/// A gateway's region's shares of global rules, and its usage report.
/// Implements rl-gateway's live [`RegionalShares`]: hand it to
/// `LiveRules::set_region_shares`.
pub struct RegionShares {
    config: GatewayConfig,
    /// rl-client's connection: it reconnects by itself, follows a Sentinel
    /// master, and leaves a demoted primary.
    con: Connection,
    last: ArcSwapOption<Loaded>,
    usage: UsageCounts,
    stats: Mutex<Stats>,
    /// Names this gateway's confirmation of the version it enforces.
    id: String,
    /// One sync at a time: a slow read answered after a newer one would
    /// put back an older table than the one confirmed.
    syncing: tokio::sync::Mutex<()>,
}

/// How many steps a ramping capacity takes at most: each step is a policy
/// of its own in the gateway (with its own leases), so they are few.
const RAMP_STEPS: u64 = 32;

/// A "never" that still adds without overflow.
const NEVER: Duration = Duration::from_millis(u64::MAX / 4);

impl RegionShares {
    /// Shares for a gateway; nothing read yet (the fixed split applies
    /// until the first read). `refresh_now` reads; `start` also refreshes
    /// every interval. `config.redis_url` is `redis://` or
    /// `redis+sentinel://`. Must run inside a tokio runtime.
    pub fn new(config: GatewayConfig) -> Result<RegionShares, redis::RedisError> {
        let bad = |e: crate::Error| {
            redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "bad Redis URL", e.to_string()))
        };
        let target = Target::from_url(&config.redis_url).map_err(bad)?;
        Ok(RegionShares {
            con: Connection::open_with_tls(&target, &config.tls, config.timeout, config.timeout).map_err(bad)?,
            id: format!("{}-{:016x}", config.region, fastrand::u64(..)),
            syncing: tokio::sync::Mutex::new(()),
            config,
            last: ArcSwapOption::empty(),
            usage: UsageCounts::default(),
            stats: Mutex::new(Stats::default()),
        })
    }

    /// Shares refreshed every `config.refresh` by a tokio task, which
    /// stops when the last `Arc` is dropped. The first read happens in the
    /// task: a gateway starts even while its Redis is down. Call it inside
    /// a tokio runtime.
    pub fn start(config: GatewayConfig) -> Result<Arc<RegionShares>, redis::RedisError> {
        let shares = Arc::new(RegionShares::new(config)?);
        let weak = Arc::downgrade(&shares);
        let every = shares.config.refresh;
        tokio::spawn(async move {
            loop {
                let Some(shares) = weak.upgrade() else { break };
                // Failures are counted and logged in the status.
                let _ = shares.refresh_now().await;
                drop(shares);
                tokio::time::sleep(every).await;
            }
        });
        Ok(shares)
    }

    /// The configuration.
    pub fn config(&self) -> &GatewayConfig {
        &self.config
    }

    /// The name its confirmations carry in the region's Redis (the
    /// region and a random part).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Withdraws this gateway's confirmation, for a clean stop: the
    /// balancer's raises no longer wait for it (a gateway killed without
    /// it is forgotten `stale_after + settle` after its last sync).
    pub async fn leave(&self) -> Result<(), StoreError> {
        let mut con = self.con.clone();
        let left = tokio::time::timeout(self.config.timeout, store::leave(&mut con, &self.config.key, &self.id)).await;
        left.map_err(|_| timed_out())?.map_err(StoreError::Redis)
    }

    /// The usage counted since the last sync (what the next one writes).
    pub fn usage(&self) -> &UsageCounts {
        &self.usage
    }

    /// One sync, one round trip: the busiest subjects' usage added to the
    /// region's usage hash, the table read with the region's clock. On a
    /// failure the last table stays (and ages) and that interval's usage
    /// is dropped: usage steers shares, it is not a bill. A corrupt table
    /// (a share above the whole, a field no balancer writes) is never
    /// enforced: it is logged, with what is enforced instead.
    pub async fn refresh_now(&self) -> Result<u64, StoreError> {
        let _one_at_a_time = self.syncing.lock().await;
        let batch = self.usage.take_busiest(self.config.busiest);
        let increments: Vec<(&str, &str, u64)> = batch.iter().map(|(r, s, n)| (r.as_str(), s.as_str(), *n)).collect();
        // The version enforced while this read is under way: the one it
        // confirms (0, nothing, before the first read: the fixed split).
        let applied = self.last.load().as_ref().map_or(0, |l| l.read.version);
        let result = self.sync(&increments, applied).await;
        let now = self.now_ms();
        let outcome = match result {
            Ok(read) => {
                let version = read.version;
                self.last.store(Some(Arc::new(Loaded { read, read_at_ms: now })));
                self.stats().last_error = None;
                if version != applied {
                    // A new table is in force from now on: confirmed at
                    // once (one call per change), so a raise elsewhere
                    // waits a refresh, not two.
                    self.confirm(&mut self.con.clone(), version).await;
                }
                Ok(version)
            }
            Err(e) => {
                let text = e.to_string();
                let mut stats = self.stats();
                stats.refresh_failures += 1;
                if matches!(e, StoreError::Corrupt(_)) && stats.last_error.as_deref() != Some(text.as_str()) {
                    // Once per new corruption, not every refresh.
                    tracing::warn!(region = %self.config.region, "{text}; enforcing {}", self.enforced_instead(now));
                }
                stats.last_error = Some(text);
                Err(e)
            }
        };
        self.warn_if_old(now);
        outcome
    }

    /// What a gateway enforces while its table cannot be read.
    fn enforced_instead(&self, now: u64) -> String {
        match self.last.load().as_ref() {
            Some(l) => format!(
                "the last table read (version {}, read {} s ago) until it is {} old, then the fixed split",
                l.read.version,
                now.saturating_sub(l.read_at_ms) / 1000,
                humantime::format_duration(self.config.stale_after)
            ),
            None => "the fixed split (no table read yet)".into(),
        }
    }

    /// The read, and beside it (on the same connection, no extra round
    /// trip) the confirmation of `applied`; a confirmation refused (an
    /// ACL without it) never fails the read.
    async fn sync(&self, increments: &[(&str, &str, u64)], applied: u64) -> Result<Read, StoreError> {
        let (mut read_con, mut report_con) = (self.con.clone(), self.con.clone());
        let sync = store::sync(&mut read_con, &self.config.key, increments);
        let report = self.confirm(&mut report_con, applied);
        let (read, ()) = tokio::join!(tokio::time::timeout(self.config.timeout, sync), report);
        read.map_err(|_| timed_out())?
    }

    /// Confirms `version` in the region's Redis; a failure is counted and
    /// logged once per new error (the balancer then sees no confirmation
    /// from this gateway, and its raises rest on the barrier alone).
    async fn confirm(&self, con: &mut Connection, version: u64) {
        let report = store::report_applied(con, &self.config.key, &self.id, version);
        let error = match tokio::time::timeout(self.config.timeout, report).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        let mut stats = self.stats();
        stats.confirm_failures += 1;
        if stats.last_confirm_error.as_deref() != Some(error.as_str()) {
            tracing::warn!(
                region = %self.config.region,
                key = %store::applied_key(&self.config.key),
                "cannot confirm the share table version this gateway enforces: {error}; the balancer's raises elsewhere then wait only its barrier for this gateway (an ACL user needs HSET on that key)"
            );
            stats.last_confirm_error = Some(error);
        }
    }

    /// Where the table stands.
    pub fn status(&self) -> SharesStatus {
        let age = self.ages().map(|(age, _)| age);
        let stats = self.stats();
        SharesStatus {
            version: self.last.load().as_ref().map_or(0, |l| l.read.version),
            age,
            stale: age.is_none_or(|a| a >= self.config.stale_after),
            refresh_failures: stats.refresh_failures,
            last_error: stats.last_error.clone(),
            age_warnings: stats.age_warnings,
            confirm_failures: stats.confirm_failures,
        }
    }

    /// The share in force for `subject` under global `rule` (`global` its
    /// split), with the share its capacity ramps from and since when.
    pub fn share(&self, rule: &str, global: &GlobalSpec, subject: &str) -> (Share, Duration) {
        let fixed = self.fixed_share(rule, global);
        let last = self.last.load();
        match (last.as_ref(), self.ages()) {
            (Some(l), Some(ages)) => {
                l.read.table.in_force(rule, subject, fixed, ages, self.config.stale_after, self.config.settle)
            }
            _ => (Share::steady(fixed), NEVER),
        }
    }

    /// This region's part of the fixed split (the smallest region's part
    /// if the rule does not name this region: never more than any region).
    fn fixed_share(&self, rule: &str, global: &GlobalSpec) -> u32 {
        let Ok(split) = SplitParams::new(global.floor_ppm(), global.weights()).map(|p| p.default_split()) else {
            return 0;
        };
        match global.region_index(&self.config.region) {
            Some(i) => split.get(i).copied().unwrap_or(0),
            None => {
                let mut stats = self.stats();
                if !stats.warned_region {
                    stats.warned_region = true;
                    tracing::warn!(
                        rule,
                        region = %self.config.region,
                        "global rule does not name this gateway's region: enforcing the smallest region's fixed split"
                    );
                }
                split.into_iter().min().unwrap_or(0)
            }
        }
    }

    /// The table's (age, since its last change) now, if it was ever read.
    fn ages(&self) -> Option<(Duration, Duration)> {
        let last = self.last.load();
        let l = last.as_ref()?;
        let since_read = Duration::from_millis(self.now_ms().saturating_sub(l.read_at_ms));
        Some((l.read.age.min(NEVER) + since_read, l.read.since_change.min(NEVER) + since_read))
    }

    /// The age alarm: a warning above `warn_after`, at most once a minute.
    fn warn_if_old(&self, now: u64) {
        let Some(age) = self.ages().map(|(age, _)| age).filter(|&a| a > self.config.warn_after) else { return };
        let mut stats = self.stats();
        if stats.warned_at_ms.is_some_and(|at| now.saturating_sub(at) < 60_000) {
            return;
        }
        stats.warned_at_ms = Some(now);
        stats.age_warnings += 1;
        let fallback =
            if age >= self.config.stale_after { "the fixed split applies" } else { "keeping the last shares" };
        tracing::warn!(
            region = %self.config.region,
            age_s = age.as_secs(),
            error = stats.last_error.as_deref().unwrap_or("none"),
            "share table is old: is the quota balancer down? {fallback}"
        );
    }

    fn now_ms(&self) -> u64 {
        self.config.clock.now_ms()
    }

    fn stats(&self) -> MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl RegionalShares for RegionShares {
    fn region(&self) -> &str {
        &self.config.region
    }

    fn regional(
        &self,
        rule: &str,
        global: &GlobalSpec,
        subject: &str,
        limits: &[GlobalLimit],
    ) -> Option<Vec<(u64, u64)>> {
        let (share, since_change) = self.share(rule, global, subject);
        limits
            .iter()
            .map(|l| {
                let bucket = GlobalBucket { capacity: l.capacity, refill: l.refill, period_ms: l.period_ms };
                let now = bucket.regional(share.share, share.from, since_change)?;
                let full = bucket.regional(share.share, share.share, Duration::ZERO)?.capacity;
                Some((ramp_step(now.capacity, full), now.refill))
            })
            .collect()
    }

    fn demanded(&self, rule: &str, subject: &str, cost: u64) {
        self.usage.add(rule, subject, cost);
    }
}

fn timed_out() -> StoreError {
    StoreError::Redis(redis::RedisError::from((redis::ErrorKind::Io, "share table read timed out")))
}

/// A ramping capacity rounded down to one of `RAMP_STEPS` steps of the
/// full one (under, never over), so a ramp makes few distinct policies.
fn ramp_step(capacity: u64, full: u64) -> u64 {
    if capacity >= full {
        return full;
    }
    let step = (full / RAMP_STEPS).max(1);
    capacity - capacity % step
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_config_shows_no_password() {
        let shown = format!("{:?}", GatewayConfig::new("eu", "redis://gw:s3cret@10.0.0.5:6379/"));
        assert!(shown.contains("redis://gw:***@10.0.0.5:6379/") && !shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn a_ramp_takes_few_steps_and_rounds_down() {
        assert_eq!(ramp_step(700, 700), 700);
        assert_eq!(ramp_step(450, 700), 441, "steps of 21");
        assert_eq!(ramp_step(20, 700), 0, "below one step: nothing yet");
        assert_eq!(ramp_step(5, 10), 5, "small buckets step by one token");
        let distinct: std::collections::BTreeSet<u64> = (100..=700).map(|c| ramp_step(c, 700)).collect();
        assert!(distinct.len() <= RAMP_STEPS as usize + 1, "{}", distinct.len());
    }
}
