//! `rlctl metrics`: the limiter's counters from `INFO`, served in the
//! Prometheus text format, so they reach Prometheus without redis_exporter
//! (whose module mode keeps only fields on its allow-list).
//!
//! Every scrape reads `INFO rl`, `INFO stats`, `INFO memory` and
//! `INFO commandstats` from one server and renders them; a server that does
//! not answer is `rl_up 0`. Where the region's share table of global rules
//! is (rl-balancer writes it), its age and version too: the balancer's
//! heartbeat, on the server's clock.

use std::convert::Infallible;
use std::fmt::Write;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use redis::aio::MultiplexedConnection;
use tokio::net::TcpListener;

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

/// The Prometheus text of one scrape: `rl` the `INFO rl` text, `server` the
/// `INFO stats`, `INFO memory` and `INFO commandstats` texts together,
/// `shares` the share table if the server has one.
pub fn render(rl: &str, server: &str, shares: Option<SharesSeen>) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family("rl_up", "gauge", "1 when the last scrape of Redis answered.");
    family("rl_calls_total", "counter", "Calls of each limiter command (INFO rl rl_<command>_calls).");
    family("rl_decisions_total", "counter", "Allowed and denied decisions of each deciding command.");
    family("rl_errors_total", "counter", "Calls of each command answered with an error.");
    family("rl_release_unknown_total", "counter", "RL.RELEASE calls whose id held nothing.");
    family("rl_inflight_healed_total", "counter", "In-flight slots dropped at their deadline: lost releases.");
    family("rl_rejected_calls_total", "counter", "Calls refused before running (OOM, ACL), from INFO commandstats.");
    family("rl_evicted_keys_total", "counter", "Keys the server evicted (any eviction resets a limit).");
    family("rl_used_memory_bytes", "gauge", "used_memory of the server.");
    family("rl_maxmemory_bytes", "gauge", "maxmemory of the server (0: none).");
    family(
        "rl_share_table_age_seconds",
        "gauge",
        "Seconds since rl-balancer last wrote this region's share table (absent: no table).",
    );
    family("rl_share_table_version", "gauge", "Version of this region's share table of global rules.");
    let mut samples = String::from("rl_up 1\n");
    let mut sample = |line: String| {
        samples.push_str(&line);
        samples.push('\n');
    };
    for (name, value) in fields(rl) {
        let Some(rest) = name.strip_prefix("rl_") else { continue };
        match rest {
            "release_unknown" => sample(format!("rl_release_unknown_total {value}")),
            "inflight_healed" => sample(format!("rl_inflight_healed_total {value}")),
            _ => match rest.rsplit_once('_') {
                Some((cmd, "calls")) => sample(format!("rl_calls_total{{command=\"{cmd}\"}} {value}")),
                Some((cmd, "errors")) => sample(format!("rl_errors_total{{command=\"{cmd}\"}} {value}")),
                Some((cmd, d @ ("allowed" | "denied"))) => {
                    sample(format!("rl_decisions_total{{command=\"{cmd}\",decision=\"{d}\"}} {value}"))
                }
                _ => {}
            },
        }
    }
    for (name, value) in fields(server) {
        match name {
            "evicted_keys" => sample(format!("rl_evicted_keys_total {value}")),
            "used_memory" => sample(format!("rl_used_memory_bytes {value}")),
            "maxmemory" => sample(format!("rl_maxmemory_bytes {value}")),
            _ => {
                // cmdstat_rl.take:calls=3,usec=..,rejected_calls=1,failed_calls=0
                let Some(cmd) = name.strip_prefix("cmdstat_").filter(|c| c.starts_with("rl.") || *c == "cl.throttle")
                else {
                    continue;
                };
                let rejected = value.split(',').find_map(|kv| kv.strip_prefix("rejected_calls="));
                if let Some(n) = rejected {
                    sample(format!("rl_rejected_calls_total{{command=\"{cmd}\"}} {n}"));
                }
            }
        }
    }
    if let Some(s) = shares {
        sample(format!("rl_share_table_age_seconds {:.3}", s.age_seconds));
        sample(format!("rl_share_table_version {}", s.version));
    }
    out + &samples
}

/// The share table's age and version, if the server holds one.
async fn shares_seen(con: &mut MultiplexedConnection) -> Option<SharesSeen> {
    let ((written, version), (secs, micros)): ((Option<u64>, Option<u64>), (u64, u64)) = redis::pipe()
        .cmd("HMGET")
        .arg(crate::SHARES_KEY)
        .arg(&["written_at", "version"])
        .cmd("TIME")
        .query_async(con)
        .await
        .ok()?;
    let now_ms = secs * 1000 + micros / 1000;
    Some(SharesSeen { age_seconds: now_ms.saturating_sub(written?) as f64 / 1000.0, version: version.unwrap_or(0) })
}

/// One scrape of the server behind `con`.
pub async fn scrape(con: &mut MultiplexedConnection) -> String {
    let mut texts = Vec::new();
    for section in ["rl", "stats", "memory", "commandstats"] {
        match redis::cmd("INFO").arg(section).query_async::<String>(con).await {
            Ok(text) => texts.push(text),
            Err(_) => {
                return "# HELP rl_up 1 when the last scrape of Redis answered.\n# TYPE rl_up gauge\nrl_up 0\n".into()
            }
        }
    }
    let shares = shares_seen(con).await;
    render(&texts[0], &texts[1..].join("\n"), shares)
}

/// Serves `/metrics` on `listener` for the server at `redis_url`, until the
/// task is dropped.
pub async fn serve(redis_url: &str, listener: TcpListener) -> Result<(), String> {
    let client = redis::Client::open(redis_url).map_err(|e| format!("bad Redis URL '{redis_url}': {e}"))?;
    loop {
        let (stream, _) = listener.accept().await.map_err(|e| format!("accept: {e}"))?;
        let client = client.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let client = client.clone();
                async move { Ok::<_, Infallible>(answer(&client, req.uri().path()).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}

async fn answer(client: &redis::Client, path: &str) -> Response<Full<Bytes>> {
    if path != "/metrics" {
        let mut not_found = Response::new(Full::new(Bytes::from_static(b"only /metrics here\n")));
        *not_found.status_mut() = StatusCode::NOT_FOUND;
        return not_found;
    }
    let text = match client.get_multiplexed_async_connection().await {
        Ok(mut con) => scrape(&mut con).await,
        Err(_) => "# HELP rl_up 1 when the last scrape of Redis answered.\n# TYPE rl_up gauge\nrl_up 0\n".into(),
    };
    let mut ok = Response::new(Full::new(Bytes::from(text)));
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
                      # Commandstats\r\ncmdstat_rl.take:calls=7,usec=10,rejected_calls=2,failed_calls=3\r\n\
                      cmdstat_get:calls=1,usec=1,rejected_calls=8,failed_calls=0\r\n";
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
            "rl_rejected_calls_total{command=\"rl.take\"} 2",
            "rl_share_table_age_seconds 61.500",
            "rl_share_table_version 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        assert!(!text.contains("command=\"get\""), "only the limiter's commands");
        assert_eq!(text.matches("# TYPE").count(), 12);
    }
}
