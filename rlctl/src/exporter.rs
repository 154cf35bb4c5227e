//! `rlctl metrics`: the limiter's counters from `INFO`, served in the
//! Prometheus text format, so they reach Prometheus without redis_exporter
//! (whose module mode keeps only fields on its allow-list).
//!
//! Every scrape reads `INFO rl`, `INFO stats`, `INFO memory`,
//! `INFO commandstats` and `INFO latencystats` from one server and renders
//! them, each family's samples right after its HELP and TYPE lines (a
//! streaming parser, Prometheus' own among them, types a sample by the
//! family it follows). A server that does not answer is `rl_up 0`, and the
//! exporter logs why (the error, never the password). A `redis://` URL is
//! that one server, whatever its role; a `redis+sentinel://` URL is the
//! master its sentinels name, followed across a failover (logged). Where the region's
//! share table of global rules is (rl-balancer writes it), its age and
//! version too: the balancer's heartbeat, on the server's clock.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use redis::aio::ConnectionLike;
use rl_gateway::{prometheus_label as label, Connection, Target, Tls};
use tokio::net::TcpListener;

/// What one scrape asks the server for: an ACL user for the exporter needs
/// exactly these (see docs/security.md's exporter user).
pub const INFO_SECTIONS: [&str; 5] = ["rl", "stats", "memory", "commandstats", "latencystats"];

/// The fields of `INFO` text (`name:value` lines; sections and blanks skipped).
fn fields(info: &str) -> impl Iterator<Item = (&str, &str)> {
    info.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.trim_end().split_once(':'))
}

/// The share table's age (since the balancer last wrote it) and version.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SharesSeen {
    /// Seconds since the balancer's last write, on the server's clock.
    pub age_seconds: f64,
    /// The table's version.
    pub version: u64,
}

/// One metric family: its HELP and TYPE, then its samples.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Vec<String>,
}

/// The families `render` serves, in order, each empty.
fn families() -> Vec<Family> {
    let family = |name, kind, help| Family { name, kind, help, samples: Vec::new() };
    vec![
        family("rl_up", "gauge", "1 when the last scrape of Redis answered."),
        family("rl_calls_total", "counter", "Calls of each limiter command (INFO rl rl_<command>_calls)."),
        family("rl_decisions_total", "counter", "Allowed and denied decisions of each deciding command."),
        family("rl_errors_total", "counter", "Calls of each command answered with an error."),
        family("rl_release_unknown_total", "counter", "RL.RELEASE calls whose id held nothing."),
        family("rl_inflight_healed_total", "counter", "In-flight slots dropped at their deadline: lost releases."),
        family(
            "rl_rejected_calls_total",
            "counter",
            "Calls refused before running (OOM, ACL), from INFO commandstats.",
        ),
        family(
            "rl_command_latency_seconds",
            "summary",
            "Server-side time of each limiter command: percentiles since the server started (INFO latencystats, \
             Redis 7.0+), sum and count from INFO commandstats.",
        ),
        family("rl_evicted_keys_total", "counter", "Keys the server evicted (any eviction resets a limit)."),
        family("rl_used_memory_bytes", "gauge", "used_memory of the server."),
        family("rl_maxmemory_bytes", "gauge", "maxmemory of the server (0: none)."),
        family("rl_maxmemory_policy", "gauge", "1 for the server's maxmemory-policy (policy label)."),
        family(
            "rl_share_table_age_seconds",
            "gauge",
            "Seconds since rl-balancer last wrote this region's share table (absent: no table).",
        ),
        family("rl_share_table_version", "gauge", "Version of this region's share table of global rules."),
    ]
}

/// The limiter's commands as INFO commandstats and latencystats name them.
fn limiter_command(name: &str) -> bool {
    name.starts_with("rl.") || name == "cl.throttle"
}

