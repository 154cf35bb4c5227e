//! The balancer's configuration and, in one place, the relations between
//! its values that the never-over argument rests on (docs/global-limits.md,
//! "Flag relations"). A [`Config`] that breaks one is refused by name with
//! the relation it breaks; one that only weakens the balancer is run with a
//! warning.
//!
//! The spans compared ([`Spans`]), with c one call to a region (`--timeout`
//! plus any injected delay) and B the barrier (`--gateway-refresh` +
//! `--gateway-timeout`):
//!
//! - a round takes at most 5c + B: claim, usage and read (3c), the
//!   lowering (c), the barrier, the raise (c);
//! - the last writes of two regions before a balancer stops can be 2c + B
//!   apart: a lowering landing at once, and a raise landing a whole call
//!   late a barrier after the last lowering was acknowledged;
//! - from a table's read to this round's lowering landing: at most 4c.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::round::GlobalRule;
use rl_gateway::global::store::MAX_EPOCH;

/// What a relation found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// It breaks the never-over argument (or leaves nothing to run): refused.
    Refused(String),
    /// It only weakens the balancer: run, with this warning.
    Weakened(String),
}

/// The spans the relations compare, derived from a configuration
/// (saturating: no flag value overflows them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spans {
    /// One call to a region at most: `--timeout` plus the injected delay.
    pub call: Duration,
    /// The longest a raise waits after the last acknowledged lowering for
    /// every gateway to confirm it (a refresh to read it, and a read sent
    /// before the lowering landed answered or dropped: its timeout); not
    /// confirmed by then, the raise waits for the next round.
    pub barrier: Duration,
    /// The longest round: five calls and the barrier.
    pub round: Duration,
    /// The spread of one round's writes: two calls and the barrier.
    pub spread: Duration,
    /// A table read this close to `--stale-after` may have been fallen back
    /// from before the next write lands (an interval and four calls): it is
    /// planned from at most the fixed split.
    pub aged_margin: Duration,
    /// How late an unreachable region's gateways may learn of a write: a
    /// call and the barrier.
    pub unreachable_lag: Duration,
}

impl Spans {
    /// The spans of `c`.
    pub fn of(c: &Config) -> Spans {
        let call = c.timeout.saturating_add(c.delay.map_or(Duration::ZERO, |(lo, hi)| lo.max(hi)));
        let barrier = c.gateway_refresh.saturating_add(c.gateway_timeout);
        let calls = |n: u32| call.saturating_mul(n);
        Spans {
            call,
            barrier,
            round: calls(5).saturating_add(barrier),
            spread: calls(2).saturating_add(barrier),
            aged_margin: c.interval.saturating_add(calls(4)),
            unreachable_lag: call.saturating_add(barrier),
        }
    }
}

/// Everything a balancer needs, checked by [`Balancer::new`](crate::Balancer::new) (the
/// relations between its durations: [`Config::check`]).
#[derive(Clone, Debug)]
pub struct Config {
    /// (name, Redis URL) of each region, in the order of the rules' weights.
    pub regions: Vec<(String, String)>,
    /// The global rules, their splits over `regions`.
    pub rules: Vec<GlobalRule>,
    /// Between the starts of two rounds (10 s).
    pub interval: Duration,
    /// Subjects per rule that get shares of their own (the rest: the default split).
    pub busiest: usize,
    /// The gateways' `stale_after`: they keep a table this long without a write (5 min).
    pub stale_after: Duration,
    /// The gateways' `settle`: how long they enforce min(last, fixed) before the fixed split.
    pub settle: Duration,
    /// How often gateways re-read their region's table.
    pub gateway_refresh: Duration,
    /// How long a gateway's read may take before it is dropped: a read
    /// answered late carries the table of when it was sent.
    pub gateway_timeout: Duration,
    /// How long a region may be unreachable before the others get what it cannot hold.
    pub grace: Duration,
    /// Bound of every call to a region.
    pub timeout: Duration,
    /// Regions the operator asserts are down (gateways stopped or cut off from their Redis).
    pub down: BTreeSet<String>,
    /// Injected delay before every call to a region (the simulation's cross-region latency).
    pub delay: Option<(Duration, Duration)>,
    /// The share table's hash in every region.
    pub key: String,
    /// The fencing epoch (1 to [`MAX_EPOCH`]); `None`: one above the
    /// highest any region has seen.
    pub epoch: Option<u64>,
    /// The operator takes over deliberately: this balancer's first claim in
    /// each region replaces whatever epoch is stored (higher, corrupt or
    /// above the ceiling). Only when no other balancer runs.
    pub take_over: bool,
    /// TLS settings for the regions' `rediss://` URLs (one set for all).
    pub tls: rl_gateway::Tls,
    /// What the regions' gateways enforce shares with (`--redis-backend`).
    pub backend: RedisBackend,
}

