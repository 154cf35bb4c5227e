//! What an operator runs the balancer with: its own /metrics (rounds, the
//! age of the last good one, regions reached, rule reloads) as the
//! dashboard's list names them, the rules reloaded on SIGHUP (a broken file
//! keeps the rules in force, logged and counted), and a log line on SIGTERM
//! before a clean exit.

mod binary;

use std::time::{Duration, Instant};

use binary::{base_args, http_get, try_get, RulesFile, Running, FAST};
use testkit::{free_port, Server};

fn metric(text: &str, name: &str) -> f64 {
    find(text, name).unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

fn find(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Scrapes until `done` holds (10 s at most).
fn scrape_until(port: u16, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // Before the balancer listens: nothing yet.
        let text = try_get(port, "/metrics").map(|r| r.1).unwrap_or_default();
        if done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `[balancer]` section of deploy/grafana/metrics.txt.
fn listed_for_the_balancer() -> Vec<String> {
    let list = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/metrics.txt")).unwrap();
    let section = list.split("[balancer]").nth(1).expect("a [balancer] section");
    let section = section.split("\n[").next().unwrap();
    let mut names: Vec<String> =
        section.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect();
    names.sort();
    names
}

#[test]
fn metrics_reload_on_sighup_and_a_log_line_on_sigterm() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start(&[])).collect();
    let rules = RulesFile::new(&["eu", "us", "ap"]);
    let regions: Vec<(&str, String)> = ["eu", "us", "ap"].into_iter().zip(servers.iter().map(|s| s.url())).collect();
    let port = free_port();
    let mut args = base_args(&rules, &regions);
    args.extend(FAST.iter().map(|s| s.to_string()));
    args.extend(["--metrics".to_string(), format!("127.0.0.1:{port}")]);
    let mut running = Running::start(&args);

    let text = scrape_until(port, "two rounds", |t| find(t, "rl_balancer_rounds_total") >= Some(2.0));
    let mut families: Vec<String> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).map(str::to_owned).collect();
    families.sort();
    assert_eq!(families, listed_for_the_balancer(), "what --metrics serves is what deploy/grafana/metrics.txt lists");
    assert_eq!(metric(&text, "rl_balancer_regions"), 3.0);
    assert_eq!(metric(&text, "rl_balancer_regions_reached"), 3.0);
    assert_eq!(metric(&text, "rl_balancer_rules"), 1.0);
    assert!(metric(&text, "rl_balancer_epoch") >= 1.0);
    assert!(metric(&text, "rl_balancer_last_good_round_age_seconds") < 5.0, "{text}");
    // Each region's backend: the module, found there by the check.
    for region in ["eu", "us", "ap"] {
        assert_eq!(metric(&text, &format!("rl_balancer_redis_backend{{region=\"{region}\",backend=\"module\"}}")), 1.0);
    }
    assert_eq!(http_get(port, "/nope").0, 404);

    // A broken file: refused, counted, logged; the rule in force stays.
    let good = std::fs::read_to_string(&rules.0).unwrap();
    std::fs::write(&rules.0, "[[rules]\nid = ").unwrap();
    running.signal("HUP");
    let text =
        scrape_until(port, "a refused reload", |t| find(t, "rl_balancer_failed_rule_reloads_total") == Some(1.0));
    assert_eq!(metric(&text, "rl_balancer_rules"), 1.0);
    running.wait_log(Duration::from_secs(5), |l| l.contains("rules not reloaded, the rules in force stay"));
    // A second global rule: taken between two rounds, which go on.
    let second = good.replace("id = \"api\"", "id = \"web\"\nmatch = { endpoint = \"GET /web\" }");
    std::fs::write(&rules.0, format!("{good}\n{second}")).unwrap();
    running.signal("HUP");
    let text = scrape_until(port, "the reload", |t| find(t, "rl_balancer_rule_reloads_total") == Some(1.0));
    assert_eq!(metric(&text, "rl_balancer_rules"), 2.0);
    let rounds = metric(&text, "rl_balancer_rounds_total");
    scrape_until(port, "rounds after the reload", |t| find(t, "rl_balancer_rounds_total") >= Some(rounds + 2.0));
    let table: String = redis::cmd("HGET").arg("rl:shares").arg("table").query(&mut servers[0].con()).unwrap();
    assert!(table.contains("\"web\""), "the new rule is balanced: {table}");

    running.signal("TERM");
    let status = running.wait_exit(Duration::from_secs(10)).expect("it stops on SIGTERM");
    assert!(status.success(), "{status}");
    let log = running.log();
    assert!(log.contains("SIGTERM: stopping"), "{log}");
}