/// A decimal without float noise: `digits` places, trailing zeros cut.
fn decimal(value: f64, digits: usize) -> String {
    let text = format!("{value:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// `p99.9=211.967` of latencystats: the quantile (0.999) and seconds.
fn percentile(pair: &str) -> Option<(String, String)> {
    let (p, usec) = pair.strip_prefix('p')?.split_once('=')?;
    let (p, usec): (f64, f64) = (p.parse().ok()?, usec.parse().ok()?);
    Some((decimal(p / 100.0, 6), decimal(usec / 1e6, 9)))
}

/// The Prometheus text of one scrape: `rl` the `INFO rl` text, `server` the
/// `INFO stats`, `INFO memory`, `INFO commandstats` and `INFO latencystats`
/// texts together, `shares` the share table if the server has one.
pub fn render(rl: &str, server: &str, shares: Option<SharesSeen>) -> String {
    let mut all = families();
    let mut sample = |family: &str, line: String| {
        if let Some(f) = all.iter_mut().find(|f| f.name == family) {
            f.samples.push(line);
        }
    };
    sample("rl_up", "rl_up 1".to_owned());
    for (name, value) in fields(rl) {
        let Some(rest) = name.strip_prefix("rl_") else { continue };
        match rest {
            "release_unknown" => sample("rl_release_unknown_total", format!("rl_release_unknown_total {value}")),
            "inflight_healed" => sample("rl_inflight_healed_total", format!("rl_inflight_healed_total {value}")),
            _ => match rest.rsplit_once('_') {
                Some((cmd, "calls")) => {
                    sample("rl_calls_total", format!("rl_calls_total{{command=\"{cmd}\"}} {value}"))
                }
                Some((cmd, "errors")) => {
                    sample("rl_errors_total", format!("rl_errors_total{{command=\"{cmd}\"}} {value}"))
                }
                Some((cmd, d @ ("allowed" | "denied"))) => sample(
                    "rl_decisions_total",
                    format!("rl_decisions_total{{command=\"{cmd}\",decision=\"{d}\"}} {value}"),
                ),
                _ => {}
            },
        }
    }
    for (name, value) in fields(server) {
        match name {
            "evicted_keys" => sample("rl_evicted_keys_total", format!("rl_evicted_keys_total {value}")),
            "used_memory" => sample("rl_used_memory_bytes", format!("rl_used_memory_bytes {value}")),
            "maxmemory" => sample("rl_maxmemory_bytes", format!("rl_maxmemory_bytes {value}")),
            "maxmemory_policy" => {
                sample("rl_maxmemory_policy", format!("rl_maxmemory_policy{{policy=\"{}\"}} 1", label(value)))
            }
            _ => {
                const LATENCY: &str = "rl_command_latency_seconds";
                if let Some(cmd) = name.strip_prefix("cmdstat_").filter(|c| limiter_command(c)) {
                    // cmdstat_rl.take:calls=3,usec=10,usec_per_call=..,rejected_calls=1,failed_calls=0
                    let stat = |key: &str| value.split(',').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='));
                    if let Some(n) = stat("rejected_calls") {
                        sample("rl_rejected_calls_total", format!("rl_rejected_calls_total{{command=\"{cmd}\"}} {n}"));
                    }
                    if let (Some(calls), Some(usec)) = (stat("calls"), stat("usec").and_then(|u| u.parse::<f64>().ok()))
                    {
                        sample(LATENCY, format!("{LATENCY}_sum{{command=\"{cmd}\"}} {}", decimal(usec / 1e6, 6)));
                        sample(LATENCY, format!("{LATENCY}_count{{command=\"{cmd}\"}} {calls}"));
                    }
                } else if let Some(cmd) = name.strip_prefix("latency_percentiles_usec_").filter(|c| limiter_command(c))
                {
                    // latency_percentiles_usec_rl.take:p50=2.007,p99=9.023,p99.9=211.967
                    for (quantile, seconds) in value.split(',').filter_map(percentile) {
                        sample(LATENCY, format!("{LATENCY}{{command=\"{cmd}\",quantile=\"{quantile}\"}} {seconds}"));
                    }
                }
            }
        }
    }
    if let Some(s) = shares {
        sample("rl_share_table_age_seconds", format!("rl_share_table_age_seconds {:.3}", s.age_seconds));
        sample("rl_share_table_version", format!("rl_share_table_version {}", s.version));
    }
    let mut out = String::new();
    for f in &all {
        rl_gateway::prometheus_family(&mut out, f.name, f.kind, f.help);
        for s in &f.samples {
            out.push_str(s);
            out.push('\n');
        }
    }
    out
}

/// What a failed scrape serves.
const DOWN: &str = "# HELP rl_up 1 when the last scrape of Redis answered.\n# TYPE rl_up gauge\nrl_up 0\n";

/// The share table's age and version, if the server holds one.
async fn shares_seen(con: &mut impl ConnectionLike) -> redis::RedisResult<Option<SharesSeen>> {
    let ((written, version), (secs, micros)): ((Option<u64>, Option<u64>), (u64, u64)) = redis::pipe()
        .cmd("HMGET")
        .arg(rl_gateway::global::SHARES_KEY)
        .arg(&["written_at", "version"])
        .cmd("TIME")
        .query_async(con)
        .await?;
    let now_ms = secs * 1000 + micros / 1000;
    Ok(written
        .map(|w| SharesSeen { age_seconds: now_ms.saturating_sub(w) as f64 / 1000.0, version: version.unwrap_or(0) }))
}

/// One scrape of the server behind `con`: its text, or why it failed.
pub async fn scrape(con: &mut impl ConnectionLike) -> Result<String, String> {
    let mut texts = Vec::new();
    for section in INFO_SECTIONS {
        let text = redis::cmd("INFO").arg(section).query_async::<String>(con).await;
        texts.push(text.map_err(|e| format!("INFO {section}: {e}"))?);
    }
    let shares =
        shares_seen(con).await.map_err(|e| format!("the share table ({}): {e}", rl_gateway::global::SHARES_KEY))?;
    Ok(render(&texts[0], &texts[1..].join("\n"), shares))
}

/// `url` fit for a log line (rl-client's): no password.
pub use rl_gateway::redacted;

/// Longest wait for each call of a scrape, and to connect.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a failure that goes on is logged only once.
const REPEAT_FAILURE: Duration = Duration::from_secs(60);

/// The exporter's log of scrape failures: a line when scrapes start failing
/// or fail for another reason, again once a minute while they keep failing,
/// and one when they answer again. Every line names the server by its
/// redacted URL.
struct ScrapeLog {
    server: String,
    last: Mutex<Option<(String, Instant)>>,
}

impl ScrapeLog {
    fn failed(&self, why: &str) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let repeat = match &*last {
            Some((seen, at)) => seen != why || at.elapsed() >= REPEAT_FAILURE,
            None => true,
        };
        if repeat {
            eprintln!("rlctl metrics: scrape of {} failed, serving rl_up 0: {why}", self.server);
            *last = Some((why.to_owned(), Instant::now()));
        }
    }

    fn answered(&self) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.take().is_some() {
            eprintln!("rlctl metrics: scrape of {} answers again", self.server);
        }
    }
}

