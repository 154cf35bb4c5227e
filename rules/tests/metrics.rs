//! `rlctl metrics` scraped for real, and the example alert rules checked
//! against what it serves.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::{call, free_port, Server};
use yaml_rust2::YamlLoader;

struct Exporter(Child);

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn exporter(redis: &str, port: u16) -> Exporter {
    let child = Command::new(env!("CARGO_BIN_EXE_rlctl"))
        .args(["metrics", "--redis", redis, "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rlctl metrics");
    Exporter(child)
}

/// GET `path` from the exporter, once it listens.
fn get(port: u16, path: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "the exporter does not listen: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn rlctl_metrics_serves_the_counters_prometheus_scrapes() {
    let mut s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 k 1 1 60000");
    call(&mut con, "RL.TAKE", "1 k 1 1 60000");
    let port = free_port();
    let _exporter = exporter(&s.url(), port);
    let page = get(port, "/metrics");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("text/plain; version=0.0.4"), "{page}");
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
    assert!(!page.lines().any(|l| l.starts_with("rl_share_table_age_seconds ")), "no share table, no age:\n{page}");
    // A share table written 90 s ago by the server's clock (a balancer
    // that stopped): its age is served, for the alarm above 60 s.
    let now_ms: u64 = {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
        secs * 1000 + micros / 1000
    };
    let _: () = redis::cmd("HSET")
        .arg(rl_rules::SHARES_KEY)
        .arg("written_at")
        .arg(now_ms - 90_000)
        .arg("version")
        .arg(7)
        .query(&mut con)
        .unwrap();
    let page = get(port, "/metrics");
    let age: f64 = page
        .lines()
        .find_map(|l| l.strip_prefix("rl_share_table_age_seconds "))
        .unwrap_or_else(|| panic!("no age:\n{page}"))
        .parse()
        .unwrap();
    assert!((90.0..100.0).contains(&age), "{age}");
    assert!(page.lines().any(|l| l == "rl_share_table_version 7"), "{page}");
    assert!(get(port, "/").starts_with("HTTP/1.1 404"));
    // Redis gone: the exporter answers, and says so.
    s.kill();
    let page = get(port, "/metrics");
    assert!(page.lines().any(|l| l == "rl_up 0"), "{page}");
}

#[test]
fn the_example_alerts_parse_and_use_served_metrics() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../prometheus-alerts.yml")).unwrap();
    let docs = YamlLoader::load_from_str(&text).expect("valid YAML");
    let seen = rl_rules::exporter::SharesSeen { age_seconds: 1.0, version: 1 };
    let served = rl_rules::exporter::render("", "", Some(seen));
    let families: Vec<&str> = served.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    let rules = docs[0]["groups"][0]["rules"].as_vec().expect("groups[0].rules");
    assert!(rules.len() >= 6, "{} rules", rules.len());
    for rule in rules {
        let name = rule["alert"].as_str().expect("alert");
        let expr = rule["expr"].as_str().unwrap_or_else(|| panic!("{name}: expr"));
        let wait = rule["for"].as_str().unwrap_or_else(|| panic!("{name}: for"));
        assert!(wait.ends_with(['s', 'm', 'h']) && wait[..wait.len() - 1].parse::<u32>().is_ok(), "{name}: for {wait}");
        assert!(["page", "ticket"].contains(&rule["labels"]["severity"].as_str().unwrap_or("")), "{name}: severity");
        assert!(rule["annotations"]["summary"].as_str().is_some_and(|s| !s.is_empty()), "{name}: summary");
        assert_eq!(expr.matches('(').count(), expr.matches(')').count(), "{name}: {expr}");
        let metrics: Vec<&str> =
            expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("rl_")).collect();
        assert!(!metrics.is_empty(), "{name}: no metric of the exporter in {expr}");
        for m in metrics {
            assert!(families.contains(&m), "{name}: {m} is not served by rlctl metrics");
        }
    }
}
