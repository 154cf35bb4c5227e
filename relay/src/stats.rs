//! What the relay reports: `INFO relay` (RESP) and the same numbers as
//! Prometheus metrics (`--metrics`).

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use crate::server::Relay;

/// Subjects listed one by one: the busiest.
const LISTED: usize = 20;

struct Subject {
    name: String,
    batch: u64,
    tokens: u64,
    hits: u64,
    calls: u64,
}

fn subjects(relay: &Relay) -> (usize, Vec<Subject>) {
    let pools = relay.pools();
    let mut all: Vec<Subject> = pools
        .iter()
        .map(|(keys, pool)| Subject {
            name: keys.iter().map(|k| String::from_utf8_lossy(k)).collect::<Vec<_>>().join(","),
            batch: pool.batch,
            tokens: pool.tokens(),
            hits: pool.hits,
            calls: pool.calls,
        })
        .collect();
    let total = all.len();
    all.sort_by_key(|s| std::cmp::Reverse(s.hits + s.calls));
    all.truncate(LISTED);
    (total, all)
}

fn hit_ratio(hits: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        hits as f64 / total as f64
    }
}

/// `INFO relay`: relay-wide counters, then the busiest subjects.
pub fn info(relay: &Relay) -> String {
    let c = &relay.counters;
    let requests = c.requests.load(Relaxed);
    let from_memory = c.from_memory.load(Relaxed);
    let settings = relay.pools().settings();
    let (total, busiest) = subjects(relay);
    let mut out = String::from("# relay\r\n");
    let _ = write!(
        out,
        "relays:{}\r\nlease_window_ms:{}\r\nlease_ttl_ms:{}\r\nrequests:{requests}\r\nfrom_memory:{from_memory}\r\n\
         hit_ratio:{:.4}\r\nupstream_leases:{}\r\nforwarded:{}\r\nupstream_failures:{}\r\nsubjects:{total}\r\n",
        settings.relays,
        settings.window_ms,
        settings.ttl_ms,
        hit_ratio(from_memory, requests),
        c.upstream_leases.load(Relaxed),
        c.forwarded.load(Relaxed),
        c.upstream_failures.load(Relaxed),
    );
    for s in busiest {
        let _ = write!(
            out,
            "subject:{}=batch={},tokens={},from_memory={},upstream_leases={},hit_ratio={:.4}\r\n",
            s.name,
            s.batch,
            s.tokens,
            s.hits,
            s.calls,
            hit_ratio(s.hits, s.hits + s.calls)
        );
    }
    out
}

/// The same as Prometheus text (version 0.0.4).
pub fn metrics(relay: &Relay) -> String {
    let c = &relay.counters;
    let mut out = String::new();
    for (name, help, value) in [
        ("rl_relay_requests_total", "RL.TAKE and RL.LEASE calls received", &c.requests),
        ("rl_relay_from_memory_total", "calls answered from the relay's leases", &c.from_memory),
        ("rl_relay_upstream_leases_total", "RL.LEASE calls sent to Redis", &c.upstream_leases),
        ("rl_relay_forwarded_total", "commands forwarded to Redis as they came", &c.forwarded),
        ("rl_relay_upstream_failures_total", "calls to Redis that failed", &c.upstream_failures),
    ] {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n", value.load(Relaxed));
    }
    let (_, busiest) = subjects(relay);
    out.push_str("# HELP rl_relay_subject_batch tokens a lease call asks Redis for, by subject (the busiest)\n");
    out.push_str("# TYPE rl_relay_subject_batch gauge\n");
    for s in &busiest {
        let _ = writeln!(out, "rl_relay_subject_batch{{subject=\"{}\"}} {}", label(&s.name), s.batch);
    }
    out.push_str("# HELP rl_relay_subject_hit_ratio share of a subject's calls answered from memory\n");
    out.push_str("# TYPE rl_relay_subject_hit_ratio gauge\n");
    for s in &busiest {
        let _ = writeln!(
            out,
            "rl_relay_subject_hit_ratio{{subject=\"{}\"}} {:.4}",
            label(&s.name),
            hit_ratio(s.hits, s.hits + s.calls)
        );
    }
    out
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