/// Serves `/metrics` on `listener` for the server at `redis_url`, until the
/// task is dropped. Scrape failures go to stderr (see [`redacted`]).
pub async fn serve(redis_url: &str, tls: &Tls, listener: TcpListener) -> Result<(), String> {
    let server = redacted(redis_url);
    // redis-rs's own error repeats nothing of the URL's secret; the URL
    // itself is shown redacted.
    let target = Target::from_url(redis_url).map_err(|e| format!("bad Redis URL '{server}': {e}"))?;
    let client = Connection::open_as_given_with_tls(&target, tls, SCRAPE_TIMEOUT, SCRAPE_TIMEOUT)
        .map_err(|e| format!("bad Redis URL '{server}': {e}"))?;
    client.on_switch(|status| {
        let now = status.server.as_deref().unwrap_or("none");
        eprintln!("rlctl metrics: scraping {now} now, the primary of {}", status.configured);
    });
    let log = Arc::new(ScrapeLog { server, last: Mutex::new(None) });
    serve_metrics(listener, "rlctl metrics", move || {
        let (client, log) = (client.clone(), log.clone());
        async move {
            match scrape(&mut client.clone()).await {
                Ok(text) => {
                    log.answered();
                    text
                }
                Err(why) => {
                    log.failed(&why);
                    DOWN.to_owned()
                }
            }
        }
    })
    .await;
    Ok(())
}

/// Scrapes served at once; more wait in the listener's backlog.
const MAX_CONNECTIONS: usize = 16;
/// How long a request's head may take to arrive (hyper bounds its size).
const READ_FOR: Duration = Duration::from_secs(2);

/// Serves `/metrics` on `listener`, each scrape's text from `render`, until
/// the task is dropped: a few connections at once, a request's head within
/// a short wait, accept errors (out of descriptors) backed off and logged
/// under `name`. The exporter's and rl-balancer's `--metrics`.
pub async fn serve_metrics<F, Fut>(listener: TcpListener, name: &'static str, render: F)
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = String> + Send,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                eprintln!("{name}: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let render = render.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let render = render.clone();
                async move { Ok::<_, Infallible>(answer(req.uri().path(), render).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(READ_FOR)
                .serve_connection(io, service)
                .await;
        });
    }
}

