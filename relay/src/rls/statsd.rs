//! USE_STATSD: the RLS front's statistics sent to a statsd server under
//! envoyproxy/ratelimit's names, as its gostats store sends them, so
//! Envoy Gateway's statsd-exporter sidecar sees what it expects. The
//! counting stays in `stats.rs`; this is a second output of those counts:
//! every flush interval (STATS_FLUSH_INTERVAL) each counter's increase
//! since the last flush (`name:N|c`, nothing when it did not move), and
//! each ShouldRateLimit call's response time in ms as it is answered
//! (`ratelimit_server.ShouldRateLimit.response_time:N|ms`).
//!
//! The names (src/stats/manager_impl.go, src/metrics/metrics.go):
//! `ratelimit.service.rate_limit.<stats key>.{total_hits,over_limit,
//! near_limit,within_limit,shadow_mode}`, `ratelimit.service.rate_limit.
//! <domain>.domain_not_found`, `ratelimit.service.{config_load_success,
//! config_load_error,global_shadow_mode}`, `ratelimit.service.call.
//! should_rate_limit.{redis_error,service_error}`, `ratelimit_server.
//! ShouldRateLimit.total_requests`. EXTRA_TAGS go in each name as gostats
//! writes tags: `.__key=value`, by key, `.:|` in a value made `_`.
//!
//! Over UDP (gostats' default is TCP; statsd-exporter reads both), through
//! cadence's queue to a buffered socket on its own thread: a call never
//! waits on the network; a line the full queue refuses is counted
//! (`rl_relay_rls_statsd_dropped_total`) and logged.

use std::collections::HashMap;
use std::io;
use std::net::{ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cadence::{BufferedUdpMetricSink, Counted, MetricSink, QueuingMetricSink, StatsdClient, Timed};

use super::Rls;
use crate::logging::Throttled;

/// Lines waiting for the socket's thread; past it a line is dropped.
const QUEUE: usize = 64 << 10;

/// The queue, shared by the client (which writes into it) and the flusher
/// (which waits for it to drain before it flushes the socket's buffer).
#[derive(Clone)]
struct Shared(Arc<QueuingMetricSink>);

impl MetricSink for Shared {
    fn emit(&self, metric: &str) -> io::Result<usize> {
        self.0.emit(metric)
    }

    fn flush(&self) -> io::Result<()> {
        self.0.flush()
    }
}

/// The statsd output.
pub struct Statsd {
    client: StatsdClient,
    queue: Shared,
    /// `.__key=value...`: EXTRA_TAGS as gostats puts them in a name.
    tags: String,
    pub interval: Duration,
    /// What each counter stood at when last sent.
    sent: Mutex<HashMap<String, u64>>,
    /// Lines not sent.
    pub dropped: AtomicU64,
    errors: Throttled,
    target: String,
}

impl std::fmt::Debug for Statsd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Statsd").field("target", &self.target).field("interval", &self.interval).finish()
    }
}

/// `key:value,key:value` (envconfig's map, as EXTRA_TAGS is read) as
/// gostats' tag suffix: sorted by key, `.`, `:` and `|` in a value made `_`,
/// a pair with an empty key or value left out.
pub fn tag_suffix(text: &str) -> Result<String, String> {
    let mut tags = Vec::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) =
            pair.split_once(':').ok_or_else(|| format!("'{pair}': a tag is key:value (EXTRA_TAGS=k1:v1,k2:v2)"))?;
        if !key.is_empty() && !value.is_empty() {
            tags.push((key.to_string(), value.replace(['.', ':', '|'], "_")));
        }
    }
    tags.sort();
    Ok(tags.iter().map(|(k, v)| format!(".__{k}={v}")).collect())
}

