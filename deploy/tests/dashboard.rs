//! The Grafana dashboard queries only what the exporters serve: every
//! metric of deploy/grafana/redis-rl.json is in deploy/grafana/metrics.txt, and that list
//! is what the module's exporter, rl-client's events and the relay serve.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{expected_metrics, listed, promql_metrics, repo_file};

fn section<'a>(sections: &'a [(String, Vec<String>)], name: &str) -> &'a [String] {
    &sections.iter().find(|(s, _)| s == name).unwrap_or_else(|| panic!("no [{name}] in deploy/grafana/metrics.txt")).1
}

/// The family names after `# TYPE` in Prometheus text.
fn families(text: &str) -> Vec<String> {
    text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).map(str::to_owned).collect()
}

fn sorted(mut names: Vec<String>) -> Vec<String> {
    names.sort();
    names
}

#[test]
fn the_list_is_what_each_component_serves() {
    let sections = expected_metrics();
    let seen = rlctl::exporter::SharesSeen { age_seconds: 1.0, version: 1 };
    let module = families(&rlctl::exporter::render("", "", Some(seen)));
    assert_eq!(sorted(module), sorted(section(&sections, "module").to_vec()), "rlctl metrics' families");
    let gateway: Vec<String> = rl_gateway::Event::ALL.iter().map(|e| format!("ratelimit_{}_total", e.name())).collect();
    assert_eq!(sorted(gateway), sorted(section(&sections, "gateway").to_vec()), "rl-client's events");
    let relay = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let timeout = Duration::from_millis(50);
        let upstream = rl_relay::upstream::Upstream::open(
            &["redis://127.0.0.1:1/".to_owned()],
            false,
            &Default::default(),
            timeout,
        )
        .unwrap();
        let options = rl_relay::relay::Options { timeout, ..Default::default() };
        let relay =
            std::sync::Arc::new(rl_relay::relay::Relay::new(rl_relay::pool::Pools::default(), upstream, options));
        let rls_options = rl_relay::rls::Options {
            config_path: "rls.yaml".into(),
            merge_domains: false,
            prefix: "rl:rls:".into(),
            timeout,
            headers: Default::default(),
            global_shadow: false,
            token: None,
            poll: timeout,
            ..Default::default()
        };
        let rls = rl_relay::rls::Rls::new(relay.clone(), false, Default::default(), rls_options);
        (families(&relay.metrics()), families(&rls.metrics()))
    });
    let (relay, rls) = relay;
    assert_eq!(sorted(relay), sorted(section(&sections, "relay").to_vec()), "rl-relay --metrics' families");
    assert_eq!(sorted(rls), sorted(section(&sections, "rls").to_vec()), "rl-relay --rls-listen's families");
    // The balancer's section is checked against a running rl-balancer in
    // balancer/tests/ops.rs (rl-balancer depends on rlctl, not back).
    assert!(!section(&sections, "balancer").is_empty());
    assert_eq!(section(&sections, "prometheus"), ["up"]);
}

/// Every `expr` under `value`, with where it is.
fn exprs(value: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", Value::String(e)) => out.push((at.to_owned(), e.clone())),
                    ("query", Value::String(q)) if q.starts_with("label_values(") => {
                        out.push((at.to_owned(), q.clone()))
                    }
                    _ => {
                        let title = map.get("title").and_then(Value::as_str).unwrap_or(at);
                        exprs(v, title, out);
                    }
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs(v, at, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_queries_only_listed_metrics_of_every_component() {
    let dashboard: Value =
        serde_json::from_str(&repo_file("deploy/grafana/redis-rl.json")).expect("the dashboard is JSON");
    let sections = expected_metrics();
    let mut all = Vec::new();
    exprs(&dashboard, "dashboard", &mut all);
    assert!(all.len() >= 20, "{} queries", all.len());
    let mut used = Vec::new();
    for (panel, expr) in &all {
        // label_values(metric, label) reads the metric too.
        let expr = expr.strip_prefix("label_values(").map_or(expr.as_str(), |e| e.split(',').next().unwrap_or(e));
        let names = promql_metrics(expr);
        assert!(!names.is_empty(), "panel '{panel}': no metric in {expr}");
        for name in names {
            assert!(listed(&name, &sections), "panel '{panel}': {name} is in no section of deploy/grafana/metrics.txt");
            used.push(name);
        }
    }
    for component in ["module", "gateway", "relay"] {
        assert!(
            section(&sections, component)
                .iter()
                .any(|n| used.iter().any(|u| listed(u, &[(String::new(), vec![n.clone()])]))),
            "the dashboard shows nothing of the {component}"
        );
    }
    assert!(used.iter().any(|u| u == "rl_share_table_age_seconds"), "the balancer's heartbeat is not shown");
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] != "row" {
            assert!(panel["description"].as_str().is_some_and(|d| !d.is_empty()), "{}: no description", panel["title"]);
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{}: not on the datasource variable",
                panel["title"]
            );
        }
    }
}
