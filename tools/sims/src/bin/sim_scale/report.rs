//! The report: tables next to make sim's measured numbers, and the chart.

use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;
use rl_sims::kit::chart;
use rl_sims::kit::text::{self, head, pass};

use crate::gateway::{OPEN_FOR_MS, SLACK, TRIP_AFTER};
use crate::traffic::{Class, Modelled};
use crate::{Scaled, PER_RELAY, SAMPLE};

/// A shard's CPU per call from make bench: RL.TAKE on 100,000 subjects with
/// a replica and AOF (networking, propagation and AOF included), the dearest
/// of the calls the fleet makes.
pub fn service_us(benchmarks: &str) -> f64 {
    let text = std::fs::read_to_string(benchmarks).unwrap_or_else(|e| panic!("reading {benchmarks}: {e}"));
    let row = text
        .lines()
        .find(|l| l.starts_with("| RL.TAKE, 1 bucket, 100k subjects |"))
        .unwrap_or_else(|| panic!("{benchmarks} has no 'RL.TAKE, 1 bucket, 100k subjects' row"));
    let cell = row.split('|').nth(6).expect("the CPU µs/op, replica + AOF column");
    number(cell).unwrap_or_else(|| panic!("{benchmarks}: no number in '{cell}'"))
}

/// The first number of a table cell ("3.28 (3.20–3.60)", "1,732").
fn number(cell: &str) -> Option<f64> {
    cell.split_whitespace().next()?.replace(',', "").parse().ok()
}

/// make sim's leases phase, as measured on a real server.
#[derive(Debug, Default)]
pub struct MakeSim {
    pub calls_per_request: Option<f64>,
    /// Calls a request waited for, per request, by class (ALL's order).
    pub class_calls: Vec<Option<f64>>,
    pub pressing: Option<f64>,
    pub hot_admitted: Option<f64>,
}

pub fn make_sim(path: &str) -> MakeSim {
    let Ok(text) = std::fs::read_to_string(path) else { return MakeSim::default() };
    let cells = |prefix: &str| -> Option<Vec<String>> {
        let line = text.lines().find(|l| l.starts_with(prefix))?;
        Some(line.split('|').map(|c| c.trim().to_string()).collect())
    };
    let at = |prefix: &str, i: usize| cells(prefix).and_then(|c| c.get(i).and_then(|c| number(c)));
    let class_rows = Class::ALL.map(|c| format!("| {} |", c.row()));
    let hot = cells("| hot-1 | 100,000 / 1s | leases |");
    MakeSim {
        calls_per_request: at("| leases |", 7),
        class_calls: class_rows.iter().map(|r| at(r, 4)).collect(),
        pressing: at("| hot-0 | 10,000 / 1s | leases |", 8),
        hot_admitted: hot.and_then(|c| Some(number(&c[5])? / number(&c[4])?)),
    }
}

/// A shard failover, and the same run with breakers that never open.
pub struct Failover {
    pub guarded: Scaled,
    pub unguarded: Scaled,
}

pub struct Inputs<'a> {
    pub args_seconds: f64,
    pub service_us: f64,
    pub validation: &'a Scaled,
    pub make_sim: MakeSim,
    pub sweep: &'a [Scaled],
    pub crashed: &'a Scaled,
    pub failovers: &'a [Failover],
    pub elapsed: Duration,
    /// The process's peak resident memory (MB), where the OS tells it.
    pub peak_mb: Option<f64>,
    pub chart: &'a str,
}