/// What the regions' gateways enforce their shares with, which the
/// balancer checks in each region before writing there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RedisBackend {
    /// The redis-rl module: a region whose server lacks it is refused.
    #[default]
    Module,
    /// rl-client's Lua scripts (gateways with `backend = "lua"`): any
    /// Redis, no module check.
    Lua,
    /// Either, region by region: a server without the module is taken,
    /// logged as one whose gateways must run the Lua scripts.
    Auto,
}

impl RedisBackend {
    /// `module`, `lua` or `auto` (the flag's and `RL_REDIS_BACKEND`'s values).
    pub fn parse(text: &str) -> Result<RedisBackend, String> {
        match text.to_ascii_lowercase().as_str() {
            "module" => Ok(RedisBackend::Module),
            "lua" => Ok(RedisBackend::Lua),
            "auto" => Ok(RedisBackend::Auto),
            _ => Err(format!("'{text}': one of module, lua, auto")),
        }
    }

    /// Its name, as the flag takes it (the status's label).
    pub fn name(self) -> &'static str {
        match self {
            RedisBackend::Module => "module",
            RedisBackend::Lua => "lua",
            RedisBackend::Auto => "auto",
        }
    }
}

impl Config {
    /// The defaults of the binary for these regions and rules.
    pub fn new(regions: Vec<(String, String)>, rules: Vec<GlobalRule>) -> Config {
        Config {
            regions,
            rules,
            interval: Duration::from_secs(10),
            busiest: 1000,
            stale_after: Duration::from_secs(300),
            settle: Duration::from_secs(10),
            gateway_refresh: Duration::from_secs(1),
            gateway_timeout: Duration::from_secs(1),
            grace: Duration::from_secs(60),
            timeout: Duration::from_secs(2),
            down: BTreeSet::new(),
            delay: None,
            key: rl_gateway::global::store::DEFAULT_KEY.to_string(),
            epoch: None,
            take_over: false,
            tls: rl_gateway::Tls::default(),
            backend: RedisBackend::Module,
        }
    }
}

impl Config {
    /// Checks every relation: `Err` lists each one broken, a line each;
    /// `Ok`, what only weakens the balancer, one warning each.
    pub fn check(&self) -> Result<Vec<String>, String> {
        let findings = findings(self);
        let refused: Vec<&str> = findings
            .iter()
            .filter_map(|f| match f {
                Finding::Refused(m) => Some(m.as_str()),
                Finding::Weakened(_) => None,
            })
            .collect();
        if !refused.is_empty() {
            return Err(refused.join("\n"));
        }
        Ok(findings
            .into_iter()
            .filter_map(|f| match f {
                Finding::Weakened(m) => Some(m),
                Finding::Refused(_) => None,
            })
            .collect())
    }
}

/// Every relation's finding for `c`, refusals and warnings.
pub fn findings(c: &Config) -> Vec<Finding> {
    let s = Spans::of(c);
    [regions, down, key, epoch, positive, barrier, settle, stale_after, grace, inject_delay]
        .iter()
        .flat_map(|relation| relation(c, &s))
        .collect()
}

fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// "--timeout 2s", with the injected delay when there is one.
fn call_text(c: &Config) -> String {
    match c.delay {
        Some((lo, hi)) => format!("--timeout {} + --inject-delay {}", show(c.timeout), show(lo.max(hi))),
        None => format!("--timeout {}", show(c.timeout)),
    }
}

