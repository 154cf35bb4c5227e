//! The checks of the report, each with the table it reads from: admitted
//! against the allowance, the outage's bounds, and calls per request.

use std::fmt::Write as _;

use rl_gateway::{Config, LimiterConfig, Policy};
use rl_sims::kit::shape;
use rl_sims::kit::text::{head, pass, thousands};

use crate::phases::{Disturbance, Mode, Phase, Window, BEFORE_OUTAGE};
use crate::stats::SOURCES;
use crate::traffic::{Class, Plans, Traffic};
use crate::Settings;

/// How many subjects a class's row adds up.
fn subjects(settings: &Settings, class: Class) -> f64 {
    match class {
        Class::Quiet => settings.quiet_subjects as f64,
        Class::Login => settings.login_subjects as f64,
        _ => 1.0,
    }
}

/// Most a bucket of `capacity` refilled at `rate` a second admits in `seconds`.
pub fn allowance(policy: &Policy, seconds: f64) -> f64 {
    let r = &policy.rules()[0];
    r.capacity() as f64 + r.refill() as f64 * seconds / r.period().as_secs_f64()
}

/// Per subject, admitted against the allowance in the steady phases, and
/// what decided its requests. Returns the check lines.
pub fn allowance_table(w: &mut String, settings: &Settings, traffic: &Traffic, phases: &[Phase]) -> Vec<String> {
    let plans = Plans::new("report");
    let _ = writeln!(w, "\n### Admitted against what the limit allows, and what decided\n");
    let _ = writeln!(
        w,
        "Allowance = capacity + rate × the phase's length (buckets start full). What Redis and the leases admitted \
         is checked against it (the local fallback answers only when a call fails, and has its own bound: see the \
         outage). Quiet subjects are checked one by one (the row shows the busiest); the logins' allowance is all \
         their subjects' together. The last columns count requests by what decided them: Redis (the request waited \
         for a call), the lease, lease pacing or the deny cache (memory), the fallback.\n"
    );
    head(w, "subject | limit | phase | requests | admitted | by Redis and leases | allowance | by Redis and leases / allowance | Redis | lease | pacing | deny cache | fallback", "lllrrrrrrrrrr");
    let mut never_over = true;
    let mut exact = true;
    let mut fallbacks = 0;
    let mut pressing = None;
    for p in phases.iter().filter(|p| p.disturbance == Disturbance::None) {
        for &(class, _) in &traffic.classes {
            let policy = traffic.policy(&plans, class);
            let limit = &policy.rules()[0];
            let t = p.stats.tallies[traffic.row(class)][Window::Running as usize];
            let by_redis = t.admitted - t.fallback_admitted;
            let (checked, allowed) = match class {
                Class::Quiet => {
                    let busiest = p.stats.quiet_admitted.iter().copied().max().unwrap_or(0);
                    (busiest, allowance(policy, p.seconds))
                }
                Class::Login => (by_redis, allowance(policy, p.seconds) * settings.login_subjects as f64),
                _ => (by_redis, allowance(policy, p.seconds)),
            };
            let within = checked as f64 <= allowed;
            if class == Class::Hot(0) && p.mode == Mode::Limiter {
                pressing = Some(checked as f64 / allowed);
            }
            match p.mode {
                Mode::Limiter => {
                    never_over &= within;
                    fallbacks += t.by_source[3];
                }
                Mode::PerRequest => exact &= within,
            }
            let (checked_text, allowed_text) = if class == Class::Quiet {
                (
                    format!("{} (busiest: {})", thousands(by_redis), thousands(checked)),
                    format!("{} each", thousands(allowed as u64)),
                )
            } else {
                (thousands(checked), thousands(allowed as u64))
            };
            let _ = writeln!(
                w,
                "| {} | {} / {:?} | {} | {} | {} | {checked_text} | {allowed_text} | {:.3} | {} | {} | {} | {} | {} |",
                traffic.label(class),
                thousands(limit.refill()),
                limit.period(),
                p.name,
                thousands(t.requests),
                thousands(t.admitted),
                checked as f64 / allowed,
                thousands(t.by_source[0]),
                thousands(t.by_source[1]),
                thousands(t.by_source[6]),
                thousands(t.by_source[2]),
                thousands(t.by_source[3]),
            );
        }
    }
    let pressing = pressing.unwrap_or(0.0);
    vec![
        format!(
            "the subject pressing its limit gets at least 95% of its allowance with leases: {} ({:.1}%)",
            pass(pressing >= 0.95),
            100.0 * pressing
        ),
        format!("per-request RL.TAKE never admits over the allowance: {}", pass(exact)),
        format!("leases and the deny cache never admit over the allowance: {}", pass(never_over)),
        format!(
            "  (the fallback decided {} requests of the steady leases phase, after failed calls)",
            thousands(fallbacks)
        ),
    ]
}