pub fn chart_path(out: &str) -> String {
    Path::new(out).with_file_name("sim-scale.svg").to_string_lossy().into_owned()
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

/// Rounded, with thousands.
fn thousands(v: f64) -> String {
    text::thousands(v.round() as u64)
}

pub fn write(i: &Inputs) -> String {
    let capacity = 1e6 / i.service_us;
    let at_scale = i.sweep.iter().find(|s| s.gateways == 30_000 && s.relays);
    let breakers = |relays: bool| {
        let run = i.sweep.iter().find(|s| s.gateways == 30_000 && s.relays == relays);
        thousands(run.map_or(0, |s| s.outcome.breakers) as f64)
    };
    let mut w = String::new();
    let _ = writeln!(w, "# Scale model: 300 to 30,000 gateways, with and without lease relays\n");
    let _ = writeln!(
        w,
        "Written by `make sim-scale` (`cargo run --release -p rl-sims --bin sim_scale`) in {:.0} s of this machine{}; {} virtual seconds a run. See relay/README.md.\n",
        i.elapsed.as_secs_f64(),
        i.peak_mb.map_or(String::new(), |mb| format!(" and {mb:.0} MB at most")),
        i.args_seconds
    );
    let _ = writeln!(
        w,
        "**Real code**: each gateway's decisions are the code rl-client's `Limiter` runs: rl-core's lease \
         (`rl_core::lease`: batch sizing by the share of rate / gateways, top-up at half, one lease call in flight \
         per subject, pacing of contended buckets by what was granted) and refusal (`rl_core::deny`: kept until \
         Redis's retry time, quiet subjects at least their share of the refill), driven in the limiter's order \
         (tools/sims/src/bin/sim_scale/gateway.rs); each gateway's calls to each shard go through that shard's circuit \
         breaker, rl-client's `Breaker` (the client's defaults: open at {TRIP_AFTER} failures in a row or half of \
         a window's calls, for {OPEN_FOR_MS} ms, then one probe), made when the gateway first calls the shard \
         ({breakers_direct} breakers in the 30,000-gateway run without relays, {breakers_made} with them, \
         {breaker_bytes} bytes each); a request whose call failed, or whose \
         breaker refused the call, is decided as rl-client's fallback decides it: a local bucket per gateway at \
         `rl_core::fallback::share` of the rule, `slack - 1` times the share while the breaker is closed and \
         `slack` ({SLACK}) times once it is open, the difference added once, after the subject's refusal; the \
         login rule is fail-closed, as in make sim, and refuses instead. Each \
         relay's are `rl_relay::pool::Pools`, the relay's own, on the \
         same rl-core lease with a share of rate / relays. Each shard runs rl-core's `acquire` (the module's \
         algorithm) on its virtual clock.\n\
         **Modelled**: the network (each hop 0.1-0.25 ms one way: a round trip of 0.2-0.5 ms), a shard's time per \
         call ({:.2} µs: make bench's CPU per RL.TAKE on 100,000 subjects with a replica and AOF, so a shard's \
         capacity is about {} calls a second; pipelined at 16 there, so a real shard serving one call per packet \
         has less), calls served one at a time in arrival order, Poisson arrivals spread evenly over the gateways, \
         no cost at the relay, a failed call seen at the client's 50 ms timeout (through a relay at the relay \
         connection's 25 ms). **Not modelled**: the limiter's locks and its async calls: each decision here is \
         taken whole at one virtual instant, as the limiter takes each under its subject's lock, and a call in \
         flight is an event that answers after its latency, as an awaited call does; what is left out is the \
         time spent waiting for a lock, which make bench measures (lock waits) and which does not change what \
         is decided. Nor the gateway's breaker for its relay: a shard's failure through a relay counts against \
         the shard's breaker only, and a dead relay's gateways call the shards at once (a refused connection).\n",
        i.service_us,
        thousands(capacity),
        breakers_direct = breakers(false),
        breakers_made = breakers(true),
        breaker_bytes = std::mem::size_of::<rl_gateway::internal::Breaker>()
    );
    let _ = writeln!(
        w,
        "Traffic: make sim's shape per 300 gateways (one subject pressing a 10,000/s plan and three on 100,000/s \
         plans, 25,000 requests a second each; 5,000 quiet subjects at 2 a second on 10/s; an abuser at 10,000 a \
         second on 10/s; 100 login subjects at 2 a second on 30/min), with N / 300 times as many subjects of each \
         class at N gateways: more customers, not bigger ones. At 300 gateways every subject is simulated; above, \
         a sample of each class ({} pressing, {} hot, {} quiet, {} abusers, {} login subjects; every subject of a \
         class behaves alike and apart from the others), its calls per request weighted by the class's share of \
         the whole fleet's requests, and its calls per subject laid on the shards for every subject of the fleet \
         (by hash, as slots are). Relays: one per {PER_RELAY} gateways.\n",
        SAMPLE[0], SAMPLE[1], SAMPLE[2], SAMPLE[3], SAMPLE[4]
    );

    let v = i.validation;
    let m = &i.make_sim;
    let _ = writeln!(w, "## Validation: 300 gateways, one shard, against make sim\n");
    let _ = writeln!(
        w,
        "make sim's numbers are its leases phase on a real server with 300 real `Limiter`s (gateway/SIMULATION.md); \
         its class rows count the calls requests waited for, the model's class rows include the background top-ups \
         (make sim counts those apart: 0.004 calls per request).\n"
    );
    head(&mut w, "measure | make sim (real server) | model", "lrr");
    let _ = writeln!(w, "| Redis calls per request | {} | {:.3} |", opt(m.calls_per_request), v.calls_per_request);
    for c in Class::ALL {
        let _ = writeln!(
            w,
            "| calls per request: {} | {} | {:.3} |",
            c.name(),
            opt(m.class_calls.get(c as usize).copied().flatten()),
            v.class_calls[c as usize]
        );
    }
    let _ = writeln!(w, "| pressing subject: admitted / allowance | {} | {:.3} |", opt(m.pressing), v.pressing.0);
    let _ = writeln!(
        w,
        "| hot subjects within their limit: admitted / requests | {} | {:.3} |\n",
        opt(m.hot_admitted),
        v.hot_admitted
    );

    let _ = writeln!(w, "## Fleet sizes\n");
    let _ = writeln!(w, "![Redis calls per request against fleet size](sim-scale.svg)\n");
    head(&mut w, "gateways | shards | relays | Redis calls / request | relay calls / request | shard calls/s (mean) | busiest shard calls/s | busiest / capacity | pressing: admitted / allowance (mean, lowest) | pressing: granted by Redis, held at the end | pressing, second half: admitted / refill | hot within limit: admitted", "rrlrrrrrllrr");
    for s in i.sweep {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.3} | {:.3} | {} | {} | {:.1}% | {:.3}, {:.3} | {:.3}, {:.3} | {:.3} | {:.3} |",
            thousands(f64::from(s.gateways)),
            s.shards,
            if s.relays { format!("{}", s.gateways.div_ceil(PER_RELAY)) } else { "none".into() },
            s.calls_per_request,
            s.relay_calls_per_request,
            thousands(s.per_shard),
            thousands(s.busiest),
            100.0 * s.busiest / capacity,
            s.pressing.0,
            s.pressing.1,
            s.pressing_granted,
            s.pressing_held,
            s.pressing_steady,
            s.hot_admitted
        );
    }
    let _ = writeln!(
        w,
        "\nPressing subjects through relays: Redis granted nearly all of the allowance; what was not admitted was \
         held when the run ended (admitted + held = granted: no lease expired unspent). Tokens flow through two \
         tiers, each holding up to about two batches of its share while the bucket is contended (a relay's and, \
         once gateways lease, each gateway's), so the admitted count trails the allowance by what is in the pipe, \
         once: a fixed offset, not a lower rate, which a longer run dilutes. The \
         second half of each run shows the rate: admitted about the whole refill (above 1 by tokens held at \
         half-time and spent after it; never above the allowance over the run, checked below). Lowering it means smaller relay \
         batches, that is more shard calls. Pacing by what was granted (as gateways pace) rather than by a \
         whole batch raised the 30,000-gateway figure from 0.89 to 0.93. With two relays (300 gateways), a \
         relay's ask of two batches is a subject's whole capacity, short whenever the other relay holds tokens: \
         the relay paces a subject within its limit now and then (its admitted share in the last column)."
    );
    let _ = writeln!(w, "\nCalls per request by class (Redis calls, top-ups included):\n");
    let columns: Vec<&str> = ["gateways", "relays"].into_iter().chain(Class::ALL.map(|c| c.name())).collect();
    head(&mut w, &columns.join(" | "), "rlrrrrr");
    for s in i.sweep {
        let _ = write!(w, "| {} | {} |", thousands(f64::from(s.gateways)), if s.relays { "yes" } else { "no" });
        for c in &s.class_calls {
            let _ = write!(w, " {c:.3} |");
        }
        let _ = writeln!(w);
    }

    let base = at_scale;
    let _ = writeln!(w, "\n## Failures\n");
    if let Some(base) = base {
        let extra = |s: &Scaled| {
            let calls: u64 = s.outcome.shard_calls.iter().sum();
            let before: u64 = base.outcome.shard_calls.iter().sum();
            calls as f64 - before as f64
        };
        let lost_per_subject = i.crashed.outcome.crash_lost as f64 / f64::from(SAMPLE.iter().sum::<u32>());
        let _ = writeln!(
            w,
            "- **A relay crash** (relay 0 of 200 killed at {:.0} s, back empty 1 s later; its 150 gateways call the \
             shards directly meanwhile, as `Config::relay` does): it held {} tokens of the {} sampled \
             subjects ({:.1} per subject), lost with it: under-admission, once. Pressing subjects admitted {:.3} of \
             their allowance (mean; {:.3} without the crash). Shard calls: {:+.0} over the run against the same run \
             without the crash (sampled subjects).",
            i.args_seconds / 2.0,
            i.crashed.outcome.crash_lost,
            SAMPLE.iter().sum::<u32>(),
            lost_per_subject,
            i.crashed.pressing.0,
            base.pressing.0,
            extra(i.crashed)
        );
        for f in i.failovers {
            failover(&mut w, f, i.args_seconds);
        }
    }

    let _ = writeln!(w, "\n## Checks\n\n```text");
    let one_x = i.validation.calls_per_request;
    if let Some(s) = base {
        let _ = writeln!(
            w,
            "calls per request at 30,000 gateways with relays no worse than 300 gateways today: {} ({:.3} vs {:.3})",
            pass(s.calls_per_request <= one_x),
            s.calls_per_request,
            one_x
        );
        let _ = writeln!(
            w,
            "no shard above half its capacity with relays: {} (busiest {:.1}%)",
            pass(s.busiest < capacity / 2.0),
            100.0 * s.busiest / capacity
        );
    }
    let over = i.sweep.iter().chain([i.validation, i.crashed]).any(|s| s.pressing.0 > 1.0 + 1e-9);
    let _ = writeln!(w, "no run admitted a pressing subject over its allowance: {}", pass(!over));
    for f in i.failovers {
        let bounds = bounds(&f.guarded);
        let within = !bounds.is_empty() && bounds.iter().all(|b| b.admitted as f64 <= b.bound);
        let shown: Vec<String> =
            bounds.iter().map(|b| format!("{} of {}", thousands(b.admitted as f64), thousands(b.bound))).collect();
        let _ = writeln!(
            w,
            "a failover at {} gateways: its pressing subject within the fallback's outage bound: {} ({})",
            thousands(f64::from(f.guarded.gateways)),
            pass(within),
            shown.join(", ")
        );
    }
    let _ = writeln!(w, "```");
    if let Err(e) = chart(i.chart, i.sweep, one_x) {
        let _ = writeln!(w, "\n(the chart could not be drawn: {e})");
    }
    w
}

