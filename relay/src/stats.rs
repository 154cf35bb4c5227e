//! What the relay reports: `INFO relay` (RESP) and the same numbers as
//! Prometheus text (`--metrics`), from the counters and the pools, whatever
//! front moved them.
//!
//! Subjects are named by their keys with the hash tag (`{...}`, where an API
//! key or an address goes) replaced by `#` and a keyed hash of it, unless
//! `--show-subjects` asks for the names as they are: labels and INFO lines
//! reach dashboards and logs that should not hold customers' keys. The hash
//! key is random per process, so the hash cannot be reversed by trying
//! likely keys (addresses are few); a subject keeps its name for the
//! process's life.

use std::collections::hash_map::RandomState;
use std::collections::BinaryHeap;
use std::fmt::Write;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;
use rl_client::prometheus_label as label;

use crate::pool::Pools;

/// Subjects listed one by one: the busiest.
const LISTED: usize = 20;

/// Relay-wide counters (per-subject ones live in the pools).
#[derive(Debug, Default)]
pub struct Counters {
    /// RL.TAKE and RL.LEASE calls received.
    pub requests: AtomicU64,
    /// Of those, answered from memory (paid or refused).
    pub from_memory: AtomicU64,
    /// RL.LEASE calls sent to Redis (a request waiting, or a top-up).
    pub upstream_leases: AtomicU64,
    /// Commands forwarded as they came.
    pub forwarded: AtomicU64,
    /// Calls to Redis that failed (timeout, connection).
    pub upstream_failures: AtomicU64,
    /// Commands refused by name: not on the allow-list.
    pub refused_commands: AtomicU64,
    /// RESP commands refused for naming a key under --rls-prefix.
    pub refused_keys: AtomicU64,
    /// Connections closed on a protocol error.
    pub protocol_errors: AtomicU64,
    /// AUTH or HELLO AUTH with a wrong user or password.
    pub auth_failures: AtomicU64,
    /// Connections closed for not authenticating within --auth-timeout-ms.
    pub auth_timeouts: AtomicU64,
    /// Failed authentications answered late (slowed, or waiting their turn).
    pub auth_delayed: AtomicU64,
    /// Connections closed after too many failed authentications.
    pub auth_closed: AtomicU64,
    /// Connections refused at --max-clients.
    pub rejected_clients: AtomicU64,
    /// RESP front over TLS: handshakes that failed or did not complete in
    /// time (with a client CA: a client without a certificate it signed).
    pub tls_handshake_failures: AtomicU64,
    /// RESP front over TLS: plaintext clients told to use TLS and closed.
    pub tls_plaintext_refused: AtomicU64,
    /// RESP front over TLS: changed certificate files refused (the ones in
    /// force kept).
    pub tls_reload_errors: AtomicU64,
    /// Connections now (a gauge).
    pub connected_clients: AtomicU64,
    /// --metrics connections dropped while still sending their request,
    /// for a newer one.
    pub http_dropped: AtomicU64,
    /// --metrics connections closed for a request (or an answer) too slow.
    pub http_timeouts: AtomicU64,
}

/// How subjects are named in reports.
#[derive(Debug)]
pub struct SubjectNames {
    show: bool,
    key: RandomState,
}

impl SubjectNames {
    /// Names as they are with `show`, else with their hash tags hashed.
    pub fn new(show: bool) -> SubjectNames {
        SubjectNames { show, key: RandomState::new() }
    }

    /// A subject's keys, comma-separated, each shown or with its tag hashed.
    pub fn name(&self, keys: &[Bytes]) -> String {
        let mut out = String::new();
        for (i, key) in keys.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if self.show {
                out.push_str(&String::from_utf8_lossy(key));
                continue;
            }
            // Redis's hash tag: the first `{`, then the first `}` after it,
            // with something between.
            let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
                let close = key[open + 1..].iter().position(|&b| b == b'}')?;
                (close > 0).then_some((open, open + 1 + close))
            });
            match tag {
                Some((open, close)) => {
                    out.push_str(&String::from_utf8_lossy(&key[..open]));
                    let _ = write!(out, "#{:016x}", self.key.hash_one(&key[open + 1..close]));
                    out.push_str(&String::from_utf8_lossy(&key[close + 1..]));
                }
                None => {
                    let _ = write!(out, "#{:016x}", self.key.hash_one(&key[..]));
                }
            }
        }
        out
    }
}

