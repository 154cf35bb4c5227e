//! `make sim-regions`: three regions, each a real redis-server with the
//! module and its own gateways, the real balancer loop with an injected
//! cross-region delay, in compressed time; the five scenarios of issue 16
//! with their checks, a Markdown report and one SVG chart per scenario.
//!
//! ```text
//! make sim-regions        # builds the module, runs this, writes balancer/SIMULATION.md and its charts
//! cargo run --release -p rl-sims --bin sim_regions -- --help
//! ```

mod charts;
mod checks;
mod gateways;
mod report;
mod rules;
mod scenarios;
mod servers;
mod timing;
mod traffic;

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use rl_sims::kit::machine;

/// Three regions, their gateways and the balancer, in compressed time.
#[derive(Clone, Debug, Parser)]
#[command(name = "sim_regions")]
pub struct Settings {
    /// Gateways per region, each its own Limiter and share table reader.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub gateways_per_region: u32,
    /// The busy customer's requests a second, all regions together (its limit is 1000).
    #[arg(long, default_value_t = 1500.0)]
    pub busy_rate: f64,
    /// Quiet customers.
    #[arg(long, default_value_t = 20)]
    pub quiet_subjects: usize,
    /// Requests a second of each quiet customer in each region.
    #[arg(long, default_value_t = 5.0)]
    pub quiet_each: f64,
    /// Only these scenarios (steady, move, balancer-killed, region-killed, two-balancers).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Write the report (Markdown) to FILE and the charts beside it.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[arg(skip)]
    pub gateways: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut settings = Settings::parse();
    settings.gateways = settings.gateways_per_region as usize;
    let command = format!("sim_regions {}", std::env::args().skip(1).collect::<Vec<_>>().join(" "));
    let t = timing::Timing::compressed();
    let started = Instant::now();
    let load_at_start = machine::load();
    let wanted = |name: &str| settings.only.is_empty() || settings.only.iter().any(|o| o == name);
    let mut outcomes = Vec::new();
    for name in ["steady", "move", "balancer-killed", "region-killed", "two-balancers"] {
        if !wanted(name) {
            continue;
        }
        eprintln!("scenario {name}");
        servers::started().lock().unwrap().clear();
        let mut outcome = match name {
            "steady" => scenarios::steady(&settings, &t).await,
            "move" => scenarios::moves(&settings, &t).await,
            "balancer-killed" => scenarios::balancer_killed(&settings, &t).await,
            "region-killed" => scenarios::region_killed(&settings, &t).await,
            _ => scenarios::two_balancers(&settings, &t).await,
        };
        // How often a raise waited for the gateways' confirmations (the
        // lowered region's gateways had not confirmed within the barrier).
        let (waited, rounds) = servers::started()
            .lock()
            .unwrap()
            .iter()
            .fold((0, 0), |(w, n), s| (w + s.unconfirmed_raises(), n + s.rounds()));
        outcome.figures.push((
            "balancer rounds whose raise waited for the gateways' confirmations (to the next round)".into(),
            format!("{waited} of {rounds}"),
        ));
        outcomes.push(outcome);
    }
    let quiet_refused: u64 = outcomes.iter().map(|o| o.recording.quiet_refused).sum();
    let mut text =
        report::header(&settings, &t, &command, started.elapsed().as_secs_f64(), quiet_refused, &load_at_start);
    for o in &outcomes {
        text.push_str(&report::scenario(o));
        text.push('\n');
    }
    // The checks are the acceptance test of `make sim-regions`.
    let failed: Vec<&str> =
        outcomes.iter().flat_map(|o| o.checks.iter().filter(|c| !c.passed).map(|c| c.name.as_str())).collect();
    text.push_str(&report::footer(&failed, quiet_refused));
    println!("{text}");
    if let Some(out) = &settings.out {
        let dir = out.parent().unwrap_or(std::path::Path::new("."));
        // A failing run never overwrites the report (nor is overwritten):
        // it goes beside it, named by its time, with its charts.
        let (path, charts) = if failed.is_empty() && quiet_refused == 0 {
            (out.clone(), "sim-regions".to_string())
        } else {
            let stamp = machine::stamp();
            let stem = out.file_stem().map_or("report".into(), |s| s.to_string_lossy().into_owned());
            (dir.join(format!("{stem}-failed-{stamp}.md")), format!("sim-regions-failed-{stamp}"))
        };
        for o in &outcomes {
            let svg = dir.join(format!("{charts}-{}.svg", o.name));
            charts::draw(&svg, o.title, &o.recording).unwrap_or_else(|e| panic!("chart {}: {e}", svg.display()));
        }
        let text = text.replace("](sim-regions-", &format!("]({charts}-"));
        let doc = format!("# Three-region simulation results\n\nWritten by `make sim-regions` (`tools/sims/src/bin/sim_regions/`); see [docs/global-limits.md](../docs/global-limits.md#simulation).\n\n{text}");
        std::fs::write(&path, doc).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("written to {}", path.display());
    }
    if !failed.is_empty() || quiet_refused > 0 {
        eprintln!("FAILED: {failed:?}; quiet requests refused: {quiet_refused}");
        std::process::exit(1);
    }
}