/// A failover's paragraph: its calls, its fallback, its outage bound.
fn failover(w: &mut String, f: &Failover, seconds: f64) {
    let (failed, u) = (&f.guarded, &f.unguarded.outcome);
    let relays = if failed.relays { "with relays" } else { "without relays" };
    let f = &failed.outcome;
    let sum = |t: fn(&crate::model::Tally) -> u64, o: &crate::model::Outcome| o.tally.iter().map(t).sum::<u64>();
    let fallback = sum(|t| t.fallback, f);
    let fallback_admitted = sum(|t| t.fallback_admitted, f);
    let requests = sum(|t| t.requests, f);
    let _ = writeln!(
            w,
            "- **A shard failover at {} gateways {relays}** (the shard of a pressing subject answers nothing for 2 s \
             at {:.0} s; each call then waits the client's timeout): {} calls failed ({} with breakers that never open, the same run \
             otherwise: {:.1} calls per gateway over the outage, where a breaker opens at {TRIP_AFTER} failures in \
             a row or half of 20 in a second); the open breakers sent {} checks to the fallback without a call (or \
             dropped their top-ups). {} requests of {} ({:.2}%) were \
             decided by the gateways' fallback: {} admitted, {} refused ({} and {} with breakers that never open). \
             Pressing subjects admitted by Redis, leases and relays {:.3} of their allowance (mean; lowest {:.3}, \
             the one on the failed shard).",
            thousands(f64::from(failed.gateways)),
            seconds / 2.0,
            thousands(f.failed_calls as f64),
            thousands(u.failed_calls as f64),
            u.failed_calls as f64 / f64::from(failed.gateways),
            thousands(f.avoided as f64),
            thousands(fallback as f64),
            thousands(requests as f64),
            100.0 * fallback as f64 / requests.max(1) as f64,
            thousands(fallback_admitted as f64),
            thousands((fallback - fallback_admitted) as f64),
            thousands(sum(|t| t.fallback_admitted, u) as f64),
            thousands((sum(|t| t.fallback, u) - sum(|t| t.fallback_admitted, u)) as f64),
            failed.pressing.0,
            failed.pressing.1
        );
    let bounds = bounds(failed);
    let Some(first) = bounds.first() else { return };
    let admitted: Vec<String> = bounds
        .iter()
        .map(|b| {
            format!(
                "{} ({:.2} times its rate over that time)",
                thousands(b.admitted as f64),
                b.admitted as f64 / b.rate
            )
        })
        .collect();
    let _ = writeln!(
        w,
        "- **The outage bound** (gateway/README.md: fleet-wide at most `max(slack x capacity, gateways) + slack x \
         refill x elapsed / period`, about {SLACK}x the limit when a gateway's share is a token or more): the \
         pressing subjects on the failed shard were admitted, by every path, from {:.1} s to {:.1} s (until the last \
         breaker can have closed): {}, against a rate of {} and a bound of {}. {}",
        first.from_s,
        first.to_s,
        admitted.join(", "),
        thousands(first.rate),
        thousands(first.bound),
        share_note(failed.gateways),
    );
}