fn barrier_text(c: &Config) -> String {
    format!("--gateway-refresh {} + --gateway-timeout {}", show(c.gateway_refresh), show(c.gateway_timeout))
}

/// Regions: at least one, each named once, and every rule's split over
/// exactly as many.
fn regions(c: &Config, _: &Spans) -> Vec<Finding> {
    let n = c.regions.len();
    let mut out = Vec::new();
    if n == 0 {
        out.push(Finding::Refused("no region: name each with --region NAME=redis://host:port".into()));
    }
    let names: Vec<String> = c.regions.iter().map(|r| r.0.clone()).collect();
    if let Err(e) = named_once(&names) {
        out.push(Finding::Refused(e));
    }
    for rule in &c.rules {
        if rule.split.regions() != n {
            out.push(Finding::Refused(format!(
                "rule {}: its split names {} regions, the balancer has {n}",
                rule.id,
                rule.split.regions()
            )));
        }
    }
    out
}

/// Each region named once.
pub fn named_once(names: &[String]) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    match names.iter().find(|n| !seen.insert(n.as_str())) {
        Some(twice) => Err(format!("--region {twice}: named twice (one --region per region)")),
        None => Ok(()),
    }
}

/// `--down`: regions that exist, never all of them; half or more means no
/// round reaches a majority while they do not answer.
fn down(c: &Config, _: &Spans) -> Vec<Finding> {
    let names: Vec<&str> = c.regions.iter().map(|r| r.0.as_str()).collect();
    if let Some(d) = c.down.iter().find(|d| !names.contains(&d.as_str())) {
        return vec![Finding::Refused(format!("--down {d}: no such region (regions: {})", names.join(", ")))];
    }
    let (down, n) = (c.down.len(), names.len());
    let listed = || c.down.iter().cloned().collect::<Vec<_>>().join(", ");
    if n > 0 && down == n {
        return vec![Finding::Refused(format!(
            "--down names every region ({}): every region would get 0 shares and refuse every request of the global rules; leave at least one region up",
            listed()
        ))];
    }
    if down > 0 && down * 2 >= n {
        let part = if down * 2 > n { "a majority" } else { "half" };
        return vec![Finding::Weakened(format!(
            "--down names {part} of the regions ({} of {n}): while they do not answer, no round reaches a majority and nothing is written",
            listed()
        ))];
    }
    Vec::new()
}

fn key(c: &Config, _: &Spans) -> Vec<Finding> {
    if c.key.is_empty() {
        return vec![Finding::Refused(format!(
            "--key must not be empty: it names the share table's hash in every region, the one the gateways read ({} by default)",
            rl_gateway::global::store::DEFAULT_KEY
        ))];
    }
    Vec::new()
}

fn epoch(c: &Config, _: &Spans) -> Vec<Finding> {
    match c.epoch {
        Some(0) => vec![Finding::Refused(format!(
            "--epoch 0 must be from 1 to {MAX_EPOCH}: 0 is no epoch (every claim passes it); leave --epoch out to pick one above every epoch the regions hold"
        ))],
        Some(e) if e > MAX_EPOCH => vec![Finding::Refused(format!(
            "--epoch {e} is above the ceiling {MAX_EPOCH}: epochs are integers from 1 to {MAX_EPOCH}; leave --epoch out to pick one above every epoch the regions hold"
        ))],
        _ => Vec::new(),
    }
}

fn positive(c: &Config, _: &Spans) -> Vec<Finding> {
    let mut out = Vec::new();
    if c.interval.is_zero() {
        out.push(Finding::Refused("--interval (0s) must be above 0: rounds would run back to back".into()));
    }
    if c.timeout.is_zero() {
        out.push(Finding::Refused("--timeout (0s) must be above 0: every call to a region would time out".into()));
    }
    out
}

