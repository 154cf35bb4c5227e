//! What the balancer tells an operator about itself (`--metrics ADDR`):
//! its rounds (the age of the last good one is the alarm), the regions it
//! reached and what each enforces shares with (the module or the Lua
//! scripts: never a silent fallback), its epoch and its rule reloads, as Prometheus text on
//! `/metrics`. The share table's age on each region's exporter says the
//! same from the other side: a balancer that is up and failing shows here.

use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use rl_gateway::global::ShareTable;

/// What one round did, for the log line and the tests.
#[derive(Clone, Debug, Default)]
pub struct RoundReport {
    /// The epoch written with.
    pub epoch: u64,
    /// Start to end of the round.
    pub duration: Duration,
    /// Regions that answered, by name.
    pub reached: Vec<String>,
    /// Each region's table version after the round (`None`: not written).
    pub versions: Vec<Option<u64>>,
    /// Why nothing was planned this round (`None`: planned).
    pub held: Option<String>,
    /// Whether the raise phase was written.
    pub raised: bool,
    /// Why a planned raise was not written: the gateways that had not
    /// confirmed the lowering within the barrier (`None`: nothing waited).
    pub unconfirmed: Option<String>,
    /// How many gateways had not confirmed it.
    pub unconfirmed_gateways: usize,
    /// The tables in effect after the round, by region (`None`: unknown).
    pub tables: Vec<Option<ShareTable>>,
}

/// The balancer's counters, updated by its loop and read by scrapes.
#[derive(Debug)]
pub struct Status {
    inner: Mutex<Counters>,
}

#[derive(Debug)]
struct Counters {
    started: Instant,
    regions: usize,
    rules: usize,
    epoch: u64,
    rounds: u64,
    held_rounds: u64,
    last_good: Option<Instant>,
    last_duration: Duration,
    reached: usize,
    reloads: u64,
    failed_reloads: u64,
    unconfirmed_raises: u64,
    unconfirmed_gateways: usize,
    /// Each region's Redis backend: (region, `module`, `lua` or `auto`).
    backends: Vec<(String, &'static str)>,
}

impl Status {
    /// A balancer of `regions` regions and `rules` global rules, started now.
    pub fn new(regions: usize, rules: usize) -> Status {
        Status {
            inner: Mutex::new(Counters {
                started: Instant::now(),
                regions,
                rules,
                epoch: 0,
                rounds: 0,
                held_rounds: 0,
                last_good: None,
                last_duration: Duration::ZERO,
                reached: 0,
                reloads: 0,
                failed_reloads: 0,
                unconfirmed_raises: 0,
                unconfirmed_gateways: 0,
                backends: Vec::new(),
            }),
        }
    }

    fn counters(&self) -> std::sync::MutexGuard<'_, Counters> {
        // A panic elsewhere while holding it leaves plain numbers: still readable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A round ended. A good one planned and wrote the shares; a held one
    /// (no majority, no budget) rewrote what was in force.
    pub fn round(&self, report: &RoundReport) {
        let mut c = self.counters();
        c.rounds += 1;
        c.epoch = report.epoch;
        c.last_duration = report.duration;
        c.reached = report.reached.len();
        c.unconfirmed_gateways = report.unconfirmed_gateways;
        if report.unconfirmed.is_some() {
            c.unconfirmed_raises += 1;
        }
        if report.held.is_some() {
            c.held_rounds += 1;
        } else {
            c.last_good = Some(Instant::now());
        }
    }

    /// A rule reload: `Some(n)` took `n` global rules, `None` was refused
    /// (the rules in force stay).
    pub fn reloaded(&self, rules: Option<usize>) {
        let mut c = self.counters();
        match rules {
            Some(n) => {
                c.reloads += 1;
                c.rules = n;
            }
            None => c.failed_reloads += 1,
        }
    }