async fn answer<F, Fut>(path: &str, render: F) -> Response<Full<Bytes>>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    if path != "/metrics" {
        let mut not_found = Response::new(Full::new(Bytes::from_static(b"only /metrics here\n")));
        *not_found.status_mut() = StatusCode::NOT_FOUND;
        return not_found;
    }
    let mut ok = Response::new(Full::new(Bytes::from(render().await)));
    ok.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; version=0.0.4"));
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_becomes_prometheus_text() {
        let rl = "# rl\r\nrl_take_calls:7\r\nrl_take_allowed:3\r\nrl_take_denied:1\r\nrl_take_errors:3\r\n\
                  rl_set_calls:2\r\nrl_set_errors:0\r\nrl_release_unknown:4\r\nrl_inflight_healed:5\r\n";
        let server = "# Stats\r\nevicted_keys:9\r\n# Memory\r\nused_memory:1000\r\nmaxmemory:2000\r\n\
                      maxmemory_policy:volatile-ttl\r\n\
                      # Commandstats\r\ncmdstat_rl.take:calls=7,usec=10,usec_per_call=1.43,rejected_calls=2,failed_calls=3\r\n\
                      cmdstat_get:calls=1,usec=1,rejected_calls=8,failed_calls=0\r\n\
                      # Latencystats\r\nlatency_percentiles_usec_rl.take:p50=2.007,p99=9.023,p99.9=211.967\r\n\
                      latency_percentiles_usec_get:p50=1.001\r\n";
        let text = render(rl, server, Some(SharesSeen { age_seconds: 61.5, version: 3 }));
        for line in [
            "rl_up 1",
            "rl_calls_total{command=\"take\"} 7",
            "rl_decisions_total{command=\"take\",decision=\"allowed\"} 3",
            "rl_decisions_total{command=\"take\",decision=\"denied\"} 1",
            "rl_errors_total{command=\"take\"} 3",
            "rl_calls_total{command=\"set\"} 2",
            "rl_release_unknown_total 4",
            "rl_inflight_healed_total 5",
            "rl_evicted_keys_total 9",
            "rl_used_memory_bytes 1000",
            "rl_maxmemory_bytes 2000",
            "rl_maxmemory_policy{policy=\"volatile-ttl\"} 1",
            "rl_rejected_calls_total{command=\"rl.take\"} 2",
            "rl_command_latency_seconds{command=\"rl.take\",quantile=\"0.5\"} 0.000002007",
            "rl_command_latency_seconds{command=\"rl.take\",quantile=\"0.99\"} 0.000009023",
            "rl_command_latency_seconds{command=\"rl.take\",quantile=\"0.999\"} 0.000211967",
            "rl_command_latency_seconds_sum{command=\"rl.take\"} 0.00001",
            "rl_command_latency_seconds_count{command=\"rl.take\"} 7",
            "rl_share_table_age_seconds 61.500",
            "rl_share_table_version 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        assert!(!text.contains("command=\"get\""), "only the limiter's commands");
        assert_eq!(text.matches("# TYPE").count(), families().len());
    }

    #[test]
    fn each_family_is_followed_by_its_own_samples() {
        let rl =
            "rl_take_calls:1\r\nrl_take_allowed:1\r\nrl_take_denied:0\r\nrl_take_errors:0\r\nrl_inflight_healed:0\r\n";
        let server = "evicted_keys:0\r\nused_memory:1\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n";
        let text = render(rl, server, None);
        let mut family = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap();
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                let own = name == family || name.strip_prefix(family).is_some_and(|s| s == "_sum" || s == "_count");
                assert!(own, "{line} follows the TYPE of {family}:\n{text}");
            }
        }
    }

    #[test]
    fn percentiles_become_quantiles_in_seconds() {
        assert_eq!(percentile("p99.9=211.967"), Some(("0.999".to_owned(), "0.000211967".to_owned())));
        assert_eq!(percentile("p50=2"), Some(("0.5".to_owned(), "0.000002".to_owned())));
        assert_eq!(percentile("p100=1"), Some(("1".to_owned(), "0.000001".to_owned())));
        assert_eq!(percentile("x=1"), None);
        assert_eq!(percentile("p50=nan?"), None);
    }
}