/// The barrier between lowering and raising: both parts above 0.
fn barrier(c: &Config, _: &Spans) -> Vec<Finding> {
    let mut out = Vec::new();
    if c.gateway_refresh.is_zero() {
        out.push(Finding::Refused(
            "--gateway-refresh (0s) must be above 0: it is at least the gateways' refresh, and the balancer waits up to it (and --gateway-timeout) between lowering and raising for every gateway to confirm the lowering; without it no raise is ever confirmed in time".into(),
        ));
    }
    if c.gateway_timeout.is_zero() {
        out.push(Finding::Refused(
            "--gateway-timeout (0s) must be above 0: it is at least the gateways' read timeout, and a read sent before a lowering landed can install the old, higher share up to that long after; without it a raise can land before".into(),
        ));
    }
    out
}

/// The stale fallback's settle outlasts the spread of one round's writes.
fn settle(c: &Config, s: &Spans) -> Vec<Finding> {
    if c.settle > s.spread {
        return Vec::new();
    }
    vec![Finding::Refused(format!(
        "--settle ({}) must be longer than the spread of one round's writes ({}: a lowering and a raise of {} each, the barrier {} apart): a balancer stopping mid-round leaves the regions' last writes that far apart, and a region falling back to its fixed split would raise before another's raised share has aged out",
        show(c.settle),
        show(s.spread),
        call_text(c),
        barrier_text(c)
    ))]
}

/// Gateways keep a table longer than the longest gap between two writes.
fn stale_after(c: &Config, s: &Spans) -> Vec<Finding> {
    let gap = c.interval.saturating_add(s.round);
    if c.stale_after > gap {
        return Vec::new();
    }
    vec![Finding::Refused(format!(
        "--stale-after ({}) must be longer than --interval ({}) plus the longest round ({}: 5 calls of {} and the barrier {}), {} in all: gateways would fall back to the fixed split between two rounds",
        show(c.stale_after),
        show(c.interval),
        show(s.round),
        call_text(c),
        barrier_text(c),
        show(gap)
    ))]
}

/// A grace of a round or two moves shares away from a region at every
/// missed round, and back: churn, never over (what it may hold is left to it).
fn grace(c: &Config, _: &Spans) -> Vec<Finding> {
    let two = c.interval.saturating_mul(2);
    if c.grace >= two {
        return Vec::new();
    }
    vec![Finding::Weakened(format!(
        "--grace ({}) is shorter than two rounds (2 x --interval = {}): a region that misses a round loses its share to the others and gets it back the next (never over: what it may still hold is always left to it)",
        show(c.grace),
        show(two)
    ))]
}

