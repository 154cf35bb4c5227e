//! The alert rules: valid for promtool, unit-tested by promtool against
//! their own test file (each alert fires where expected, per instance), on
//! metrics the exporters serve, and each explained in docs/operations.md.

mod support;

use std::path::Path;

use support::{expected_metrics, listed, promql_metrics, promtool, repo_file};
use yaml_rust2::YamlLoader;

/// Where the rules and their tests are: promtool finds `rule_files` from there.
fn rules_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/prometheus"))
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let (ok, out) = promtool(rules_dir(), &["check", "rules", "alerts.yml"]);
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = promtool(rules_dir(), &["test", "rules", "alerts.test.yml"]);
    assert!(ok, "promtool test rules:\n{out}");
}

#[test]
fn every_alert_is_tested_explained_and_on_served_metrics() {
    let rules = YamlLoader::load_from_str(&repo_file("deploy/prometheus/alerts.yml")).expect("valid YAML");
    let tests = YamlLoader::load_from_str(&repo_file("deploy/prometheus/alerts.test.yml")).expect("valid YAML");
    let readme = repo_file("docs/operations.md");
    let sections = expected_metrics();
    let tested: Vec<String> = tests[0]["tests"]
        .as_vec()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_vec().cloned().unwrap_or_default())
        .filter(|a| a["exp_alerts"].as_vec().is_some_and(|e| !e.is_empty()))
        .filter_map(|a| a["alertname"].as_str().map(str::to_owned))
        .collect();
    let mut count = 0;
    for group in rules[0]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            count += 1;
            let name = rule["alert"].as_str().expect("alert");
            let expr = rule["expr"].as_str().unwrap_or_else(|| panic!("{name}: expr"));
            assert!(
                ["page", "ticket"].contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                "{name}: severity"
            );
            assert!(rule["annotations"]["summary"].as_str().is_some_and(|s| !s.is_empty()), "{name}: summary");
            assert!(rule["annotations"]["runbook"].as_str().is_some_and(|s| !s.is_empty()), "{name}: runbook");
            assert!(tested.iter().any(|t| t == name), "{name} never fires in deploy/prometheus/alerts.test.yml");
            assert!(readme.contains(&format!("`{name}`")), "{name} is not in docs/operations.md's alert list");
            let metrics = promql_metrics(expr);
            assert!(!metrics.is_empty(), "{name}: no metric in {expr}");
            for m in metrics {
                assert!(listed(&m, &sections), "{name}: {m} is in no section of deploy/grafana/metrics.txt");
            }
        }
    }
    assert!(count >= 15, "{count} alerts");
}

#[test]
fn metric_names_are_found_in_promql() {
    let expr = "sum by (instance, command) (rate(rl_command_latency_seconds_sum{instance=~\"$instance\"}[5m])) \
                / on (instance) group_left (policy) rl_maxmemory_bytes > 0.7 and up{job=\"x\"} == 0 or 1e6";
    assert_eq!(promql_metrics(expr), ["rl_command_latency_seconds_sum", "rl_maxmemory_bytes", "up"]);
    assert_eq!(promql_metrics("absent(up{job=\"redis-rl\"})"), ["up"]);
}