/// Everything a report reads, taken under the pools' lock.
pub struct View<'a> {
    pub counters: &'a Counters,
    pub pools: &'a Pools,
    pub names: &'a SubjectNames,
    /// Redis answers the readiness probe.
    pub ready: bool,
    /// Redis answers it without the module.
    pub module_missing: bool,
    /// What carries the module's commands out: module, lua, or auto
    /// (not decided yet).
    pub backend: &'static str,
    pub max_clients: usize,
}

struct Subject {
    name: String,
    batch: u64,
    tokens: u64,
    hits: u64,
    calls: u64,
    refused: u64,
}

impl View<'_> {
    /// The busiest subjects, named.
    fn busiest(&self) -> Vec<Subject> {
        self.top(|pool| pool.hits + pool.calls)
    }

    /// The most refused subjects (none refused: none listed), named.
    fn most_refused(&self) -> Vec<Subject> {
        self.top(|pool| pool.refused).into_iter().filter(|s| s.refused > 0).collect()
    }

    /// The `LISTED` subjects with the most `of`: one pass over the table,
    /// names made for the listed ones only.
    fn top(&self, of: impl Fn(&crate::pool::Pool) -> u64) -> Vec<Subject> {
        let mut top: BinaryHeap<std::cmp::Reverse<(u64, usize)>> = BinaryHeap::with_capacity(LISTED + 1);
        for (index, (_, pool)) in self.pools.iter().enumerate() {
            top.push(std::cmp::Reverse((of(pool), index)));
            if top.len() > LISTED {
                top.pop();
            }
        }
        let mut listed: Vec<(u64, usize)> = top.into_iter().map(|std::cmp::Reverse(e)| e).collect();
        listed.sort_by(|a, b| b.cmp(a));
        listed
            .into_iter()
            .filter_map(|(_, index)| {
                let (keys, pool) = self.pools.get_index(index)?;
                Some(Subject {
                    name: self.names.name(keys),
                    batch: pool.batch,
                    tokens: pool.tokens(),
                    hits: pool.hits,
                    calls: pool.calls,
                    refused: pool.refused,
                })
            })
            .collect()
    }
}

fn hit_ratio(hits: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        hits as f64 / total as f64
    }
}

/// A name in an INFO line: no byte a reader splits fields on (`,` and `=`
/// are percent-encoded, as are `%`, spaces and control bytes).
fn info_text(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            ',' | '=' | '%' | ' ' => {
                let _ = write!(out, "%{:02X}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "%{:02X}", c as u32 & 0xff);
            }
            c => out.push(c),
        }
    }
    out
}

