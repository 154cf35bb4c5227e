//! A fleet of gateways against one real redis-server with the module: how
//! many Redis calls a request costs with and without leases and the deny
//! cache, whether any subject gets more than its limit allows, and what an
//! outage does.
//!
//! ```text
//! make sim                                    # builds the module, runs this, writes gateway/SIMULATION.md
//! cargo run --release -p rl-sims --bin fleet_sim -- --help
//! ```
//!
//! Each of `--gateways` (300) gateways is its own `Limiter` (configured with
//! `gateways = 300`), all in one process on tokio, sharing one redis-server
//! that the program starts (testkit). Time is real time. The traffic, by
//! default the seed's shape (rl_sims::kit::shape) at 300 gateways:
//!
//! - a few hot subjects (`--hot-rate`, 100,000 a second together): one on a
//!   10,000 a second plan, so it presses its limit; the others on a 100,000
//!   a second plan;
//! - many quiet subjects (`--quiet-rate` over `--quiet-subjects`) on a
//!   10 a second plan;
//! - one abuser in a retry loop (`--abuser-rate`) on that same 10 a second plan;
//! - logins (`--login-rate`), 30 a minute each, fail-closed.
//!
//! Every request goes to one gateway, round robin. Four phases: every
//! request one RL.TAKE (`Client::take`: no leases, no deny cache); the
//! `Limiter` (leases and deny cache); the `Limiter` while the server is
//! slow for a fraction of calls (`CLIENT PAUSE WRITE` for `--pause-ms` every
//! `--pause-every-ms`: calls sent in a pause wait past the timeout, and run
//! once it ends, taking their tokens); the `Limiter` again while the server
//! is killed for `--outage` seconds and restarted. The numbers printed all
//! come from the run: requests and decisions counted by the gateways,
//! Redis calls from the module's counters in the server's `INFO rl`.

mod chart;
mod checks;
mod phases;
mod report;
mod stats;
mod traffic;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rl_gateway::{Bucket, Config, Limiter, LimiterConfig};
use rl_sims::kit::machine;
use rl_sims::kit::shape::Class;
use testkit::Server;

use phases::{run_phase, Disturbance, Mode, AFTER_OUTAGE, BEFORE_OUTAGE};
use traffic::Traffic;