impl Statsd {
    /// Sends to `target` (`host:port`, resolved once, as gostats does; an
    /// IPv4 address first: `localhost` may name `::1` too, where a sidecar
    /// listening on IPv4 only would never hear the lines).
    pub fn connect(target: &str, tags: &str, interval: Duration) -> Result<Statsd, String> {
        let addresses: Vec<_> = target.to_socket_addrs().map_err(|e| format!("{target}: {e}"))?.collect();
        let address = addresses
            .iter()
            .find(|a| a.is_ipv4())
            .or(addresses.first())
            .copied()
            .ok_or_else(|| format!("{target}: no address"))?;
        let bind = if address.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let socket = UdpSocket::bind(bind).map_err(|e| format!("{target}: a UDP socket: {e}"))?;
        let sink = BufferedUdpMetricSink::from(address, socket).map_err(|e| format!("{target}: {e}"))?;
        let queue = Shared(Arc::new(QueuingMetricSink::with_capacity(sink, QUEUE)));
        Ok(Statsd {
            client: StatsdClient::from_sink("", queue.clone()),
            queue,
            tags: tag_suffix(tags)?,
            interval,
            sent: Mutex::default(),
            dropped: AtomicU64::new(0),
            errors: Throttled::new(Duration::from_secs(10)),
            target: target.to_string(),
        })
    }

    fn failed(&self, e: impl std::fmt::Display) {
        self.dropped.fetch_add(1, Relaxed);
        self.errors.log(|| format!("statsd {}: a line not sent: {e}", self.target));
    }

    /// Every counter of `stats` that moved since the last flush, sent as
    /// its increase; the socket's buffer flushed once the queue drained.
    pub async fn flush(&self, stats: &super::stats::Stats) {
        let mut now: Vec<(String, u64)> = Vec::new();
        let service = "ratelimit.service";
        for (key, s) in stats.by_key() {
            for (stat, value) in [
                ("total_hits", s.total_hits),
                ("over_limit", s.over_limit),
                ("near_limit", s.near_limit),
                ("within_limit", s.within_limit),
                ("shadow_mode", s.shadow_mode),
            ] {
                now.push((format!("{service}.rate_limit.{key}.{stat}"), value));
            }
        }
        for (domain, n) in stats.not_found_by_domain() {
            now.push((format!("{service}.rate_limit.{domain}.domain_not_found"), n));
        }
        for (name, value) in [
            ("config_load_success", &stats.config_load_success),
            ("config_load_error", &stats.config_load_error),
            ("global_shadow_mode", &stats.global_shadow_mode),
            ("call.should_rate_limit.redis_error", &stats.redis_error),
            ("call.should_rate_limit.service_error", &stats.service_error),
        ] {
            now.push((format!("{service}.{name}"), value.load(Relaxed)));
        }
        now.push(("ratelimit_server.ShouldRateLimit.total_requests".into(), stats.requests.load(Relaxed)));
        {
            let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            for (name, value) in now {
                let before = sent.get(&name).copied().unwrap_or(0);
                if value <= before {
                    continue;
                }
                match self.client.count(&format!("{name}{}", self.tags), (value - before) as i64) {
                    Ok(_) => {
                        sent.insert(name, value);
                    }
                    // Not marked sent: tried again at the next flush.
                    Err(e) => self.failed(e),
                }
            }
        }
        // The queue's thread writes into the socket's buffer: flushed once
        // it has (bounded: a stuck queue is flushed as it stands).
        for _ in 0..100 {
            if self.queue.0.queued() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Err(e) = self.queue.flush() {
            self.failed(e);
        }
    }
}

impl super::stats::Sink for Statsd {
    /// A ShouldRateLimit call answered (its time in whole ms, as upstream).
    fn response_time(&self, took: Duration) {
        let name = format!("ratelimit_server.ShouldRateLimit.response_time{}", self.tags);
        if let Err(e) = self.client.time(&name, took.as_millis() as u64) {
            self.failed(e);
        }
    }

    fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
}

/// Flushes the front's statistics to statsd every interval, until the
/// process ends.
pub async fn flush_forever(rls: Arc<Rls>) {
    let Some(statsd) = rls.options.statsd.clone() else { return };
    let mut tick = tokio::time::interval(statsd.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        statsd.flush(&rls.stats).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_tags_as_gostats_writes_them() {
        assert_eq!(tag_suffix("").unwrap(), "");
        assert_eq!(tag_suffix("zone:eu.west,app:rl").unwrap(), ".__app=rl.__zone=eu_west");
        assert_eq!(tag_suffix("a:,b:1").unwrap(), ".__b=1");
        assert!(tag_suffix("nocolon").unwrap_err().contains("nocolon"));
    }
}