/// `INFO relay`: relay-wide counters, then the busiest subjects, one line
/// each with its own field name (`subject_0`, `subject_1`, ...).
pub fn info(view: &View) -> String {
    let c = view.counters;
    let requests = c.requests.load(Relaxed);
    let from_memory = c.from_memory.load(Relaxed);
    let settings = view.pools.settings();
    let mut out = String::from("# relay\r\n");
    let _ = write!(
        out,
        "ready:{}\r\nredis_backend:{}\r\nrelays:{}\r\nlease_window_ms:{}\r\nlease_ttl_ms:{}\r\nrequests:{requests}\r\n\
         from_memory:{from_memory}\r\nhit_ratio:{:.4}\r\nupstream_leases:{}\r\nforwarded:{}\r\n\
         upstream_failures:{}\r\nrefused_commands:{}\r\nrefused_keys:{}\r\nprotocol_errors:{}\r\n\
         auth_failures:{}\r\nauth_timeouts:{}\r\nauth_delayed:{}\r\nauth_closed:{}\r\n\
         connected_clients:{}\r\nmax_clients:{}\r\nrejected_clients:{}\r\nsubjects:{}\r\nmax_subjects:{}\r\n\
         evicted_subjects:{}\r\nmax_refusal_hold_ms:{}\r\ntls_handshake_failures:{}\r\n\
         tls_plaintext_refused:{}\r\ntls_reload_errors:{}\r\n",
        u8::from(view.ready),
        view.backend,
        settings.relays,
        settings.window_ms,
        settings.ttl_ms,
        hit_ratio(from_memory, requests),
        c.upstream_leases.load(Relaxed),
        c.forwarded.load(Relaxed),
        c.upstream_failures.load(Relaxed),
        c.refused_commands.load(Relaxed),
        c.refused_keys.load(Relaxed),
        c.protocol_errors.load(Relaxed),
        c.auth_failures.load(Relaxed),
        c.auth_timeouts.load(Relaxed),
        c.auth_delayed.load(Relaxed),
        c.auth_closed.load(Relaxed),
        c.connected_clients.load(Relaxed),
        view.max_clients,
        c.rejected_clients.load(Relaxed),
        view.pools.len(),
        settings.max_subjects,
        view.pools.evictions(),
        settings.max_hold_ms,
        c.tls_handshake_failures.load(Relaxed),
        c.tls_plaintext_refused.load(Relaxed),
        c.tls_reload_errors.load(Relaxed),
    );
    for (i, s) in view.busiest().iter().enumerate() {
        let _ = write!(
            out,
            "subject_{i}:name={},batch={},tokens={},from_memory={},upstream_leases={},hit_ratio={:.4}\r\n",
            info_text(&s.name),
            s.batch,
            s.tokens,
            s.hits,
            s.calls,
            hit_ratio(s.hits, s.hits + s.calls)
        );
    }
    for (i, s) in view.most_refused().iter().enumerate() {
        let _ = write!(out, "refused_{i}:name={},refused={}\r\n", info_text(&s.name), s.refused);
    }
    out
}

