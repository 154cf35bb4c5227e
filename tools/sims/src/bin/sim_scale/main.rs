//! `make sim-scale`: a virtual-time model of gateway fleets from 300 to
//! 30,000 on up to 200 shards, with and without lease relays; the report
//! goes to relay/SIMULATION.md with a chart (relay/sim-scale.svg).
//! What is real and what is modelled: model.rs. The traffic is the seed's
//! shape (rl_sims::kit::shape), as `make sim` runs it.

mod gateway;
mod model;
mod report;
mod traffic;

use std::time::Instant;

use clap::Parser;
use rl_sims::kit::machine::peak_mb;
use rl_sims::kit::rng::Rng;

use model::{run, Outcome, Setup};
use traffic::{Class, Modelled, Population};

#[derive(Parser, Debug)]
struct Args {
    /// Where the report goes (the chart beside it, sim-scale.svg).
    #[arg(long, default_value = "relay/SIMULATION.md")]
    out: String,
    /// Virtual seconds of each run.
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    /// make sim's report, to validate against.
    #[arg(long, default_value = "gateway/SIMULATION.md")]
    validate_against: String,
    /// make bench's report: a shard's server time per call.
    #[arg(long, default_value = "BENCHMARKS.md")]
    benchmarks: String,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

/// Subjects simulated at scale: every subject of a class behaves alike and
/// apart from the others (its own bucket, its own lease state on each
/// gateway and relay), so a sample of each class stands for all of it;
/// per-class rates are then multiplied up to the whole fleet's subjects.
pub const SAMPLE: [u32; 5] = [4, 6, 2000, 2, 100];

/// Gateways per relay when relays are used.
pub const PER_RELAY: u32 = 150;

/// Figures of one run, brought to the whole fleet's traffic.
#[derive(Clone, Debug)]
pub struct Scaled {
    pub gateways: u32,
    pub shards: u32,
    pub relays: bool,
    /// Shard calls per request, each class weighted by its share of the
    /// whole fleet's requests.
    pub calls_per_request: f64,
    pub relay_calls_per_request: f64,
    pub class_calls: Vec<f64>,
    /// Whole-fleet shard calls a second, the mean shard's and the busiest's.
    pub per_shard: f64,
    pub busiest: f64,
    /// Pressing subjects: admitted / allowance, mean and lowest.
    pub pressing: (f64, f64),
    /// Pressing subjects, mean / allowance: what the shards granted, and
    /// what gateways and relays still held when the run ended.
    pub pressing_granted: f64,
    pub pressing_held: f64,
    /// Pressing subjects, mean: admitted in the run's second half / the
    /// refill of that half (the steady rate against the limit's).
    pub pressing_steady: f64,
    /// Within-limit hot subjects: admitted / requests.
    pub hot_admitted: f64,
    pub outcome: Outcome,
}

pub fn scaled(setup: &Setup, sample: &Population, outcome: Outcome, seed: u64) -> Scaled {
    let whole = Population::whole(setup.gateways);
    let share: Vec<f64> = Class::ALL.iter().map(|c| f64::from(whole.count(*c)) * c.rate() / whole.rate()).collect();
    let class_calls: Vec<f64> = Class::ALL
        .iter()
        .map(|c| {
            let i = *c as usize;
            outcome.shard_calls[i] as f64 / outcome.tally[i].requests.max(1) as f64
        })
        .collect();
    let calls_per_request = class_calls.iter().zip(&share).map(|(c, s)| c * s).sum();
    let requests: u64 = outcome.tally.iter().map(|t| t.requests).sum();
    // Each subject's shard calls a second, by class, laid on the shards.
    let per_subject: Vec<f64> = Class::ALL
        .iter()
        .map(|c| outcome.shard_calls[*c as usize] as f64 / setup.seconds / f64::from(sample.count(*c)))
        .collect();
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut load = vec![0.0; setup.shards as usize];
    for c in Class::ALL {
        for _ in 0..whole.count(c) {
            load[rng.below(u64::from(setup.shards)) as usize] += per_subject[c as usize];
        }
    }
    let total: f64 = load.iter().sum();
    let first_pressing = 0;
    let allowance = |p: rl_core::BucketParams| {
        p.capacity() as f64 + p.refill() as f64 * setup.seconds * 1000.0 / p.period_ms() as f64
    };
    let pressing_share = |of: &[u64]| -> Vec<f64> {
        (first_pressing..sample.count(Class::Pressing))
            .map(|s| of[s as usize] as f64 / allowance(Class::Pressing.params()))
            .collect()
    };
    let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let pressing = pressing_share(&outcome.admitted);
    let pressing_granted = mean(pressing_share(&outcome.granted));
    let pressing_held = mean(pressing_share(&outcome.held_at_end));
    let p = Class::Pressing.params();
    let half_refill = p.refill() as f64 * setup.seconds / 2.0 * 1000.0 / p.period_ms() as f64;
    let pressing_steady = mean(
        (first_pressing..sample.count(Class::Pressing))
            .map(|s| outcome.admitted_second_half[s as usize] as f64 / half_refill)
            .collect(),
    );
    let hot = &outcome.tally[Class::Hot as usize];
    Scaled {
        gateways: setup.gateways,
        shards: setup.shards,
        relays: setup.per_relay.is_some(),
        calls_per_request,
        relay_calls_per_request: outcome.relay_calls as f64 / requests.max(1) as f64,
        class_calls,
        per_shard: total / f64::from(setup.shards),
        busiest: load.iter().cloned().fold(0.0, f64::max),
        pressing: (
            pressing.iter().sum::<f64>() / pressing.len().max(1) as f64,
            pressing.iter().cloned().fold(f64::INFINITY, f64::min),
        ),
        pressing_granted,
        pressing_held,
        pressing_steady,
        hot_admitted: hot.admitted as f64 / hot.requests.max(1) as f64,
        outcome,
    }
}

fn main() {
    let args = Args::parse();
    let started = Instant::now();
    let service_us = report::service_us(&args.benchmarks);
    let setup = |gateways: u32, shards: u32, relays: bool| Setup {
        gateways,
        shards,
        per_relay: relays.then_some(PER_RELAY),
        seconds: args.seconds,
        service_ns: (service_us * 1000.0) as u64,
        relay_crash: None,
        failover: None,
        breakers: true,
        seed: args.seed,
    };
    // Validation: make sim's fleet, whole, on one shard, no relay.
    let v = setup(300, 1, false);
    let whole = Population::whole(300);
    let validation = scaled(&v, &whole, run(&v, &whole), args.seed);
    eprintln!("validation done in {:.0?}", started.elapsed());
    // Fleet sizes, with and without relays (one per 150 gateways).
    let sample = Population::new(SAMPLE);
    let mut sweep = Vec::new();
    for gateways in [300u32, 1_000, 3_000, 10_000, 30_000] {
        let shards = (gateways * 200).div_ceil(30_000).max(1);
        for relays in [false, true] {
            let s = setup(gateways, shards, relays);
            sweep.push(scaled(&s, &sample, run(&s, &sample), args.seed));
            let r = sweep.last().expect("pushed");
            eprintln!(
                "{gateways} gateways, relays {relays}: done at {:.0?} (pressing: admitted {:.3}, second half {:.3})",
                started.elapsed(),
                r.pressing.0,
                r.pressing_steady,
            );
        }
    }
    // Failures at 100x with relays: relay 0 dies for 1 s; a shard fails over for 2 s.
    let at = args.seconds / 2.0;
    let crash = Setup { relay_crash: Some((at, 1.0)), ..setup(30_000, 200, true) };
    let crashed = scaled(&crash, &sample, run(&crash, &sample), args.seed);
    // A shard failover at 100x with relays and, for contrast, at today's
    // 300 gateways without; each also with breakers that never open.
    let failover = |fleet: Setup| {
        let guarded = Setup { failover: Some((at, 2.0)), ..fleet };
        let unguarded = Setup { breakers: false, ..guarded.clone() };
        report::Failover {
            guarded: scaled(&guarded, &sample, run(&guarded, &sample), args.seed),
            unguarded: scaled(&unguarded, &sample, run(&unguarded, &sample), args.seed),
        }
    };
    let failovers = [failover(setup(30_000, 200, true)), failover(setup(300, 2, false))];
    eprintln!("failures done at {:.0?}", started.elapsed());
    let text = report::write(&report::Inputs {
        args_seconds: args.seconds,
        service_us,
        validation: &validation,
        make_sim: report::make_sim(&args.validate_against),
        sweep: &sweep,
        crashed: &crashed,
        failovers: &failovers,
        elapsed: started.elapsed(),
        peak_mb: peak_mb(),
        chart: &report::chart_path(&args.out),
    });
    std::fs::write(&args.out, text).unwrap_or_else(|e| panic!("writing {}: {e}", args.out));
    eprintln!("wrote {}", args.out);
}