/// A fleet of gateways against one redis-server with the module.
#[derive(Clone, Debug, Parser)]
#[command(name = "fleet_sim")]
pub struct Settings {
    /// Gateways, each its own Limiter.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..))]
    pub gateways: u32,
    /// Length of each steady phase, in seconds.
    #[arg(long, default_value_t = 8.0, value_parser = positive)]
    pub seconds: f64,
    /// Seconds the server is down in the outage phase.
    #[arg(long, default_value_t = 4.0, value_parser = positive)]
    pub outage: f64,
    /// Hot subjects (the first presses its limit).
    #[arg(long, default_value_t = (Class::Pressing.per_300() + Class::Hot.per_300()) as usize, value_parser = count)]
    pub hot_subjects: usize,
    /// Requests a second, all hot subjects together.
    #[arg(long, default_value_t = Class::Pressing.rate_per_300() + Class::Hot.rate_per_300(), value_parser = positive)]
    pub hot_rate: f64,
    /// Quiet subjects.
    #[arg(long, default_value_t = Class::Quiet.per_300() as usize, value_parser = count)]
    pub quiet_subjects: usize,
    /// Requests a second, all quiet subjects together.
    #[arg(long, default_value_t = Class::Quiet.rate_per_300(), value_parser = positive)]
    pub quiet_rate: f64,
    /// Requests a second of the abuser's retry loop.
    #[arg(long, default_value_t = Class::Abuser.rate_per_300(), value_parser = positive)]
    pub abuser_rate: f64,
    /// Subjects of the fail-closed login rule.
    #[arg(long, default_value_t = Class::Login.per_300() as usize, value_parser = count)]
    pub login_subjects: usize,
    /// Login requests a second, all together.
    #[arg(long, default_value_t = Class::Login.rate_per_300(), value_parser = positive)]
    pub login_rate: f64,
    /// The limiter's timeout per Redis call, in ms (default: the Config's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: Option<u64>,
    /// In the slow phase, the server pauses write commands (CLIENT PAUSE)
    /// this long...
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub pause_ms: u64,
    /// ...once every this many ms.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(1..))]
    pub pause_every_ms: u64,
    /// Also write the report (Markdown) to FILE.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

impl Settings {
    pub fn offered_rate(&self) -> f64 {
        self.hot_rate + self.quiet_rate + self.abuser_rate + self.login_rate
    }
}

/// A number above zero.
fn positive(v: &str) -> Result<f64, String> {
    let n: f64 = v.parse().map_err(|e| format!("{e}"))?;
    if n.is_finite() && n > 0.0 {
        Ok(n)
    } else {
        Err("must be above zero".into())
    }
}

/// A count of at least 1.
fn count(v: &str) -> Result<usize, String> {
    match v.parse() {
        Ok(0) => Err("must be at least 1".into()),
        n => n.map_err(|e| format!("{e}")),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let settings = Settings::parse();
    let command = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let started = machine::utc_now();
    let machine = report::machine();
    let mut server = Server::start(&[]);
    let defaults = Config::standalone(server.url());
    let config = LimiterConfig {
        gateways: settings.gateways,
        ..LimiterConfig::new(Config {
            timeout: settings.timeout_ms.map_or(defaults.timeout, Duration::from_millis),
            ..defaults
        })
    };
    let fleet: Vec<Limiter> =
        (0..settings.gateways).map(|_| Limiter::new(config.clone()).expect("a valid config")).collect();
    // Connect every gateway before measuring (RL.PEEK is not counted); the
    // first call also connects, which can take longer than the timeout.
    let warm = Bucket::new("warm-up", 1, 1, Duration::from_secs(1)).expect("a bucket");
    for l in &fleet {
        let deadline = Instant::now() + Duration::from_secs(5);
        while l.client().peek(std::slice::from_ref(&warm), 1).await.is_err() {
            assert!(Instant::now() < deadline, "the server does not answer");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let traffic = Arc::new(Traffic::new(&settings));
    let steady = Duration::from_secs_f64(settings.seconds);
    let outage = Duration::from_secs_f64(settings.outage);
    eprintln!(
        "{} gateways; phases of {:?}; the outage phase {:?}",
        settings.gateways,
        steady,
        BEFORE_OUTAGE + outage + AFTER_OUTAGE
    );
    let mut phases = Vec::new();
    let slow = Disturbance::Slow { pause_ms: settings.pause_ms, every_ms: settings.pause_every_ms };
    for (name, mode, length, disturbance) in [
        ("per-request", Mode::PerRequest, steady, Disturbance::None),
        ("leases", Mode::Limiter, steady, Disturbance::None),
        ("slow", Mode::Limiter, steady, slow),
        ("outage", Mode::Limiter, BEFORE_OUTAGE + outage + AFTER_OUTAGE, Disturbance::Outage(outage)),
    ] {
        eprintln!("phase {name}...");
        phases.push(run_phase(name, &fleet, &traffic, mode, length, &mut server, disturbance).await);
    }
    let header = report::header(&settings, &command, &started, &machine);
    let text = report::report(&settings, &traffic, &phases, &header);
    println!("{text}");
    if let Some(path) = &settings.out {
        std::fs::write(path, format!("# Fleet simulation results\n\nWritten by `tools/sims/src/bin/fleet_sim/`; see the gateway README.\n\n{text}"))
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("written to {}", path.display());
    }
    // The checks are the acceptance test of `make sim`: a broken bound fails it.
    if text.contains(": FAIL") {
        eprintln!("a check FAILED (see the report)");
        std::process::exit(1);
    }
}