/// The outage phase by window: before the kill, server down, after the
/// restart; and how soon each gateway went back to Redis. Returns the
/// check lines.
pub fn outage_table(w: &mut String, settings: &Settings, traffic: &Traffic, p: &Phase) -> Vec<String> {
    let plans = Plans::new("report");
    let mut checks = Vec::new();
    let (seconds_down, restarted) = p.down.expect("an outage phase");
    let gateways = settings.gateways as usize;
    let slack = LimiterConfig::new(Config::standalone("")).fallback_slack;
    let _ = writeln!(
        w,
        "\n### Outage: the server killed for {seconds_down:.1} s, then restarted (empty: no persistence)\n"
    );
    let _ = writeln!(
        w,
        "While the server is down a fail-open rule should admit at most max({slack} × capacity, {gateways}) + \
         {slack} × rate × {seconds_down:.1} s fleet-wide (the outage bound: {slack} × (capacity + rate × time), the \
         design's promise, when each gateway's share of the capacity is a token or more; one token per gateway at \
         once when it is less); and traffic within its limit should still get through (the API stays up). The \
         fallback's own bound is what its local buckets hold: per gateway capacity × {slack} / {gateways} tokens, \
         rounded down but one at least, to start with, and {slack} × rate over the fleet. Fail-closed rules should \
         admit nothing. Before the kill, what Redis and the leases admitted against the allowance of a full bucket \
         over {} s. Rows of several subjects add their subjects' bounds; a subject is within its limit when it \
         sends less than its rate.\n",
        BEFORE_OUTAGE.as_secs(),
    );
    head(w, "traffic | rule | window | requests | admitted | outage bound | admitted / bound | admitted / (2 × limit) | admitted by the fallback | fallback's bound | decided by", "lllrrrrrrrl");
    let mut over_bound = Vec::new();
    let mut over_twice = Vec::new();
    let mut over_fallback = Vec::new();
    let mut shut_out = Vec::new();
    let mut before_within = true;
    let mut closed_refused = true;
    for &(class, _) in &traffic.classes {
        let policy = traffic.policy(&plans, class);
        let rule = &policy.rules()[0];
        let fail_closed = class == Class::Login;
        let subjects = subjects(settings, class);
        // A share below one token is one token per gateway.
        let per_gateway = (rule.capacity() as f64 * slack / gateways as f64).floor().max(1.0);
        let refill = rule.refill() as f64 / rule.period().as_secs_f64();
        let fallback_bound = (gateways as f64 * per_gateway + slack * refill * seconds_down) * subjects;
        let offered = traffic.classes[traffic.row(class)].1 / subjects;
        let within_limit = offered < refill;
        for window in [Window::Running, Window::Down, Window::After] {
            let t = p.stats.tallies[traffic.row(class)][window as usize];
            let sources: Vec<String> = SOURCES
                .iter()
                .zip(t.by_source)
                .filter(|(_, n)| *n > 0)
                .map(|(s, n)| format!("{s} {}", thousands(n)))
                .collect();
            let (name, bound, ratio, twice, by_fallback, fallback_text) = match window {
                Window::Running => {
                    let bound = allowance(policy, BEFORE_OUTAGE.as_secs_f64()) * subjects;
                    let by_redis = (t.admitted - t.fallback_admitted) as f64;
                    before_within &= by_redis <= bound;
                    let ratio = format!("{:.3} by Redis and leases", by_redis / bound);
                    let bound = format!("{} (1 × limit)", thousands(bound as u64));
                    ("before the kill", bound, ratio, "-".into(), thousands(t.fallback_admitted), "-".into())
                }
                Window::Down if fail_closed => {
                    closed_refused &= t.admitted == 0;
                    ("server down", "0".into(), "-".into(), "-".into(), thousands(t.fallback_admitted), "0".into())
                }
                Window::Down => {
                    let capacity = rule.capacity() as f64;
                    let bound = ((slack * capacity).max(gateways as f64) + slack * refill * seconds_down) * subjects;
                    if t.admitted as f64 > bound {
                        over_bound.push(format!(
                            "{} {:.2}x the bound",
                            traffic.label(class),
                            t.admitted as f64 / bound
                        ));
                    }
                    let twice = 2.0 * allowance(policy, seconds_down) * subjects;
                    if t.admitted as f64 > twice {
                        over_twice.push(format!(
                            "{} {:.1}x its limit",
                            traffic.label(class),
                            2.0 * t.admitted as f64 / twice
                        ));
                    }
                    if t.fallback_admitted as f64 > fallback_bound {
                        over_fallback.push(format!("{} over", traffic.label(class)));
                    }
                    // Within its limit: at least 90% should pass (the slack covers uneven spreading).
                    if within_limit && (t.admitted as f64) < 0.9 * t.requests as f64 {
                        let share = 100.0 * t.admitted as f64 / t.requests.max(1) as f64;
                        shut_out.push(format!("{} {share:.1}% admitted", traffic.label(class)));
                    }
                    let ratio = format!("{:.3}", t.admitted as f64 / bound);
                    let twice = format!("{:.3}", t.admitted as f64 / twice);
                    let fallback_text = thousands(fallback_bound as u64);
                    (
                        "server down",
                        thousands(bound as u64),
                        ratio,
                        twice,
                        thousands(t.fallback_admitted),
                        fallback_text,
                    )
                }
                _ => (
                    "after the restart",
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    thousands(t.fallback_admitted),
                    "-".into(),
                ),
            };
            let _ = writeln!(
                w,
                "| {} | {} | {name} | {} | {} | {bound} | {ratio} | {twice} | {by_fallback} | {fallback_text} | {} |",
                traffic.label(class),
                if fail_closed { "fail-closed" } else { "fail-open" },
                thousands(t.requests),
                thousands(t.admitted),
                sources.join(", "),
            );
        }
    }
    let mut back: Vec<f64> =
        p.stats.back_on_redis.iter().flatten().map(|t| t.duration_since(restarted).as_secs_f64()).collect();
    back.sort_by(f64::total_cmp);
    let median = back.get(back.len() / 2).copied().unwrap_or(f64::NAN);
    let last = back.last().copied().unwrap_or(f64::NAN);
    let _ = writeln!(
        w,
        "\nBack on Redis decisions after the restart: \
         {} of {gateways} gateways; the median after {median:.2} s, the last after {last:.2} s (a breaker stays open \
         {:?}, then one call probes).",
        back.len(),
        Config::standalone("").breaker_open_for,
    );
    checks.push(format!(
        "before the kill, leases and the deny cache never admit over the allowance: {}",
        pass(before_within)
    ));
    let listed = |v: &[String]| if v.is_empty() { String::new() } else { format!(" ({})", v.join(", ")) };
    checks.push(format!(
        "fail-open rules within max({slack} × capacity, {gateways}) + {slack} × rate × time while the server was down: {}{}",
        pass(over_bound.is_empty()),
        listed(&over_bound)
    ));
    if !over_twice.is_empty() {
        checks.push(format!(
            "  over 2x their limit (shares below one token: one request per gateway at once): {}",
            over_twice.join(", ")
        ));
    }
    checks.push(format!(
        "fail-open rules within the fallback's own bound while the server was down: {}{}",
        pass(over_fallback.is_empty()),
        listed(&over_fallback)
    ));
    checks.push(format!(
        "fail-open traffic within its limit still admitted (90% or more) while the server was down: {}{}",
        pass(shut_out.is_empty()),
        listed(&shut_out)
    ));
    checks.push(format!("fail-closed rule refused every request while the server was down: {}", pass(closed_refused)));
    checks.push(format!(
        "every gateway back on Redis decisions after the restart: {} ({} of {gateways})",
        pass(back.len() == gateways),
        back.len()
    ));
    checks
}