/// One family: HELP, TYPE, then its samples, together.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: impl IntoIterator<Item = (String, String)>) {
    rl_client::prometheus_family(out, name, kind, help);
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// The same as Prometheus text (version 0.0.4), one family at a time.
pub fn metrics(view: &View) -> String {
    let c = view.counters;
    let mut out = String::new();
    for (name, help, value) in [
        ("rl_relay_requests_total", "RL.TAKE and RL.LEASE calls received", &c.requests),
        ("rl_relay_from_memory_total", "calls answered from the relay's leases", &c.from_memory),
        ("rl_relay_upstream_leases_total", "RL.LEASE calls sent to Redis", &c.upstream_leases),
        ("rl_relay_forwarded_total", "commands forwarded to Redis as they came", &c.forwarded),
        ("rl_relay_upstream_failures_total", "calls to Redis that failed", &c.upstream_failures),
        ("rl_relay_refused_commands_total", "commands refused by name (not on the allow-list)", &c.refused_commands),
        ("rl_relay_refused_keys_total", "RESP commands refused for naming a key under --rls-prefix", &c.refused_keys),
        ("rl_relay_protocol_errors_total", "connections closed on a protocol error", &c.protocol_errors),
        ("rl_relay_auth_failures_total", "AUTH attempts with a wrong user or password", &c.auth_failures),
        ("rl_relay_auth_timeouts_total", "connections closed unauthenticated at --auth-timeout-ms", &c.auth_timeouts),
        ("rl_relay_auth_delayed_total", "failed AUTH attempts answered late (slowed)", &c.auth_delayed),
        ("rl_relay_auth_closed_total", "connections closed after too many failed AUTH attempts", &c.auth_closed),
        ("rl_relay_rejected_clients_total", "connections refused at --max-clients", &c.rejected_clients),
        (
            "rl_relay_tls_handshake_failures_total",
            "RESP front TLS handshakes that failed or timed out (with --resp-tls-client-ca: a client without a \
             certificate the CA signed)",
            &c.tls_handshake_failures,
        ),
        (
            "rl_relay_tls_plaintext_refused_total",
            "plaintext clients refused by the RESP front over TLS (told to use rediss://)",
            &c.tls_plaintext_refused,
        ),
        (
            "rl_relay_tls_reload_errors_total",
            "changed --resp-tls-* files refused (the certificates in force kept)",
            &c.tls_reload_errors,
        ),
        (
            "rl_relay_http_dropped_total",
            "--metrics connections dropped still sending their request, for a newer one (all 16 taken, or 4 from one \
             address)",
            &c.http_dropped,
        ),
        (
            "rl_relay_http_timeouts_total",
            "--metrics connections closed: no whole request within 2 s of the accept, or the answer not taken within 2 s",
            &c.http_timeouts,
        ),
    ] {
        family(&mut out, name, "counter", help, [(String::new(), value.load(Relaxed).to_string())]);
    }
    let evictions = view.pools.evictions().to_string();
    family(
        &mut out,
        "rl_relay_subject_evictions_total",
        "counter",
        "pools dropped to make room for new subjects",
        [(String::new(), evictions)],
    );
    for (name, help, value) in [
        ("rl_relay_ready", "1 while Redis answers the relay's probe, else 0", u64::from(view.ready)),
        (
            "rl_relay_module_missing",
            "1 while Redis answers the probe without the redis-rl module: not ready",
            u64::from(view.module_missing),
        ),
        ("rl_relay_connected_clients", "client connections now", c.connected_clients.load(Relaxed)),
        ("rl_relay_max_clients", "most client connections at once", view.max_clients as u64),
        ("rl_relay_subjects", "subjects held in the table", view.pools.len() as u64),
        ("rl_relay_max_subjects", "most subjects the table holds", view.pools.settings().max_subjects as u64),
    ] {
        family(&mut out, name, "gauge", help, [(String::new(), value.to_string())]);
    }
    family(
        &mut out,
        "rl_relay_redis_backend",
        "gauge",
        "1 for what carries the module's commands out on Redis: the module, or the Lua scripts (auto: not decided yet)",
        ["module", "lua", "auto"].map(|b| (format!("{{backend=\"{b}\"}}"), u8::from(view.backend == b).to_string())),
    );
    let busiest = view.busiest();
    let labelled = |value: &dyn Fn(&Subject) -> String| -> Vec<(String, String)> {
        busiest.iter().map(|s| (format!("{{subject=\"{}\"}}", label(&s.name)), value(s))).collect()
    };
    family(
        &mut out,
        "rl_relay_subject_batch",
        "gauge",
        "tokens a lease call asks Redis for, by subject (the busiest)",
        labelled(&|s| s.batch.to_string()),
    );
    family(
        &mut out,
        "rl_relay_subject_hit_ratio",
        "gauge",
        "share of a subject's calls answered from memory (the busiest)",
        labelled(&|s| format!("{:.4}", hit_ratio(s.hits, s.hits + s.calls))),
    );
    let refused: Vec<(String, String)> = view
        .most_refused()
        .iter()
        .map(|s| (format!("{{subject=\"{}\"}}", label(&s.name)), s.refused.to_string()))
        .collect();
    family(
        &mut out,
        "rl_relay_subject_refused_total",
        "counter",
        "requests refused, by subject (the most refused; a subject's count restarts if its pool is dropped)",
        refused,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags_are_hashed_unless_shown() {
        let names = SubjectNames::new(false);
        let keys = [Bytes::from_static(b"rl:{api-key-1}:per_second"), Bytes::from_static(b"plain-key")];
        let name = names.name(&keys);
        assert!(!name.contains("api-key") && !name.contains("plain-key"), "{name}");
        let (first, second) = name.split_once(',').unwrap();
        assert!(first.starts_with("rl:#") && first.ends_with(":per_second") && first.len() == 31, "{first}");
        assert!(second.starts_with('#') && second.len() == 17, "{second}");
        assert_eq!(names.name(&keys), name, "stable within the process");
        assert_ne!(names.name(&[Bytes::from_static(b"rl:{api-key-2}:per_second")]), first);
        // `{}` is no tag: the whole key is hashed.
        assert!(names.name(&[Bytes::from_static(b"a{}b")]).starts_with('#'));
        let shown = SubjectNames::new(true);
        assert_eq!(shown.name(&keys), "rl:{api-key-1}:per_second,plain-key");
    }

    #[test]
    fn info_names_carry_no_separator() {
        assert_eq!(info_text("rl:{a,b=c}:s %\r\n"), "rl:{a%2Cb%3Dc}:s%20%25%0D%0A");
    }
}
