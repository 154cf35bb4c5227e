//! The RLS front's statistics, under envoyproxy/ratelimit's names as its
//! Prometheus mapping exports them, so its dashboards and alerts keep
//! working: `ratelimit_service_rate_limit_{total_hits,over_limit,
//! near_limit,within_limit,shadow_mode}{domain,key1[,key2]}` (the stats
//! key `domain.key1.key2...` split on its dots, deeper levels folded into
//! their parent, as its statsd mapping does), the config loads, the errors
//! by type, requests and response times by method; and ours, named
//! `rl_relay_rls_*`. Stats keys are sanitised as envoyproxy/ratelimit does
//! (`:` and `|` become `_`, and the dots of an IPv4 address).
//!
//! The series are bounded: at most [`MAX_SERIES`] stats keys (and as many
//! domains not found); past it a new one is dropped and counted
//! (`rl_relay_rls_series_dropped_total`), since `detailed_metric` and
//! `value_to_metric` put request values in the keys. They are kept by
//! their whole stats key, folded into labels when shown, so that statsd
//! (`statsd.rs`, a second output of these same counts) sends the names
//! upstream sends.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use rl_client::prometheus_label as label;

use super::decide::DecisionCounters;

pub const MAX_SERIES: usize = 10_000;

/// envoyproxy/ratelimit's NEAR_LIMIT_RATIO default.
const NEAR_LIMIT_RATIO: f64 = 0.8;

/// Response time buckets, in seconds.
const BUCKETS: [f64; 13] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Series {
    pub total_hits: u64,
    pub over_limit: u64,
    pub near_limit: u64,
    pub within_limit: u64,
    pub shadow_mode: u64,
}

type Labels = (String, String, Option<String>);

#[derive(Debug, Default)]
pub struct Stats {
    /// By sanitised stats key.
    series: Mutex<HashMap<String, Series>>,
    /// Descriptors of an unknown domain, by sanitised domain.
    not_found: Mutex<HashMap<String, u64>>,
    dropped: AtomicU64,
    pub config_load_success: AtomicU64,
    pub config_load_error: AtomicU64,
    pub redis_error: AtomicU64,
    pub service_error: AtomicU64,
    pub requests: AtomicU64,
    pub global_shadow_mode: AtomicU64,
    pub domain_not_found: AtomicU64,
    pub unmatched: AtomicU64,
    pub timeouts: AtomicU64,
    pub negative_hits: AtomicU64,
    /// Connections open on the RLS front (at most `--max-clients`).
    pub connections: AtomicU64,
    /// Connections closed for sending no HTTP/2 preface in time.
    pub handshake_timeouts: AtomicU64,
    /// Connections closed at --auth-timeout-ms without a complete call
    /// (carrying the token, when one is set).
    pub auth_timeouts: AtomicU64,
    /// Calls ended for a body not whole within --auth-timeout-ms.
    pub body_timeouts: AtomicU64,
    /// Token-less connections kept for health checks only.
    pub health_connections: AtomicU64,
    /// Connections refused for a client certificate not valid for
    /// --rls-tls-client-san.
    pub san_refused: AtomicU64,
    /// TLS handshakes that failed, and certificate reloads refused.
    pub tls_handshake_failures: AtomicU64,
    pub tls_reload_errors: AtomicU64,
    /// Over xDS: 1 while the stream is open; versions applied, refused.
    pub xds_connected: AtomicU64,
    pub xds_versions_applied: AtomicU64,
    pub xds_nacks: AtomicU64,
    response_times: Mutex<[u64; BUCKETS.len() + 1]>,
    response_time_sum_ns: AtomicU64,
    /// NEAR_LIMIT_RATIO as configured (None: its default).
    pub near_limit_ratio: Option<f64>,
    /// USE_STATSD: where these counts are sent too.
    pub statsd: Option<std::sync::Arc<dyn Sink>>,
}

/// A second output of these counts (statsd.rs's, for USE_STATSD): told each
/// response time as it comes (a timer), and counting what it could not send.
/// The counters themselves it reads from [`Stats`] when it flushes.
pub trait Sink: Send + Sync + std::fmt::Debug {
    fn response_time(&self, took: Duration);
    /// Lines not sent: the queue to its socket full, or the send failed.
    fn dropped(&self) -> u64;
}