/// Redis calls per request with and without leases, and without the calls
/// the subject pressing its limit waited for.
pub fn calls_summary(w: &mut String, traffic: &Traffic, phases: &[Phase]) {
    let steady = |mode: Mode| phases.iter().find(|p| p.mode == mode && p.disturbance == Disturbance::None);
    if let (Some(plain), Some(leased)) = (steady(Mode::PerRequest), steady(Mode::Limiter)) {
        let per_request = |p: &Phase| p.calls as f64 / p.stats.total().requests.max(1) as f64;
        let (plain_ratio, leased_ratio) = (per_request(plain), per_request(leased));
        let _ = writeln!(
            w,
            "Redis calls per request: {plain_ratio:.3} with one RL.TAKE each, {leased_ratio:.3} with leases and the deny cache ({:.1}x fewer)",
            plain_ratio / leased_ratio
        );
        // The calls the subject pressing its limit waited for, apart: what
        // the ratio would be had those requests been answered from memory
        // (its background top-ups stay in; every request stays counted).
        let pressing = leased.stats.tallies[traffic.row(Class::Hot(0))][Window::Running as usize];
        let request_path: u64 = leased.stats.tallies.iter().map(|row| row[Window::Running as usize].by_source[0]).sum();
        let _ = writeln!(
            w,
            "  with leases: {} calls on the request path, {} in the background (lease top-ups, hand-backs)",
            thousands(request_path),
            thousands(leased.calls.saturating_sub(request_path))
        );
        let _ = writeln!(
            w,
            "  of which {} by {} requests waiting for a call; without those calls: {:.3} per request",
            thousands(pressing.by_source[0]),
            traffic.label(Class::Hot(0)),
            leased.calls.saturating_sub(pressing.by_source[0]) as f64 / leased.stats.total().requests.max(1) as f64
        );
    }
}

