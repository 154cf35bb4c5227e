//! rl-balancer: the quota balancer of global limits across regions.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rl_balancer::{Balancer, Config, GlobalRule, RedisBackend, Stopped};
use rl_gateway::live::RuleSetSpec;
use tokio::signal::unix::{signal, SignalKind};

/// Moves each region's share of every global limit toward where the traffic
/// is, every --interval, without ever letting the shares in effect sum above
/// the whole limit (lower everywhere first, wait for the gateways, then
/// raise).
///
/// Run exactly one per deployment (under a supervisor that restarts it). A
/// second one, or a restarted one, claims a higher epoch in every region;
/// the older one's writes are then refused and it exits with status 3.
/// A stored epoch that is corrupt or above the ceiling is reported, not
/// fenced against: --take-over claims over it deliberately.
///
/// Flags that break the never-over argument (e.g. --stale-after within a
/// round, --settle within one round's writes, a 0 barrier) and regions
/// whose server lacks the redis-rl module (unless --redis-backend lua or
/// auto) are refused with status 2, by name and with the relation broken.
///
/// Alarms: the share table's age above 60 s (rl_share_table_age_seconds from
/// `rlctl metrics` on each region's Redis: this process is down
/// or failing), a `round` log line missing for 3 intervals, and `region
/// unreachable` warnings; with --metrics, its own rounds (alerts
/// BalancerDown, BalancerRoundsFailing). SIGHUP reloads --rules (a bad
/// file keeps the rules in force); SIGTERM stops after the round under
/// way. Without this process the gateways keep the last
/// shares for --stale-after, then fall back to the fixed split: it can be
/// restarted at any time.
#[derive(Parser, Debug, Clone)]
#[command(name = "rl-balancer", version, verbatim_doc_comment)]
struct Args {
    #[command(flatten)]
    tls: rlctl::tls_flags::TlsFlags,
    /// A region and its Redis, e.g. `eu=redis://10.0.0.5:6379`, or the
    /// master its sentinels name, followed across a failover:
    /// `eu=redis+sentinel://10.0.0.5:26379,10.0.0.6:26379/mymaster`. Repeat
    /// for each region, in the order the global rules list their regions.
    #[arg(long = "region", value_name = "NAME=URL", required = true, value_parser = parse_region)]
    regions: Vec<(String, String)>,

    /// The rule set (TOML or JSON, as rlctl and the gateways read it):
    /// its rules with `global = { regions = [...], floor, weights }` are
    /// balanced. Each must span exactly the --region list, in its order.
    #[arg(long, value_name = "FILE")]
    rules: PathBuf,

    /// Between two rounds.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    interval: Duration,

    /// Subjects per rule that get shares of their own, by worldwide traffic;
    /// the others get the rule's default split.
    #[arg(long, default_value_t = 1000)]
    busiest: usize,

    /// The gateways' stale_after: how long they keep a table without a write
    /// before falling back to the fixed split. Must match the gateways'.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    stale_after: Duration,

    /// The gateways' settle: how long they enforce min(last, fixed) before
    /// the fixed split. Must match the gateways'.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    settle: Duration,

    /// How often the gateways re-read their region's table: at least the
    /// gateways' refresh.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    gateway_refresh: Duration,

    /// How long a gateway's read of its table may take: at least the
    /// gateways' timeout. Between lowering and raising the balancer waits
    /// --gateway-refresh + --gateway-timeout.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    gateway_timeout: Duration,

    /// How long a region may be unreachable before the others get what it
    /// cannot be holding any more (its fixed split once its gateways must
    /// have fallen back). Until then nothing changes.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    grace: Duration,

    /// Assert that REGION is down (its gateways are stopped or cannot reach
    /// their Redis): the others take its whole share. Wrong if the region
    /// is only cut off from the balancer: then it goes over. When its Redis
    /// is reachable again it gets 0 shares, then starts from the floor.
    #[arg(long, value_name = "REGION")]
    down: Vec<String>,

    /// Bound of every call to a region's Redis.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    timeout: Duration,

    /// The share table's hash in every region.
    #[arg(long, default_value = rl_balancer::store::DEFAULT_KEY)]
    key: String,

    /// The fencing epoch, an integer from 1 to 9223372036854775807
    /// (default: above the highest any region holds, so a new balancer
    /// always takes over from an old one).
    #[arg(long, value_parser = parse_epoch)]
    epoch: Option<u64>,

    /// Take over deliberately: the first claim in each region replaces the
    /// epoch stored there, even a higher one, a corrupt one or one above
    /// the ceiling (an older balancer's). Only when no other balancer
    /// runs: one that does claims back above it, and this one exits 3.
    #[arg(long)]
    take_over: bool,

    /// What the regions' gateways enforce shares with: module (the redis-rl
    /// module; a region whose server lacks it is refused), lua (rl-client's
    /// Lua scripts, gateways with backend = "lua": no module check) or auto
    /// (either, region by region, a region without the module logged).
    #[arg(long, env = "RL_REDIS_BACKEND", default_value = "module", value_parser = RedisBackend::parse)]
    redis_backend: RedisBackend,

