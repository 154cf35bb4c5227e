//! The Markdown report: the setup, then per scenario its story, chart,
//! events, figures and checks.

use std::fmt::Write;

use rl_sims::kit::machine::{cores, load, utc_now};
use rl_sims::kit::text::{head, pass, row};

use crate::rules::{BURST, FLOOR, RATE};
use crate::scenarios::Outcome;
use crate::timing::Timing;
use crate::Settings;

/// `load_at_start`: [`load`] read before the first scenario.
pub fn header(
    s: &Settings,
    t: &Timing,
    command: &str,
    seconds: f64,
    quiet_refused: u64,
    load_at_start: &str,
) -> String {
    let (date, cores) = (utc_now(), cores());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Run `{command}`, finished {date}, {cores} cores (load average {load_at_start} at the start, {} at the end), {seconds:.0} s in all.\n",
        load()
    );
    let _ = writeln!(
        out,
        "Three regions (eu, us, ap), each a real redis-server with the module on loopback (testkit) and its own {} gateways: a real rl-client `Limiter` under `LiveRules` with the global rule, its shares from `RegionShares` (the region's table read every {:?}, usage reported in the same round trip). The balancer is the real loop (`rl_balancer::Balancer::run`), {:.0}-{:.0} ms injected before every one of its calls to a region. The rule: `api`, {RATE} a second with a burst of {BURST} per subject, global over the three regions, floor {FLOOR} (5% each), equal weights. Traffic per scenario below; {} quiet customers ask {} a second each in every region throughout (never limited: {quiet_refused} quiet requests refused in all).\n",
        s.gateways, t.gateway_refresh, t.delay.0.as_millis(), t.delay.1.as_millis(), s.quiet_subjects, s.quiet_each
    );
    let _ = writeln!(out, "The gateways' `Limiter`s run with `lease_window` {:?} (batches of one token: every request is an exact `RL.TAKE`; the deny cache as configured, `gateways` = {}), so the figures measure the shares, not the leases' known under-admission of a subject pressing its limit (gateway/SIMULATION.md).\n", crate::gateways::LEASE_WINDOW, s.gateways);
    let _ = writeln!(out, "The gateway side reports every request it checked per subject, admitted or refused (`RegionalShares::demanded`): the balancer splits by demand. Reporting only what was admitted settled at about 94% of the limit in an earlier run (a region with spare share keeps it, and a region short of share never shows the traffic that would earn it more).\n");
    let _ = writeln!(out, "Time is compressed ten times, the design's ratios kept:\n");
    head(&mut out, " | design | here", "lll");
    for (what, design, here) in [
        ("balancer interval", "10 s", t.interval),
        ("gateways' table refresh", "1 s", t.gateway_refresh),
        ("gateways' read timeout (the barrier, refresh + timeout: the longest a raise waits for the gateways' confirmations in one round)", "1 s", t.gateway_timeout),
        ("stale_after (fixed split after)", "5 min", t.stale_after),
        ("settle (longer than one round's writes spread: 2 calls and the barrier, each call carrying the uncompressed delay)", "10 s", t.settle),
        ("balancer's call timeout", "2 s", t.timeout),
        ("grace for an unreachable region", "60 s", t.grace),
    ] {
        let _ = writeln!(out, "| {what} | {design} | {here:?} |");
    }
    let _ = writeln!(out, "| cross-region delay | 70-150 ms | 70-150 ms (not compressed: the balancer's rounds take a larger part of the interval here) |\n");
    let _ = writeln!(out, "**The bound the design guarantees:** over any window of length W, the busy customer is admitted at most burst + rate x W in all regions together ({BURST} + {RATE} x W): the shares in effect never sum above 1 (lower everywhere, then raise only once every gateway of the lowered regions confirms, in its region's Redis, that it enforces the lowered table; fencing epochs; stale fallback lowering first), and a raised share's capacity ramps at the refill rate. The recording counts answers at the gateway, so every window is widened by the longest request measured. Every check below fails `make sim-regions` when broken.\n");
    out
}

/// The verdict, at the end of the report as well as in the checks.
pub fn footer(failed: &[&str], quiet_refused: u64) -> String {
    let verdict = if failed.is_empty() && quiet_refused == 0 {
        "every check passed".to_string()
    } else {
        format!("FAILED: {}; quiet requests refused: {quiet_refused}", failed.join("; "))
    };
    format!("Verdict: {verdict}.\n")
}

pub fn scenario(o: &Outcome) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## {}\n\n{}\n\n![{}](sim-regions-{}.svg)\n", o.title, o.story, o.title, o.name);
    head(&mut out, "at | event", "ll");
    for (at, what) in &o.recording.events {
        let _ = writeln!(out, "| {at:.1} s | {what} |");
    }
    out.push('\n');
    head(&mut out, "figure | measured", "ll");
    for (what, v) in &o.figures {
        let _ = writeln!(out, "| {what} | {v} |");
    }
    let r = &o.recording;
    let seconds = r.busy_asked.len() as f64 * crate::traffic::BUCKET.as_secs_f64();
    let asked: u64 = r.busy_asked.iter().flatten().sum();
    let quiet: u64 = r.quiet_admitted.iter().flatten().sum();
    let _ = writeln!(out, "| busy customer asked, per second on average | {:.0} |", asked as f64 / seconds);
    let _ = writeln!(out, "| quiet customers admitted / refused | {quiet} / {} |", r.quiet_refused);
    let [redis, deny, fallback, closed] = r.refused_by;
    let _ = writeln!(out, "| busy customer refused by Redis / deny cache / outage fallback / fail-closed | {redis} / {deny} / {fallback} / {closed} |");
    let _ = writeln!(out, "| errors (no answer from the gateway) | {} |", r.errors);
    out.push('\n');
    head(&mut out, "check | result | measured", "lll");
    for c in &o.checks {
        row(&mut out, &[c.name.as_str(), pass(c.passed), c.detail.as_str()]);
    }
    out
}
