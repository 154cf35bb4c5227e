//! `rlctl metrics` scraped for real: what it serves, read by Prometheus'
//! own parser, the module-side figures an SRE alarms on, and what it logs
//! when a scrape fails.

mod support;

use std::time::{Duration, Instant};

use support::{get, Exporter};
use testkit::prometheus::parse as parse_prometheus;
use testkit::{call, Server};

fn value(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn rlctl_metrics_serves_the_counters_prometheus_scrapes() {
    let mut s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 k 1 1 60000");
    call(&mut con, "RL.TAKE", "1 k 1 1 60000");
    let exporter = Exporter::start(&s.url());
    let head = get(exporter.port, "/metrics");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let page = exporter.scrape();
    for line in [
        "rl_up 1",
        "rl_calls_total{command=\"take\"} 2",
        "rl_decisions_total{command=\"take\",decision=\"allowed\"} 1",
        "rl_decisions_total{command=\"take\",decision=\"denied\"} 1",
        "rl_inflight_healed_total 0",
        "rl_evicted_keys_total 0",
    ] {
        assert!(page.lines().any(|l| l == line), "{line} missing:\n{page}");
    }
    assert!(value(&page, "rl_share_table_age_seconds").is_none(), "no share table, no age:\n{page}");
    // A share table written 90 s ago by the server's clock (a balancer
    // that stopped): its age is served, for the alarm above 60 s.
    let now_ms: u64 = {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
        secs * 1000 + micros / 1000
    };
    let _: () = redis::cmd("HSET")
        .arg(rl_gateway::global::SHARES_KEY)
        .arg("written_at")
        .arg(now_ms - 90_000)
        .arg("version")
        .arg(7)
        .query(&mut con)
        .unwrap();
    let page = exporter.scrape();
    let age = value(&page, "rl_share_table_age_seconds").unwrap_or_else(|| panic!("no age:\n{page}"));
    assert!((90.0..100.0).contains(&age), "{age}");
    assert_eq!(value(&page, "rl_share_table_version"), Some(7.0), "{page}");
    assert!(get(exporter.port, "/").starts_with("HTTP/1.1 404"));
    // Redis gone: the exporter answers, says so, and logs why.
    s.kill();
    let page = exporter.scrape();
    assert!(page.lines().any(|l| l == "rl_up 0"), "{page}");
    assert!(exporter.log().contains("failed, serving rl_up 0"), "{}", exporter.log());
}

/// Prometheus' parser types a sample by the family whose TYPE it follows:
/// HELP and TYPE lines all first would make every family `unknown`.
#[test]
fn prometheus_own_parser_types_every_family() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 k 1 1 60000");
    call(&mut con, "RL.TAKE", "1 k 1 1 60000");
    let _: redis::RedisResult<redis::Value> = redis::cmd("RL.TAKE").arg("x").query(&mut con);
    let _: () =
        redis::cmd("HSET").arg(rl_gateway::global::SHARES_KEY).arg("written_at").arg(1).query(&mut con).unwrap();
    let exporter = Exporter::start(&s.url());
    let page = exporter.scrape();
    let families = parse_prometheus(&page);
    let declared: Vec<&str> = page.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    for family in &families {
        assert_ne!(
            family.kind, "unknown",
            "{} is typed unknown: its samples do not follow its TYPE\n{page}",
            family.name
        );
    }
    // prometheus_client names a counter's family without its _total.
    let parsed = |name: &str| {
        families.iter().find(|f| f.name == name || format!("{}_total", f.name) == name).unwrap_or_else(|| {
            panic!("{name} declared but not parsed as a family: {families:?}");
        })
    };
    for name in declared {
        let family = parsed(name);
        assert!(!family.samples.is_empty(), "{name} has no samples under its TYPE:\n{page}");
    }
    let calls = parsed("rl_calls_total");
    assert_eq!(calls.kind, "counter");
    let take = calls.samples.iter().find(|s| s.labels.get("command").map(String::as_str) == Some("take"));
    assert!(take.is_some_and(|s| s.value >= 2.0), "{calls:?}");
    assert_eq!(parsed("rl_command_latency_seconds").kind, "summary");
}

