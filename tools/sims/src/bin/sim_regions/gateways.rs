//! A region's gateways: each a real rl-client `Limiter` under `LiveRules`
//! with the global rule, its shares from the region's Redis
//! (`RegionShares`), asked the region's part of the demand.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_gateway::global::{GatewayConfig, RegionShares};
use rl_gateway::live::{LiveRules, Request};
use rl_gateway::{Config, Limiter, LimiterConfig, Source};
use tokio::task::JoinHandle;

use crate::rules::rules;
use crate::timing::Timing;
use crate::traffic::{Demand, Recorder, REGIONS};

/// The gateways' lease window (rl-client's default is 1 s).
pub const LEASE_WINDOW: Duration = Duration::from_millis(1);

/// One region's running gateways.
pub struct Fleet {
    tasks: Vec<JoinHandle<()>>,
    /// The first gateway's shares: the sampler reads what it enforces.
    pub probe: Arc<RegionShares>,
}

impl Fleet {
    /// Stops every gateway at once (a region's gateways killed).
    pub fn kill(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

/// Starts `n` gateways of region `r` against `url`.
pub async fn start(r: usize, url: &str, n: usize, timing: &Timing, demand: Arc<Demand>, rec: Arc<Recorder>) -> Fleet {
    let spec = rules();
    let mut tasks = Vec::with_capacity(n);
    let mut probe = None;
    for g in 0..n {
        // Batches of one token: every request is an exact RL.TAKE, so the
        // figures measure the shares, not the leases' under-admission of a
        // subject pressing its limit.
        let config = LimiterConfig {
            gateways: n as u32,
            lease_window: LEASE_WINDOW,
            ..LimiterConfig::new(Config::standalone(url))
        };
        let limiter = Limiter::new(config).expect("a valid config");
        let live = LiveRules::new(limiter, &spec).expect("valid rules");
        let mut config = GatewayConfig::new(REGIONS[r], url);
        config.refresh = timing.gateway_refresh;
        config.stale_after = timing.stale_after;
        config.settle = timing.settle;
        config.timeout = timing.gateway_timeout;
        let shares = RegionShares::start(config).expect("a valid Redis URL");
        // A gateway serves once it has read its region's table: before
        // that it could only assume the fixed split.
        let _ = shares.refresh_now().await;
        live.set_region_shares(shares.clone()).expect("set once");
        probe.get_or_insert_with(|| shares.clone());
        let (demand, rec) = (demand.clone(), rec.clone());
        tasks.push(tokio::spawn(gateway(r, g, n, live, demand, rec)));
    }
    Fleet { tasks, probe: probe.expect("at least one gateway") }
}

/// One gateway: every tick, its part of the region's demand (fractions
/// carried over), the busy customer's and the quiet ones'.
async fn gateway(r: usize, g: usize, n: usize, live: LiveRules, demand: Arc<Demand>, rec: Arc<Recorder>) {
    const TICK: Duration = Duration::from_millis(20);
    // Gateways start spread over a tick so their requests do not come in waves.
    tokio::time::sleep(TICK * g as u32 / n as u32).await;
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Random starting fractions: otherwise every gateway of a region
    // reaches a whole request at the same tick and the demand comes in
    // bursts that overflow the bucket between them.
    let (mut busy_owed, mut quiet_owed, mut next_quiet) = (fastrand::f64(), fastrand::f64(), g);
    loop {
        ticks.tick().await;
        busy_owed += demand.busy()[r] / n as f64 * TICK.as_secs_f64();
        quiet_owed += demand.quiet_each * demand.quiet_subjects as f64 / n as f64 * TICK.as_secs_f64();
        while busy_owed >= 1.0 {
            busy_owed -= 1.0;
            ask(&live, r, "acme", true, &rec).await;
        }
        while quiet_owed >= 1.0 {
            quiet_owed -= 1.0;
            next_quiet = (next_quiet + 1) % demand.quiet_subjects.max(1);
            ask(&live, r, &format!("quiet:{next_quiet}"), false, &rec).await;
        }
    }
}

async fn ask(live: &LiveRules, r: usize, subject: &str, busy: bool, rec: &Recorder) -> Option<bool> {
    let sent = Instant::now();
    let request = Request { subject: Some(subject), ..Request::new() };
    let decision = live.check(&request).await.ok().map(|v| v.decision);
    let allowed = decision.map(|d| d.allowed);
    rec.answer(r, busy, sent, allowed);
    if let (true, Some(d)) = (busy, decision.filter(|d| !d.allowed)) {
        let by = match d.source {
            Source::DenyCache | Source::Pacing => 1,
            Source::Fallback => 2,
            Source::FailClosed => 3,
            Source::Redis | Source::Lease => 0,
        };
        rec.refused_by[by].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    allowed
}
