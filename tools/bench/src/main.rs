//! `make bench`: the module's commands side by side with INCR, the seed
//! design's Lua token bucket, a Stripe-style Lua in-flight limiter and
//! redis-cell, in two conditions (a bare server; a primary with AOF on and
//! a replica attached), in interleaved rounds; then memory per key kind on
//! every server of the matrix. Writes BENCHMARKS.md.
//!
//! The figure to trust on a small shared machine is the server's own time
//! per call (`usec` of INFO commandstats); every target is a ratio of two
//! figures measured in the same round of the same run.
//!
//! Options (env): RL_SERVER (server binary for the timings), RL_SERVERS
//! (space-separated binaries for the sizing table; default RL_SERVER),
//! REDIS_CELL_SO / REDIS_CELL_SRC (see cell.rs), BENCH_N (operations per
//! run, default 60000), BENCH_ROUNDS (default 5), BENCH_OUT (report path,
//! default BENCHMARKS.md). `rl-bench sizing` measures memory alone and
//! replaces that section of the report. `rl-bench tls` measures the cost
//! of TLS to Redis instead (tls.rs).

mod cell;
mod load;
mod report;
mod servers;
mod sizing;
mod tls;
mod workloads;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use load::{Measured, Op};
use servers::{Condition, Module, Setup};
use workloads::{On, Shas, Workload};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("sizing") => return sizing_only(),
        Some("tls") => return tls::main(),
        _ => {}
    }
    let ops = env_num("BENCH_N", 60_000);
    let rounds = env_num("BENCH_ROUNDS", 5) as usize;
    let out_path = std::env::var("BENCH_OUT").unwrap_or_else(|_| "BENCHMARKS.md".into());
    let started = Instant::now();
    let load_before = report::load_average();
    let cell = cell::locate();
    if let Err(e) = &cell {
        eprintln!("redis-cell not measured: {e}");
    }

    // One module setup and one redis-cell setup per condition.
    let setups: Vec<(Setup, Option<Setup>)> = Condition::ALL
        .iter()
        .map(|&c| {
            let ours = Setup::start(&Module::Ours, c);
            let theirs = cell.as_ref().ok().map(|cell| Setup::start(&Module::Other(cell.so.clone()), c));
            (ours, theirs)
        })
        .collect();
    let mut con = setups[0].0.con();
    let text: String = redis::cmd("INFO").arg("server").query(&mut con).expect("INFO");
    let version = load::field(&text, "redis_version").unwrap_or("?").trim().to_string();
    let shas = Shas {
        bucket: script_load(&setups, workloads::BUCKET_LUA),
        acquire: script_load(&setups, workloads::ACQUIRE_LUA),
        release: script_load(&setups, workloads::RELEASE_LUA),
    };
    let all: Vec<Workload> = workloads::all(&shas).into_iter().filter(|w| w.on == On::Module || cell.is_ok()).collect();

    // Interleaved: round by round, each condition, each workload, so that a
    // slow minute of the machine touches every figure alike.
    let mut results: HashMap<(usize, &'static str), Vec<Measured>> = HashMap::new();
    for round in 0..rounds {
        for (c, (ours, theirs)) in setups.iter().enumerate() {
            for w in &all {
                let setup = if w.on == On::Module { ours } else { theirs.as_ref().expect("redis-cell setup") };
                let m = measure(setup, w, ops);
                eprintln!(
                    "round {} {:<14} {:<48} {:>6.2} us/op {:>6.2} cpu us/op {:>9.0} op/s",
                    round + 1,
                    setup.condition.label(),
                    w.name,
                    m.usec,
                    m.cpu,
                    m.ops_per_sec
                );
                results.entry((c, w.id)).or_default().push(m);
            }
        }
    }
    drop(setups);

    let sizes = sizing::measure(&sizing_binaries(), cell.as_ref().ok().map(|c| c.so.as_path()));
    let load_after = report::load_average();

    let run = report::Run {
        version,
        redis_cell: cell.as_ref().map(|c| c.version.clone()).map_err(Clone::clone),
        load_before,
        load_after,
        ops,
        rounds,
        minutes: started.elapsed().as_secs_f64() / 60.0,
    };
    let text = report::render(&run, &all, &results, &sizes);
    std::fs::write(&out_path, &text).expect("write the report");
    println!("{text}");
    eprintln!("written to {out_path}");
}

fn sizing_binaries() -> Vec<PathBuf> {
    match std::env::var("RL_SERVERS") {
        Ok(list) => list.split_whitespace().map(PathBuf::from).collect(),
        Err(_) => vec![testkit::server_binary()],
    }
}

/// `rl-bench sizing` (`make bench-sizing`): memory per key alone, its
/// section of the report replaced, the timings kept.
fn sizing_only() {
    let out_path = std::env::var("BENCH_OUT").unwrap_or_else(|_| "BENCHMARKS.md".into());
    let cell = cell::locate().ok();
    let sizes = sizing::measure(&sizing_binaries(), cell.as_ref().map(|c| c.so.as_path()));
    let report = std::fs::read_to_string(&out_path).unwrap_or_default();
    std::fs::write(&out_path, report::replace_sizing(&report, &sizes)).expect("write the report");
    eprintln!("memory section written to {out_path}");
}

/// Loads a script on every module server; its digest is the same on all.
fn script_load(setups: &[(Setup, Option<Setup>)], script: &str) -> String {
    let shas: Vec<String> = setups
        .iter()
        .map(|(ours, _)| redis::cmd("SCRIPT").arg("LOAD").arg(script).query(&mut ours.con()).expect("SCRIPT LOAD"))
        .collect();
    shas[0].clone()
}

/// One timed run of `w` on a fresh keyspace.
fn measure(setup: &Setup, w: &Workload, ops: u64) -> Measured {
    let mut con = setup.con();
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(&mut con).expect("FLUSHALL");
    for line in &w.setup {
        let words: Vec<&str> = line.split_whitespace().collect();
        let _: redis::Value = redis::cmd(words[0]).arg(&words[1..]).query(&mut con).expect(line);
    }
    let op = Op { commands: &w.commands, spread: w.spread, first: w.first };
    if w.spread {
        // Most subjects' keys exist before timing: mostly updates, not creations.
        load::run(setup.port(), &op, &w.stats, load::SPREAD, &mut con);
    }
    setup.settle(&mut con);
    load::run(setup.port(), &op, &w.stats, ops, &mut con)
}
