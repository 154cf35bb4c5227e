//! The binary refuses flags that break the never-over argument, by name and
//! with the relation they break (status 2, before it touches a region),
//! warns about those that only weaken it, and refuses a region whose
//! server lacks the module unless its gateways run the Lua scripts
//! (`--redis-backend lua` or `auto`).

mod binary;

use std::time::Duration;

use binary::{base_args, http_get, run_to_end, RulesFile, Running, FAST};
use testkit::{PlainServer, Server};

const NOWHERE: &str = "redis://127.0.0.1:1";

fn refused(extra: &[&str]) -> String {
    let rules = RulesFile::new(&["eu", "us", "ap"]);
    let regions = [("eu", NOWHERE.into()), ("us", NOWHERE.into()), ("ap", NOWHERE.into())];
    let mut args = base_args(&rules, &regions);
    args.extend(extra.iter().map(|s| s.to_string()));
    let (status, log) = run_to_end(&args);
    assert_eq!(status.code(), Some(2), "{extra:?} must be refused:\n{log}");
    log
}

fn assert_names(log: &str, parts: &[&str]) {
    for part in parts {
        assert!(log.contains(part), "{part:?} missing in:\n{log}");
    }
}

#[test]
fn no_wait_between_lowering_and_raising_is_refused() {
    let log = refused(&["--gateway-refresh", "0s", "--gateway-timeout", "0s"]);
    assert_names(&log, &["--gateway-refresh (0s) must be above 0"]);
    let log = refused(&["--gateway-timeout", "0s"]);
    assert_names(&log, &["--gateway-timeout (0s) must be above 0"]);
}

#[test]
fn stale_after_shorter_than_a_round_apart_is_refused() {
    let log = refused(&["--stale-after", "0s"]);
    assert_names(&log, &["--stale-after (0s) must be longer than", "fall back to the fixed split between two rounds"]);
    let log = refused(&["--stale-after", "1s", "--interval", "10s"]);
    assert_names(&log, &["--stale-after (1s) must be longer than", "--interval (10s)"]);
}

#[test]
fn a_settle_shorter_than_a_rounds_writes_is_refused() {
    let log = refused(&["--settle", "0s"]);
    assert_names(&log, &["--settle (0s) must be longer than", "--timeout", "--gateway-refresh"]);
}

#[test]
fn down_naming_every_region_is_refused() {
    let log = refused(&["--down", "eu", "--down", "us", "--down", "ap"]);
    assert_names(&log, &["--down names every region", "0"]);
}

#[test]
fn an_empty_key_and_epoch_0_are_refused() {
    assert_names(&refused(&["--key", ""]), &["--key must not be empty"]);
    assert_names(&refused(&["--epoch", "0"]), &["--epoch 0", "from 1 to"]);
    assert_names(&refused(&["--interval", "0s"]), &["--interval (0s) must be above 0"]);
    assert_names(&refused(&["--timeout", "0s"]), &["--timeout (0s) must be above 0"]);
}

#[test]
fn a_short_grace_and_a_down_majority_are_warned_and_run() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start(&[])).collect();
    let rules = RulesFile::new(&["eu", "us", "ap"]);
    let regions: Vec<(&str, String)> = ["eu", "us", "ap"].into_iter().zip(servers.iter().map(|s| s.url())).collect();
    let mut args = base_args(&rules, &regions);
    args.extend(FAST.iter().map(|s| s.to_string()));
    args.extend(["--grace", "0s", "--down", "us", "--down", "ap"].map(String::from));
    let mut running = Running::start(&args);
    let log = running.wait_log(Duration::from_secs(10), |l| l.contains(" round "));
    assert_names(&log, &["--grace (0s)", "--down names a majority"]);
    assert!(running.is_running());
}

#[test]
fn a_region_without_the_module_is_refused_by_name() {
    let (with, without) = (Server::start(&[]), PlainServer::start());
    let rules = RulesFile::new(&["eu", "us"]);
    let mut args = base_args(&rules, &[("eu", with.url()), ("us", without.url())]);
    args.extend(FAST.iter().map(|s| s.to_string()));
    let (status, log) = run_to_end(&args);
    assert_eq!(status.code(), Some(2), "{log}");
    assert_names(&log, &["region us", &format!("127.0.0.1:{}", without.port), "redis-rl module"]);
    assert_eq!(redis::cmd("EXISTS").arg("rl:shares").query::<i64>(&mut without.con()).unwrap(), 0, "nothing written");
}

/// A round's log line that wrote region us's table (`versions=...,us=N`).
fn wrote_us(log: &str) -> bool {
    log.lines().any(|l| l.contains(" round ") && l.contains(",us=") && !l.contains(",us=-"))
}

#[test]
fn a_region_without_the_module_is_balanced_when_its_gateways_run_the_scripts() {
    let (with, without) = (Server::start(&[]), PlainServer::start());
    let rules = RulesFile::new(&["eu", "us"]);
    for backend in ["lua", "auto"] {
        let mut args = base_args(&rules, &[("eu", with.url()), ("us", without.url())]);
        args.extend(FAST.iter().map(|s| s.to_string()));
        args.extend(["--redis-backend".to_string(), backend.to_string()]);
        let metrics = testkit::free_port();
        args.extend(["--metrics".to_string(), format!("127.0.0.1:{metrics}")]);
        let mut running = Running::start(&args);
        let log = running.wait_log(Duration::from_secs(20), wrote_us);
        assert!(running.is_running(), "{log}");
        assert_names(&log, &[&format!("--redis-backend {backend}")]);
        let (_, page) = http_get(metrics, "/metrics");
        if backend == "auto" {
            // Said, region by region: never a silent fallback.
            assert_names(&log, &["region=us", "no redis-rl module there", "Lua scripts"]);
            assert!(!log.contains("region=eu server"), "{log}");
            // And in the metrics: what the check found in each region.
            assert_names(
                &page,
                &[
                    "rl_balancer_redis_backend{region=\"eu\",backend=\"module\"} 1\n",
                    "rl_balancer_redis_backend{region=\"us\",backend=\"lua\"} 1\n",
                ],
            );
        } else {
            assert_names(
                &page,
                &[
                    "rl_balancer_redis_backend{region=\"eu\",backend=\"lua\"} 1\n",
                    "rl_balancer_redis_backend{region=\"us\",backend=\"lua\"} 1\n",
                ],
            );
        }
        let written: i64 = redis::cmd("EXISTS").arg("rl:shares").query(&mut without.con()).unwrap();
        assert_eq!(written, 1, "the share table written in the region without the module:\n{log}");
    }
    let mut args = base_args(&rules, &[("eu", with.url()), ("us", without.url())]);
    args.extend(["--redis-backend", "scripts"].map(String::from));
    let (status, log) = run_to_end(&args);
    assert_eq!(status.code(), Some(2), "{log}");
    assert_names(&log, &["'scripts': one of module, lua, auto"]);
}