    /// What `region`'s gateways enforce shares with: `module` or `lua`
    /// (`auto` until the region answered the module check).
    pub fn backend(&self, region: &str, backend: &'static str) {
        let mut c = self.counters();
        match c.backends.iter_mut().find(|(r, _)| r == region) {
            Some(entry) => entry.1 = backend,
            None => c.backends.push((region.to_string(), backend)),
        }
    }

    /// Rounds run.
    pub fn rounds(&self) -> u64 {
        self.counters().rounds
    }

    /// Rounds whose raise waited for the gateways' confirmations.
    pub fn unconfirmed_raises(&self) -> u64 {
        self.counters().unconfirmed_raises
    }

    /// Seconds since the last good round (since the start before the first).
    pub fn last_good_round_age(&self) -> Duration {
        let c = self.counters();
        c.last_good.unwrap_or(c.started).elapsed()
    }

    /// Prometheus text: each family with its HELP and TYPE.
    pub fn render(&self) -> String {
        let age = self.last_good_round_age().as_secs_f64();
        let c = self.counters();
        let families: [(&str, &str, &str, String); 12] = [
            ("rl_balancer_rounds_total", "counter", "Rounds run", c.rounds.to_string()),
            (
                "rl_balancer_held_rounds_total",
                "counter",
                "Rounds that planned nothing (no majority of regions reached, or no budget)",
                c.held_rounds.to_string(),
            ),
            (
                "rl_balancer_last_good_round_age_seconds",
                "gauge",
                "Seconds since the last round that planned and wrote the shares (since the start before the first)",
                format!("{age:.3}"),
            ),
            (
                "rl_balancer_round_duration_seconds",
                "gauge",
                "How long the last round took",
                format!("{:.3}", c.last_duration.as_secs_f64()),
            ),
            ("rl_balancer_regions", "gauge", "Regions configured", c.regions.to_string()),
            ("rl_balancer_regions_reached", "gauge", "Regions the last round reached", c.reached.to_string()),
            (
                "rl_balancer_epoch",
                "gauge",
                "The fencing epoch this balancer writes with (0 before it picked one)",
                c.epoch.to_string(),
            ),
            ("rl_balancer_rules", "gauge", "Global rules balanced", c.rules.to_string()),
            ("rl_balancer_rule_reloads_total", "counter", "Rule reloads taken (SIGHUP)", c.reloads.to_string()),
            (
                "rl_balancer_failed_rule_reloads_total",
                "counter",
                "Rule reloads refused (the rules in force stay)",
                c.failed_reloads.to_string(),
            ),
            (
                "rl_balancer_unconfirmed_raises_total",
                "counter",
                "Rounds whose raise waited for the next round: gateways of a lowered region had not confirmed the lowering within the barrier",
                c.unconfirmed_raises.to_string(),
            ),
            (
                "rl_balancer_unconfirmed_gateways",
                "gauge",
                "Gateways that had not confirmed the lowering when the last round's raise waited (0: it did not wait)",
                c.unconfirmed_gateways.to_string(),
            ),
        ];
        let mut text = String::new();
        for (name, kind, help, value) in families {
            rl_gateway::prometheus_family(&mut text, name, kind, help);
            let _ = writeln!(text, "{name} {value}");
        }
        let name = "rl_balancer_redis_backend";
        let help = "1 for each region and the Redis backend its gateways enforce shares with: module (the redis-rl module, checked), lua (rl-client's Lua scripts) or auto (not checked yet)";
        rl_gateway::prometheus_family(&mut text, name, "gauge", help);
        for (region, backend) in &c.backends {
            let _ =
                writeln!(text, "{name}{{region=\"{}\",backend=\"{backend}\"}} 1", rl_gateway::prometheus_label(region));
        }
        text
    }
}

/// Serves `/metrics` on `listener` until the task is dropped (rlctl's
/// server: the exporter's bounds).
pub async fn serve(status: Arc<Status>, listener: TcpListener) {
    rlctl::exporter::serve_metrics(listener, "rl-balancer --metrics", move || {
        let status = status.clone();
        async move { status.render() }
    })
    .await;
}