    /// Serve /metrics (Prometheus text: rounds, the age of the last good
    /// one, regions reached, epoch, rule reloads) on this address.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,

    /// Testing: wait a random MIN-MAX ms before every call to a region,
    /// e.g. 70-150, to model cross-region latency.
    #[arg(long, value_name = "MIN-MAX", value_parser = parse_delay)]
    inject_delay: Option<(Duration, Duration)>,
}

fn parse_region(s: &str) -> Result<(String, String), String> {
    let (name, url) = s.split_once('=').ok_or("expected NAME=URL, e.g. eu=redis://10.0.0.5:6379")?;
    if name.is_empty() || url.is_empty() {
        return Err("expected NAME=URL with both parts".into());
    }
    Ok((name.to_string(), url.to_string()))
}

fn parse_epoch(s: &str) -> Result<u64, String> {
    rl_gateway::global::store::parse_stored(s).map_err(|p| format!("--epoch {s} is {p}"))
}

fn parse_delay(s: &str) -> Result<(Duration, Duration), String> {
    let (lo, hi) = s.split_once('-').ok_or("expected MIN-MAX in ms, e.g. 70-150")?;
    let ms = |v: &str| v.trim().parse::<u64>().map_err(|e| format!("{v:?}: {e}"));
    let (lo, hi) = (ms(lo)?, ms(hi)?);
    if lo > hi {
        return Err(format!("{lo} is above {hi}"));
    }
    Ok((Duration::from_millis(lo), Duration::from_millis(hi)))
}

/// The global rules of the file at `path`, matched to the regions `names`.
fn global_rules(path: &Path, names: &[String]) -> Result<Vec<GlobalRule>, String> {
    let spec = RuleSetSpec::from_file(path).map_err(|e| format!("--rules {}: {e}", path.display()))?;
    rl_balancer::rules::from_spec(&spec, names).map_err(|e| format!("--rules {}: {e}", path.display()))
}

fn config(args: &Args) -> Result<Config, String> {
    let names: Vec<String> = args.regions.iter().map(|r| r.0.clone()).collect();
    // Before the rules are matched to the regions: they need each once.
    rl_balancer::config::named_once(&names)?;
    let rules = global_rules(&args.rules, &names)?;
    let args = args.clone();
    let mut c = Config::new(args.regions, rules);
    c.interval = args.interval;
    c.busiest = args.busiest;
    c.stale_after = args.stale_after;
    c.settle = args.settle;
    c.gateway_refresh = args.gateway_refresh;
    c.gateway_timeout = args.gateway_timeout;
    c.grace = args.grace;
    c.timeout = args.timeout;
    c.down = args.down.into_iter().collect::<BTreeSet<_>>();
    c.key = args.key;
    c.epoch = args.epoch;
    c.take_over = args.take_over;
    c.tls = args.tls.tls();
    c.delay = args.inject_delay;
    c.backend = args.redis_backend;
    Ok(c)
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs collected from a pipe stay plain.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let balancer = match config(&args).map_err(Stopped::Config).and_then(Balancer::new) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("rl-balancer: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(addr) = args.metrics {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                tokio::spawn(rl_balancer::status::serve(balancer.status(), listener));
            }
            Err(e) => {
                eprintln!("rl-balancer: --metrics {addr}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    match args.redis_backend {
        RedisBackend::Module => {
            tracing::info!("--redis-backend module: every region's server must have the redis-rl module")
        }
        RedisBackend::Lua => tracing::info!(
            "--redis-backend lua: the regions' gateways enforce shares with rl-client's Lua scripts; no module check"
        ),
        RedisBackend::Auto => {
            tracing::info!("--redis-backend auto: a region without the redis-rl module is taken, and logged")
        }
    }
    let names: Vec<String> = args.regions.iter().map(|r| r.0.clone()).collect();
    let (reloads, status) = (balancer.rule_reloads(), balancer.status());
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        eprintln!("rl-balancer: cannot listen for SIGHUP");
        return ExitCode::from(2);
    };
    tokio::spawn(async move {
        // SIGHUP: read --rules again; a file that does not parse keeps the
        // rules in force (the balancer checks the rest the same way).
        while hangups.recv().await.is_some() {
            match global_rules(&args.rules, &names) {
                Ok(rules) => reloads.send(rules),
                Err(e) => {
                    status.reloaded(None);
                    tracing::error!("rules not reloaded, the rules in force stay: {e}");
                }
            }
        }
    });
    let stop = async {
        let Ok(mut terms) = signal(SignalKind::terminate()) else { return std::future::pending().await };
        let why = tokio::select! {
            _ = terms.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        };
        // Between rounds or within one: the tables written stay in force,
        // and gateways keep them for stale_after.
        tracing::info!("{why}: stopping; gateways keep the last shares for --stale-after, then the fixed split");
    };
    match balancer.run(stop).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ Stopped::Fenced(_)) => {
            tracing::error!("{e}");
            ExitCode::from(3)
        }
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
    }
}