/// `:` and `|` as `_`, and the dots of every IPv4-shaped run
/// (envoyproxy/ratelimit's `SanitizeStatName`). Borrowed when nothing is
/// replaced, as for most keys: a hit then allocates nothing. Digits, dots,
/// `:` and `|` are ASCII, so the bytes are scanned (a byte of a multi-byte
/// character is never one of them).
pub fn sanitize(key: &str) -> Cow<'_, str> {
    let bytes = key.as_bytes();
    let mut replaced: Vec<usize> =
        bytes.iter().enumerate().filter(|(_, &b)| b == b':' || b == b'|').map(|(i, _)| i).collect();
    let mut i = 0;
    while i < bytes.len() {
        match ipv4_at(bytes, i) {
            Some((dots, end)) => {
                replaced.extend(dots);
                i = end;
            }
            None => i += 1,
        }
    }
    if replaced.is_empty() {
        return Cow::Borrowed(key);
    }
    let mut out = bytes.to_vec();
    for at in replaced {
        out[at] = b'_';
    }
    // ASCII bytes replaced by an ASCII byte: still UTF-8.
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// The dots of an IPv4-shaped run starting at `at` (four runs of 1-3
/// digits joined by dots), and where it ends.
fn ipv4_at(bytes: &[u8], mut at: usize) -> Option<([usize; 3], usize)> {
    let digits =
        |at: usize| bytes.get(at..).map_or(0, |rest| rest.iter().take(3).take_while(|c| c.is_ascii_digit()).count());
    let mut dots = [0; 3];
    for dot in &mut dots {
        let n = digits(at);
        if n == 0 || bytes.get(at + n) != Some(&b'.') {
            return None;
        }
        *dot = at + n;
        at += n + 1;
    }
    let n = digits(at);
    (n > 0).then_some((dots, at + n))
}

/// The labels of a stats key: its first three levels.
fn labels(stats_key: &str) -> Labels {
    let clean = sanitize(stats_key);
    let mut parts = clean.splitn(4, '.');
    let domain = parts.next().unwrap_or_default().to_string();
    let key1 = parts.next().unwrap_or_default().to_string();
    let key2 = parts.next().map(str::to_string);
    (domain, key1, key2)
}

impl Stats {
    /// A decided limit: `cost` asked of a limit of `limit` that has
    /// `remaining` left after it (when admitted; None: not known, the limit
    /// was not asked, so never near).
    pub fn record(&self, stats_key: &str, limit: u64, cost: u64, remaining: Option<u64>, over: bool, shadow: bool) {
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let full = series.len() >= MAX_SERIES;
        let clean = sanitize(stats_key);
        // A known key (nearly every hit): one lookup, no allocation.
        let s = match series.get_mut(clean.as_ref()) {
            Some(s) => s,
            None if full => {
                self.dropped.fetch_add(1, Relaxed);
                return;
            }
            None => series.entry(clean.into_owned()).or_default(),
        };
        s.total_hits += cost;
        if over {
            s.over_limit += cost;
            if shadow {
                s.shadow_mode += cost;
            }
            return;
        }
        s.within_limit += cost;
        let Some(remaining) = remaining else { return };
        let near = (limit as f64 * self.near_limit_ratio.unwrap_or(NEAR_LIMIT_RATIO)).floor() as u64;
        let after = limit.saturating_sub(remaining);
        let before = after.saturating_sub(cost);
        if after > near {
            s.near_limit += if before >= near { cost } else { after - near };
        }
    }

    /// The series of a stats key's labels (deeper levels folded), for tests.
    pub fn series(&self, stats_key: &str) -> Series {
        let wanted = labels(stats_key);
        self.by_labels().into_iter().find(|(l, _)| *l == wanted).map(|(_, s)| s).unwrap_or_default()
    }

    /// Every stats key's series, by sanitised stats key.
    pub fn by_key(&self) -> Vec<(String, Series)> {
        let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        series.iter().map(|(k, s)| (k.clone(), *s)).collect()
    }

    /// The series summed by their labels, sorted.
    fn by_labels(&self) -> Vec<(Labels, Series)> {
        let mut folded: std::collections::BTreeMap<Labels, Series> = Default::default();
        for (key, s) in self.by_key() {
            let f = folded.entry(labels(&key)).or_default();
            f.total_hits += s.total_hits;
            f.over_limit += s.over_limit;
            f.near_limit += s.near_limit;
            f.within_limit += s.within_limit;
            f.shadow_mode += s.shadow_mode;
        }
        folded.into_iter().collect()
    }