/// The chart's file, beside the report.
const CHART: &str = "SIMULATION-calls.svg";

/// Redis calls per request of the leases phase, split by class: the calls
/// requests waited for (counted by the gateways) and the background top-ups
/// (the server's count less those). Returns the check line.
pub fn calls_by_class(w: &mut String, settings: &Settings, traffic: &Traffic, phases: &[Phase]) -> Vec<String> {
    let Some(p) = phases.iter().find(|p| p.mode == Mode::Limiter && p.disturbance == Disturbance::None) else {
        return Vec::new();
    };
    let total = p.stats.total().requests.max(1) as f64;
    let _ = writeln!(w, "\n### Where the leases phase's Redis calls go\n");
    let _ = writeln!(
        w,
        "Calls a request waited for, by class of subject, and the lease top-ups sent in the background (the \
         server's count of calls less those). A quiet subject (2 a second over {} gateways) is seen by a gateway \
         about once every {:.0} s: nothing it learns is still true next time, so each of its requests is one call; \
         that floor is {:.3} calls per request of this traffic mix. Logins are the same.\n",
        settings.gateways,
        settings.gateways as f64 * settings.quiet_subjects as f64 / settings.quiet_rate,
        p.stats.tallies[traffic.row(Class::Quiet)][Window::Running as usize].requests as f64 / total,
    );
    head(w, "class | requests | calls | calls / request of the class | share of all requests' calls", "lrrrr");
    let plans = Plans::new("report");
    let mut rows: Vec<(String, u64, u64)> = Vec::new();
    let mut add = |label: String, t: crate::stats::Tally| match rows.iter_mut().find(|r| r.0 == label) {
        Some(r) => {
            r.1 += t.requests;
            r.2 += t.by_source[0];
        }
        None => rows.push((label, t.requests, t.by_source[0])),
    };
    for &(class, rate) in &traffic.classes {
        let t = p.stats.tallies[traffic.row(class)][Window::Running as usize];
        let rule = &traffic.policy(&plans, class).rules()[0];
        let limit = rule.refill() as f64 / rule.period().as_secs_f64();
        let label = match class {
            Class::Hot(_) if rate > limit => shape::Class::Pressing,
            Class::Hot(_) => shape::Class::Hot,
            Class::Quiet => shape::Class::Quiet,
            Class::Abuser => shape::Class::Abuser,
            Class::Login => shape::Class::Login,
        }
        .row()
        .to_string();
        add(label, t);
    }
    let request_path: u64 = rows.iter().map(|r| r.2).sum();
    rows.push(("background lease top-ups".into(), 0, p.calls.saturating_sub(request_path)));
    for (label, requests, calls) in &rows {
        let per = if *requests > 0 { format!("{:.3}", *calls as f64 / *requests as f64) } else { "-".into() };
        let _ = writeln!(
            w,
            "| {label} | {} | {} | {per} | {:.3} |",
            thousands(*requests),
            thousands(*calls),
            *calls as f64 / total
        );
    }
    if let Some(out) = &settings.out {
        let svg = out.with_file_name(CHART);
        let shares: Vec<(String, f64)> = rows.iter().map(|(l, _, calls)| (l.clone(), *calls as f64 / total)).collect();
        match crate::chart::calls_by_class(&svg, &shares, 0.10) {
            Ok(()) => {
                let _ = writeln!(w, "\n![Redis calls per request by class of subject]({CHART})");
            }
            Err(e) => eprintln!("the chart {}: {e}", svg.display()),
        }
    }
    let ratio = p.calls as f64 / total;
    vec![format!("at most 0.10 Redis calls per request in the leases phase: {} ({ratio:.3})", pass(ratio <= 0.10))]
}