/// Which term of the bound governs a pressing subject's fallback.
fn share_note(gateways: u32) -> String {
    let p = Class::Pressing.params();
    let share = format!("{} x {SLACK} / {}", p.capacity(), thousands(f64::from(gateways)));
    if rl_core::fallback::below_one_token(&p, SLACK, gateways) {
        format!(
            "Its share, {share}, is below one token, so each gateway's fallback holds one: the `gateways` term, \
             not {SLACK}x the limit, bounds it."
        )
    } else {
        format!("Its share, {share}, is a token or more: the bound is {SLACK}x what the rule admits, and a burst.")
    }
}

/// A pressing subject on the failed shard, over the failover's episode.
struct Bound {
    admitted: u64,
    /// The limit's refill over the episode, and the documented bound.
    rate: f64,
    bound: f64,
    from_s: f64,
    to_s: f64,
}

/// The outage bound for each pressing subject on the failed shard.
fn bounds(failed: &Scaled) -> Vec<Bound> {
    let o = &failed.outcome;
    let p = Class::Pressing.params();
    let elapsed_ms = (o.episode.1.saturating_sub(o.episode.0) / 1_000_000) as f64;
    let rate = p.refill() as f64 * elapsed_ms / p.period_ms() as f64;
    let burst = (SLACK * p.capacity() as f64).max(f64::from(failed.gateways));
    o.on_failed_shard
        .iter()
        .filter(|&&s| s < SAMPLE[Class::Pressing as usize])
        .map(|&s| Bound {
            admitted: o.episode_admitted[s as usize],
            rate,
            bound: burst + SLACK * rate,
            from_s: o.episode.0 as f64 / 1e9,
            to_s: o.episode.1 as f64 / 1e9,
        })
        .collect()
}

/// Redis calls per request against fleet size, with and without relays.
fn chart(path: &str, sweep: &[Scaled], today: f64) -> Result<(), Box<dyn std::error::Error>> {
    let root = chart::canvas(Path::new(path), (720, 420))?;
    let top = sweep.iter().map(|s| s.calls_per_request).fold(today, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption("Redis calls per request against fleet size", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((250f64..40_000f64).log_scale(), 0f64..top)?;
    chart.configure_mesh().x_desc("gateways (log scale)").y_desc("Redis calls per request").draw()?;
    for (relays, color, label) in [(false, RED, "gateways lease alone"), (true, BLUE, "a relay per 150 gateways")] {
        let points: Vec<(f64, f64)> =
            sweep.iter().filter(|s| s.relays == relays).map(|s| (f64::from(s.gateways), s.calls_per_request)).collect();
        chart::line(&mut chart, points.clone(), color.stroke_width(2), label)?;
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    chart::level(&mut chart, (250.0, 40_000.0), today, BLACK.mix(0.4), "300 gateways today (model)")?;
    chart::legend(&mut chart, SeriesLabelPosition::MiddleRight)?;
    root.present()?;
    Ok(())
}