    /// A descriptor of a domain no config names.
    pub fn not_found(&self, domain: &str) {
        self.domain_not_found.fetch_add(1, Relaxed);
        let mut not_found = self.not_found.lock().unwrap_or_else(|p| p.into_inner());
        let domain = sanitize(domain).into_owned();
        if !not_found.contains_key(&domain) && not_found.len() >= MAX_SERIES {
            self.dropped.fetch_add(1, Relaxed);
            return;
        }
        *not_found.entry(domain).or_default() += 1;
    }

    /// Descriptors of unknown domains, by sanitised domain.
    pub fn not_found_by_domain(&self) -> Vec<(String, u64)> {
        let not_found = self.not_found.lock().unwrap_or_else(|p| p.into_inner());
        not_found.iter().map(|(d, n)| (d.clone(), *n)).collect()
    }

    pub fn responded(&self, took: Duration) {
        if let Some(statsd) = &self.statsd {
            statsd.response_time(took);
        }
        self.requests.fetch_add(1, Relaxed);
        let seconds = took.as_secs_f64();
        let bucket = BUCKETS.iter().position(|&b| seconds <= b).unwrap_or(BUCKETS.len());
        self.response_times.lock().unwrap_or_else(|p| p.into_inner())[bucket] += 1;
        self.response_time_sum_ns.fetch_add(took.as_nanos() as u64, Relaxed);
    }