fn inject_delay(c: &Config, _: &Spans) -> Vec<Finding> {
    match c.delay {
        Some((lo, hi)) => vec![Finding::Weakened(format!(
            "--inject-delay {}-{} ms is for testing: every call to a region waits that long first",
            lo.as_millis(),
            hi.as_millis()
        ))],
        None => Vec::new(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rl_gateway::global::SplitParams;

    /// Three regions and one rule, the defaults otherwise (nothing listens).
    pub(crate) fn config() -> Config {
        let rule = GlobalRule {
            id: "api".into(),
            split: SplitParams::new(50_000, vec![1, 1, 1]).unwrap(),
            ramp: Duration::from_secs(1),
        };
        let regions = ["eu", "us", "ap"].iter().map(|r| (r.to_string(), "redis://127.0.0.1:1".to_string()));
        Config::new(regions.collect(), vec![rule])
    }

    fn refused(c: &Config) -> String {
        c.check().err().unwrap_or_default()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_defaults_hold_every_relation() {
        let warnings = config().check().unwrap();
        assert!(warnings.is_empty(), "{:?}", warnings);
        let spans = Spans::of(&config());
        assert_eq!((spans.call, spans.barrier, spans.round, spans.spread), (secs(2), secs(2), secs(12), secs(6)));
        assert_eq!((spans.aged_margin, spans.unreachable_lag), (secs(18), secs(4)));
    }

    #[test]
    fn the_barrier_must_wait() {
        let mut c = config();
        (c.gateway_refresh, c.gateway_timeout) = (Duration::ZERO, Duration::ZERO);
        let e = refused(&c);
        assert!(e.contains("--gateway-refresh (0s) must be above 0") && e.contains("--gateway-timeout (0s)"), "{e}");
        c.gateway_refresh = Duration::from_millis(1);
        assert!(!refused(&c).contains("--gateway-refresh"));
    }

    #[test]
    fn settle_outlasts_the_spread_of_a_rounds_writes() {
        let mut c = config();
        c.settle = secs(6);
        let e = refused(&c);
        assert!(e.contains("--settle (6s) must be longer than the spread of one round's writes (6s"), "{e}");
        assert!(e.contains("--timeout 2s") && e.contains("--gateway-refresh 1s + --gateway-timeout 1s"), "{e}");
        c.settle = Duration::from_millis(6001);
        assert_eq!(refused(&c), "");
        // An injected delay lengthens every call.
        c.delay = Some((Duration::from_millis(70), Duration::from_millis(150)));
        assert!(refused(&c).contains("--settle (6s 1ms)") && refused(&c).contains("--inject-delay 150ms"));
    }

    #[test]
    fn stale_after_outlasts_the_gap_between_two_writes() {
        let mut c = config();
        (c.stale_after, c.interval) = (secs(1), secs(10));
        let e = refused(&c);
        assert!(
            e.contains("--stale-after (1s) must be longer than --interval (10s) plus the longest round (12s"),
            "{e}"
        );
        assert!(e.contains("22s in all: gateways would fall back to the fixed split between two rounds"), "{e}");
        c.stale_after = secs(22);
        assert!(!refused(&c).is_empty());
        c.stale_after = Duration::from_millis(22_001);
        assert_eq!(refused(&c), "");
    }

    #[test]
    fn down_leaves_a_region_up() {
        let mut c = config();
        c.down = ["eu", "us", "ap"].map(String::from).into();
        assert!(refused(&c).contains("--down names every region (ap, eu, us)"));
        c.down.remove("eu");
        let warnings = c.check().unwrap();
        assert!(warnings[0].contains("--down names a majority of the regions (ap, us of 3)"), "{:?}", warnings);
        c.down.remove("us");
        assert!(c.check().unwrap().is_empty());
        c.down.insert("mars".into());
        assert!(refused(&c).contains("--down mars: no such region (regions: eu, us, ap)"));
    }

    #[test]
    fn a_key_an_epoch_and_the_regions_must_name_something() {
        let mut c = config();
        c.key.clear();
        assert!(refused(&c).contains("--key must not be empty"));
        let mut c = config();
        c.epoch = Some(0);
        assert!(refused(&c).contains("--epoch 0 must be from 1 to 9223372036854775807"));
        c.epoch = Some(u64::MAX);
        assert!(refused(&c).contains("--epoch 18446744073709551615 is above the ceiling 9223372036854775807"));
        c.epoch = Some(MAX_EPOCH);
        assert_eq!(refused(&c), "");
        let mut c = config();
        c.regions[1].0 = "eu".into();
        assert!(refused(&c).contains("--region eu: named twice"));
        let mut c = config();
        c.regions.pop();
        assert!(refused(&c).contains("rule api: its split names 3 regions, the balancer has 2"));
        assert!(refused(&Config::new(vec![], vec![])).contains("no region"));
        let mut c = config();
        (c.interval, c.timeout) = (Duration::ZERO, Duration::ZERO);
        let e = refused(&c);
        assert!(e.contains("--interval (0s) must be above 0") && e.contains("--timeout (0s) must be above 0"), "{e}");
    }

    #[test]
    fn a_short_grace_is_only_a_warning() {
        let mut c = config();
        c.grace = Duration::ZERO;
        let warnings = c.check().unwrap();
        assert!(warnings[0].contains("--grace (0s) is shorter than two rounds (2 x --interval = 20s)"));
        c.grace = secs(20);
        assert!(c.check().unwrap().is_empty());
    }

    #[test]
    fn huge_flags_saturate_instead_of_overflowing() {
        let mut c = config();
        c.timeout = Duration::MAX;
        let s = Spans::of(&c);
        assert_eq!((s.round, s.spread), (Duration::MAX, Duration::MAX));
        assert!(refused(&c).contains("--stale-after"));
    }
}