/// The slow phase: every class's admissions (Redis, leases and fallback
/// together) against the partial-failure bound. Returns the check lines.
pub fn slow_table(w: &mut String, settings: &Settings, traffic: &Traffic, p: &Phase) -> Vec<String> {
    let Disturbance::Slow { pause_ms, every_ms } = p.disturbance else { return Vec::new() };
    let plans = Plans::new("report");
    let gateways = settings.gateways as f64;
    let slack = LimiterConfig::new(Config::standalone("")).fallback_slack;
    let _ = writeln!(w, "\n### Slow Redis: write commands paused {pause_ms} ms every {every_ms} ms\n");
    let _ = writeln!(
        w,
        "`CLIENT PAUSE {pause_ms} WRITE` every {every_ms} ms for {:.0} s: a call sent in a pause waits past the \
         timeout and is answered by the fallback, and still runs when the pause ends, taking its tokens. The \
         fallback allows slack − 1 = {} times a gateway's share while the breaker is closed (Redis may admit the \
         whole limit itself), {slack} times once it opens. The bound is the outage's, max({slack} × capacity, \
         {}) + {slack} × rate × time: {slack}× the limit over the episode when a gateway's share is a token or more. \
         {} failed calls, {} breakers opened.\n",
        p.seconds,
        slack - 1.0,
        settings.gateways,
        thousands(p.errors),
        p.breakers_opened,
    );
    head(
        w,
        "traffic | rule | requests | admitted | by the fallback | bound | admitted / bound | admitted / allowance",
        "llrrrrrr",
    );
    let mut over = Vec::new();
    let mut closed_ok = true;
    for &(class, _) in &traffic.classes {
        let policy = traffic.policy(&plans, class);
        let rule = &policy.rules()[0];
        let subjects = subjects(settings, class);
        let t = p.stats.tallies[traffic.row(class)][Window::Running as usize];
        let refill = rule.refill() as f64 / rule.period().as_secs_f64();
        let capacity = rule.capacity() as f64;
        let allowance = allowance(policy, p.seconds) * subjects;
        let fail_closed = class == Class::Login;
        let bound = if fail_closed {
            allowance
        } else {
            ((slack * capacity).max(gateways) + slack * refill * p.seconds) * subjects
        };
        if fail_closed {
            closed_ok &= t.fallback_admitted == 0 && t.admitted as f64 <= allowance;
        } else if t.admitted as f64 > bound {
            over.push(format!("{} {:.2}x", traffic.label(class), t.admitted as f64 / bound));
        }
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {:.3} | {:.3} |",
            traffic.label(class),
            if fail_closed { "fail-closed" } else { "fail-open" },
            thousands(t.requests),
            thousands(t.admitted),
            thousands(t.fallback_admitted),
            thousands(bound as u64),
            t.admitted as f64 / bound,
            t.admitted as f64 / allowance,
        );
    }
    let listed = if over.is_empty() { String::new() } else { format!(" ({})", over.join(", ")) };
    vec![
        format!(
            "slow Redis: fail-open rules within max({slack} × capacity, {}) + {slack} × rate × time: {}{listed}",
            settings.gateways,
            pass(over.is_empty())
        ),
        format!(
            "slow Redis: the fail-closed rule never admitted by the fallback nor over its allowance: {}",
            pass(closed_ok)
        ),
    ]
}