    /// The Prometheus text of the RLS front.
    pub fn metrics(&self, decisions: &DecisionCounters, gauges: &[(&str, &str, u64)]) -> String {
        let mut out = String::new();
        let family = rl_client::prometheus_family;
        {
            let sorted = self.by_labels();
            for (stat, help, value) in [
                (
                    "total_hits",
                    "hits of a limit, their cost (envoyproxy/ratelimit's name)",
                    (|s: &Series| s.total_hits) as fn(&Series) -> u64,
                ),
                ("over_limit", "hits refused by a limit", |s| s.over_limit),
                ("near_limit", "hits admitted past 80% of a limit", |s| s.near_limit),
                ("within_limit", "hits admitted by a limit", |s| s.within_limit),
                ("shadow_mode", "hits a shadow limit would have refused", |s| s.shadow_mode),
            ] {
                let name = format!("ratelimit_service_rate_limit_{stat}");
                family(&mut out, &name, "counter", help);
                for ((domain, key1, key2), s) in &sorted {
                    let key2 = key2.as_ref().map(|k| format!(",key2=\"{}\"", label(k))).unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "{name}{{domain=\"{}\",key1=\"{}\"{key2}}} {}",
                        label(domain),
                        label(key1),
                        value(s)
                    );
                }
            }
        }
        for (name, help, value) in [
            ("ratelimit_service_config_load_success", "configurations loaded", &self.config_load_success),
            (
                "ratelimit_service_config_load_error",
                "configurations refused (the one in force kept)",
                &self.config_load_error,
            ),
            (
                "ratelimit_service_global_shadow_mode",
                "OVER_LIMIT answers turned OK by --rls-shadow-mode",
                &self.global_shadow_mode,
            ),
        ] {
            family(&mut out, name, "counter", help);
            let _ = writeln!(out, "{name} {}", value.load(Relaxed));
        }
        family(&mut out, "ratelimit_service_should_rate_limit_error", "counter", "calls with an error, by type");
        for (kind, value) in [("redis_error", &self.redis_error), ("service_error", &self.service_error)] {
            let _ = writeln!(
                out,
                "ratelimit_service_should_rate_limit_error{{err_type=\"{kind}\"}} {}",
                value.load(Relaxed)
            );
        }
        family(&mut out, "ratelimit_service_total_requests", "counter", "ShouldRateLimit calls answered");
        let _ = writeln!(
            out,
            "ratelimit_service_total_requests{{grpc_method=\"ShouldRateLimit\"}} {}",
            self.requests.load(Relaxed)
        );
        let name = "ratelimit_service_response_time_seconds";
        family(&mut out, name, "histogram", "ShouldRateLimit response times");
        let counts = *self.response_times.lock().unwrap_or_else(|p| p.into_inner());
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(counts) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{grpc_method=\"ShouldRateLimit\",le=\"{bound}\"}} {cumulative}");
        }
        cumulative += counts[BUCKETS.len()];
        let _ = writeln!(out, "{name}_bucket{{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"}} {cumulative}");
        let sum = self.response_time_sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{grpc_method=\"ShouldRateLimit\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{grpc_method=\"ShouldRateLimit\"}} {cumulative}");
        let d = decisions;
        for (name, help, value) in [
            (
                "rl_relay_rls_domain_not_found_total",
                "descriptors of a domain no config names",
                self.domain_not_found.load(Relaxed),
            ),
            (
                "rl_relay_rls_unmatched_descriptors_total",
                "descriptors of a known domain no limit matches",
                self.unmatched.load(Relaxed),
            ),
            ("rl_relay_rls_from_memory_total", "limits paid from the relay's leases", d.from_memory.load(Relaxed)),
            (
                "rl_relay_rls_over_limit_from_memory_total",
                "limits refused from the deny cache (no Redis call)",
                d.from_deny_cache.load(Relaxed),
            ),
            (
                "rl_relay_rls_redis_calls_total",
                "commands the RLS front sent to Redis (leases and refunds too)",
                d.redis_calls.load(Relaxed),
            ),
            ("rl_relay_rls_window_leases_total", "fixed-window batches taken", d.window_leases.load(Relaxed)),
            (
                "rl_relay_rls_fallback_total",
                "limits decided by the local fallback (Redis could not answer)",
                d.fallback.load(Relaxed),
            ),
            (
                "rl_relay_rls_failure_denied_total",
                "limits refused because Redis could not answer (failure_mode: deny)",
                d.failure_denied.load(Relaxed),
            ),
            (
                "rl_relay_rls_refunds_total",
                "RL.REFUND calls giving back a refused request's bucket tokens",
                d.refunds.load(Relaxed),
            ),
            (
                "rl_relay_rls_given_back_total",
                "a refused request's tokens put back in the relay's memory",
                d.given_back.load(Relaxed),
            ),
            (
                "rl_relay_rls_window_refunds_total",
                "window counts of a refused request given back (RL.WINDOW ... REFUND)",
                d.window_refunds.load(Relaxed),
            ),
            (
                "rl_relay_rls_refund_errors_total",
                "refunds Redis did not take (their counts stand: under, never over)",
                d.refund_errors.load(Relaxed),
            ),
            (
                "rl_relay_rls_window_counts_kept_total",
                "window counts a refused request left (a reply without the server's reading)",
                d.window_counts_kept.load(Relaxed),
            ),
            (
                "rl_relay_rls_fallback_repaid_total",
                "window counts Redis granted that paid for what the fallback admitted in a stall",
                d.fallback_repaid.load(Relaxed),
            ),
            (
                "rl_relay_rls_handshake_timeouts_total",
                "connections closed for sending no HTTP/2 preface within 10 s or --auth-timeout-ms if shorter (their \
                 slot freed)",
                self.handshake_timeouts.load(Relaxed),
            ),
            (
                "rl_relay_rls_auth_timeouts_total",
                "connections closed at --auth-timeout-ms of their accept without a complete call carrying the token \
                 (any complete call, without --rls-token-file; their slot freed)",
                self.auth_timeouts.load(Relaxed),
            ),
            (
                "rl_relay_rls_tls_handshake_failures_total",
                "TLS handshakes that failed (with --rls-tls-client-ca: a client without a certificate the CA signed)",
                self.tls_handshake_failures.load(Relaxed),
            ),
            (
                "rl_relay_rls_tls_reload_errors_total",
                "changed TLS files refused (the certificates in force kept)",
                self.tls_reload_errors.load(Relaxed),
            ),
            (
                "rl_relay_rls_xds_versions_applied_total",
                "config versions received over xDS, put in force and ACKed",
                self.xds_versions_applied.load(Relaxed),
            ),
            (
                "rl_relay_rls_xds_nacks_total",
                "config versions received over xDS and refused (NACKed, the config in force kept)",
                self.xds_nacks.load(Relaxed),
            ),
            (
                "rl_relay_rls_san_refused_total",
                "connections whose client certificate is not valid for --rls-tls-client-san (every call refused)",
                self.san_refused.load(Relaxed),
            ),
            (
                "rl_relay_rls_body_timeouts_total",
                "calls answered DEADLINE_EXCEEDED: their body not whole within --auth-timeout-ms of their headers",
                self.body_timeouts.load(Relaxed),
            ),
            (
                "rl_relay_rls_timeouts_total",
                "decisions answered by the failure modes at the deadline",
                self.timeouts.load(Relaxed),
            ),
            (
                "rl_relay_rls_negative_hits_total",
                "descriptors with is_negative_hits, answered OK and taking nothing",
                self.negative_hits.load(Relaxed),
            ),
            (
                "rl_relay_rls_series_dropped_total",
                "hits not in the statistics: past the series bound",
                self.dropped.load(Relaxed),
            ),
            (
                "rl_relay_rls_statsd_dropped_total",
                "statsd lines not sent (USE_STATSD): the queue to its socket full, or the send failed",
                self.statsd.as_ref().map_or(0, |s| s.dropped()),
            ),
        ] {
            family(&mut out, name, "counter", help);
            let _ = writeln!(out, "{name} {value}");
        }
        for (name, help, value) in gauges {
            family(&mut out, name, "gauge", help);
            let _ = writeln!(out, "{name} {value}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitised_as_envoyproxy_ratelimit_does() {
        assert_eq!(sanitize("d.remote_address_10.0.0.1"), "d.remote_address_10_0_0_1");
        assert_eq!(sanitize("d.k_a:b|c"), "d.k_a_b_c");
        assert_eq!(sanitize("d.v_1.2.3"), "d.v_1.2.3");
        assert_eq!(sanitize("d.v_1234.2.3.4"), "d.v_1234_2_3_4");
        // Nothing to replace: the key itself, no copy.
        assert!(matches!(sanitize("d.user_ann.v_1.2.3"), Cow::Borrowed("d.user_ann.v_1.2.3")));
        assert_eq!(sanitize("d.é:1.2.3.4|ü"), "d.é_1_2_3_4_ü");
        assert_eq!(sanitize("1.2.3.4.5.6.7.8"), "1_2_3_4.5_6_7_8");
    }

    #[test]
    fn series_past_the_bound_are_dropped_and_counted_while_known_ones_go_on() {
        let stats = Stats::default();
        for i in 0..MAX_SERIES {
            stats.record(&format!("d.k_{i}"), 10, 1, Some(9), false, false);
        }
        stats.record("d.new", 10, 1, Some(9), false, false);
        assert_eq!(stats.dropped.load(Relaxed), 1);
        stats.record("d.k_0", 10, 1, Some(8), false, false);
        assert_eq!(stats.dropped.load(Relaxed), 1);
        assert_eq!(stats.by_key().len(), MAX_SERIES);
        assert_eq!(stats.by_key().into_iter().find(|(k, _)| k == "d.k_0").map(|(_, s)| s.total_hits), Some(2));
    }

    #[test]
    fn labels_fold_deeper_levels() {
        assert_eq!(labels("domain1.key1_val1"), ("domain1".into(), "key1_val1".into(), None));
        assert_eq!(
            labels("domain1.key3_val3.key4_val4.key5_val5"),
            ("domain1".into(), "key3_val3".into(), Some("key4_val4".into()))
        );
    }

    #[test]
    fn near_limit_is_counted_as_envoyproxy_ratelimit_counts_it() {
        let s = Stats::default();
        // Limit 8 (near 6): cost 2 to 7 left 1: near 1, within 2.
        s.record("d.k", 8, 2, Some(1), false, false);
        assert_eq!(s.series("d.k"), Series { total_hits: 2, near_limit: 1, within_limit: 2, ..Series::default() });
        // Limit 20 (near 16): cost 3 to 19: near 3.
        s.record("d.j", 20, 3, Some(1), false, false);
        assert_eq!(s.series("d.j").near_limit, 3);
        s.record("d.j", 20, 3, Some(0), true, true);
        assert_eq!(
            s.series("d.j"),
            Series { total_hits: 6, over_limit: 3, near_limit: 3, within_limit: 3, shadow_mode: 3 }
        );
        // Not asked (another limit refused first): a hit within, never near.
        s.record("d.n", 8, 7, None, false, false);
        assert_eq!(s.series("d.n"), Series { total_hits: 7, within_limit: 7, ..Series::default() });
    }
}