/// What an SRE alarms on from the module's side: per-command latency
/// (Redis 7.0+ keeps percentiles), maxmemory and its policy, evictions.
#[test]
fn latency_memory_policy_and_evictions_are_served() {
    let s = Server::start(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]);
    let mut con = s.con();
    for _ in 0..50 {
        call(&mut con, "RL.TAKE", "1 k 10 1 60000");
        call(&mut con, "CL.THROTTLE", "u 5 1 60");
    }
    let exporter = Exporter::start(&s.url());
    let page = exporter.scrape();
    for quantile in ["0.5", "0.99", "0.999"] {
        let series = format!("rl_command_latency_seconds{{command=\"rl.take\",quantile=\"{quantile}\"}}");
        let seconds = value(&page, &series).unwrap_or_else(|| panic!("{series} missing:\n{page}"));
        assert!(seconds > 0.0 && seconds < 1.0, "{series} {seconds}");
    }
    assert_eq!(value(&page, "rl_command_latency_seconds_count{command=\"rl.take\"}"), Some(50.0), "{page}");
    assert_eq!(value(&page, "rl_command_latency_seconds_count{command=\"cl.throttle\"}"), Some(50.0), "{page}");
    assert!(value(&page, "rl_command_latency_seconds_sum{command=\"rl.take\"}").is_some_and(|s| s > 0.0), "{page}");
    assert_eq!(value(&page, "rl_maxmemory_bytes"), Some(4.0 * 1024.0 * 1024.0), "{page}");
    assert_eq!(value(&page, "rl_maxmemory_policy{policy=\"allkeys-lru\"}"), Some(1.0), "{page}");
    assert_eq!(value(&page, "rl_evicted_keys_total"), Some(0.0), "{page}");
    // allkeys-lru evicts the limiter's keys like any cache entry: fill the
    // server past maxmemory (bounded) and the evictions are counted.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut batch = 0u32;
    while s.info("stats", "evicted_keys") == "0" {
        assert!(Instant::now() < deadline && batch < 1_000, "nothing evicted after {batch} batches");
        let mut pipe = redis::pipe();
        for i in 0..500 {
            // 100 a minute, one back a minute: each key lives a minute.
            pipe.cmd("RL.TAKE").arg(1).arg(format!("rl:{{s{batch}-{i}}}:minute")).arg(100).arg(1).arg(60_000);
        }
        let _: redis::Value = pipe.query(&mut con).unwrap();
        batch += 1;
    }
    let page = exporter.scrape();
    assert!(value(&page, "rl_evicted_keys_total").is_some_and(|n| n > 0.0), "{page}");
}

/// A scrape the server refuses serves `rl_up 0` and logs the server's
/// answer, with the URL's password redacted everywhere.
#[test]
fn a_failed_scrape_says_why_and_never_the_password() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("no-info")
        .arg("on")
        .arg(">s3cret-pw")
        .arg("~*")
        .arg("+@all")
        .arg("-info")
        .query(&mut con)
        .unwrap();
    let url = format!("redis://no-info:s3cret-pw@127.0.0.1:{}/", s.port);
    let exporter = Exporter::start(&url);
    let page = exporter.scrape();
    assert!(page.lines().any(|l| l == "rl_up 0"), "{page}");
    let log = exporter.log();
    assert!(log.contains("INFO rl") && log.contains("no permissions to run the 'info' command"), "why:\n{log}");
    assert!(log.contains("redis://no-info:***@127.0.0.1"), "{log}");
    // A failure that goes on is not logged on every scrape.
    exporter.scrape();
    assert_eq!(exporter.log().matches("failed, serving rl_up 0").count(), 1, "{}", exporter.log());
    let _: () = redis::cmd("ACL").arg("SETUSER").arg("no-info").arg("+info").query(&mut con).unwrap();
    let page = exporter.scrape();
    assert!(page.lines().any(|l| l == "rl_up 1"), "{page}");
    let log = exporter.log();
    assert!(log.contains("answers again"), "{log}");
    assert!(!log.contains("s3cret-pw"), "a password in the log:\n{log}");
}

/// A client that connects and sends nothing is closed after a short wait,
/// and more connections than the exporter serves at once wait in the
/// backlog: a scraper's port cannot be held by idle sockets.
#[test]
fn idle_connections_are_closed_and_scrapes_still_answered() {
    use std::io::Read;
    let s = Server::start(&[]);
    let exporter = Exporter::start(&s.url());
    exporter.scrape();
    let idle: Vec<std::net::TcpStream> =
        (0..20).map(|_| std::net::TcpStream::connect(("127.0.0.1", exporter.port)).unwrap()).collect();
    let started = Instant::now();
    let mut first = idle[0].try_clone().unwrap();
    first.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = [0u8; 64];
    let read = first.read(&mut buf);
    let closed = matches!(&read, Ok(0)) || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset);
    assert!(closed && started.elapsed() < Duration::from_secs(10), "{read:?} after {:?}", started.elapsed());
    // Past the idle ones (closed in turn), a scrape is answered.
    assert!(exporter.scrape().lines().any(|l| l == "rl_up 1"));
    drop(idle);
}
