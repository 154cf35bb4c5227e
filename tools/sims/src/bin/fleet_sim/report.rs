//! The report: its header, the Markdown tables and the check lines.

use std::fmt::Write as _;

use rl_sims::kit::machine;
use rl_sims::kit::text::{head, per_second, thousands};

use crate::checks::{allowance_table, calls_by_class, calls_summary, outage_table, slow_table};
use crate::phases::{Mode, Phase, AFTER_OUTAGE, BEFORE_OUTAGE};
use crate::traffic::Traffic;
use crate::Settings;

/// The report: Markdown tables, then the PASS/FAIL lines of the checks.
pub fn report(settings: &Settings, traffic: &Traffic, phases: &[Phase], header: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{header}");
    calls_table(&mut out, settings, phases);
    let mut checks = calls_by_class(&mut out, settings, traffic, phases);
    checks.extend(allowance_table(&mut out, settings, traffic, phases));
    if let Some(p) = phases.iter().find(|p| matches!(p.disturbance, crate::phases::Disturbance::Slow { .. })) {
        checks.extend(slow_table(&mut out, settings, traffic, p));
    }
    if let Some(p) = phases.iter().find(|p| p.down.is_some()) {
        checks.extend(outage_table(&mut out, settings, traffic, p));
    }
    let _ = writeln!(out, "\n### Checks\n\n```text");
    calls_summary(&mut out, traffic, phases);
    for line in checks {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out, "```");
    out
}

/// The phases side by side: requests, Redis calls, latency.
pub fn calls_table(w: &mut String, settings: &Settings, phases: &[Phase]) {
    let _ = writeln!(w, "### Redis calls per request\n");
    head(w, "phase | decisions by | offered req/s | sent req/s | requests | Redis calls | calls / request | decided in memory | failed calls | breakers opened | p50 | p99", "llrrrrrrrrrr");
    for p in phases {
        let t = p.stats.total();
        let by = match p.mode {
            Mode::PerRequest => "one RL.TAKE each",
            Mode::Limiter => "Limiter (leases, deny cache)",
        };
        let failed = if p.mode == Mode::PerRequest { t.by_source[5] } else { p.errors };
        let _ = writeln!(
            w,
            "| {} | {by} | {} | {} | {} | {} | {:.3} | {:.1}% | {} | {} | {:.1} µs | {:.1} µs |",
            p.name,
            thousands(settings.offered_rate() as u64),
            per_second(t.requests, p.seconds),
            thousands(t.requests),
            thousands(p.calls),
            p.calls as f64 / t.requests.max(1) as f64,
            100.0 * t.decided_in_memory() as f64 / t.requests.max(1) as f64,
            thousands(failed),
            p.breakers_opened,
            p.stats.latencies.quantile(0.5),
            p.stats.latencies.quantile(0.99),
        );
    }
    let behind: Vec<String> = phases.iter().map(|p| format!("{} {}", p.name, thousands(p.stats.behind))).collect();
    let _ = writeln!(
        w,
        "\nRequests that fell due but were not sent before their phase ended (the machine could not keep up): {}.",
        behind.join(", ")
    );
}

/// The machine and its load as the run starts.
pub fn machine() -> String {
    format!("{} cores ({}), load average {} at the start", machine::cores(), machine::cpu(), machine::load())
}

pub fn server_version() -> String {
    let out = std::process::Command::new(testkit::server_binary()).arg("--version").output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown server".into())
}

/// The report's header: when, where, the command, and the fleet and traffic.
pub fn header(settings: &Settings, command: &str, started: &str, machine: &str) -> String {
    format!(
        "## Fleet simulation\n\n{started}; {machine}; {}; module from this tree (release build).\n\n\
         Command: `make sim` (`cargo run --release -p rl-sims --bin fleet_sim --{}{command}`).\n\n\
         {} gateways (each a `Limiter` with `gateways = {}`, timeout {} ms, other settings default) in one process, \
         one server. Offered: {} hot subjects at {} req/s together (hot-0 on a 10,000/s plan, the others on 100,000/s), \
         {} quiet subjects at {} req/s together (10/s plan), an abuser at {} req/s (10/s plan), logins at {} req/s \
         (30/min, fail-closed). Phases of {} s; the outage phase runs {} s before the kill and {} s after the restart.\n",
        server_version(),
        if command.is_empty() { "" } else { " " },
        settings.gateways,
        settings.gateways,
        settings.timeout_ms.map_or_else(|| format!("{} (the default)", rl_gateway::Config::standalone("").timeout.as_millis()), |t| t.to_string()),
        settings.hot_subjects,
        thousands(settings.hot_rate as u64),
        thousands(settings.quiet_subjects as u64),
        thousands(settings.quiet_rate as u64),
        thousands(settings.abuser_rate as u64),
        thousands(settings.login_rate as u64),
        settings.seconds,
        BEFORE_OUTAGE.as_secs(),
        AFTER_OUTAGE.as_secs(),
    )
}
