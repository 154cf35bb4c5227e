//! Fencing epochs are exact integers up to a ceiling, end to end: compared
//! exactly in Redis (no float), refused above the ceiling by name, a stored
//! epoch that is corrupt or above it reported as such, and an operator's
//! `--take-over` claims over it without editing `rl:shares` by hand.

mod binary;

use std::time::Duration;

use binary::{base_args, run_to_end, RulesFile, Running, FAST};
use rl_balancer::store::{self, DEFAULT_KEY};
use testkit::{PlainServer, Server};

const CEILING: &str = "9223372036854775807";

fn hset(url: &str, field: &str, value: &str) {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: () = redis::cmd("HSET").arg(DEFAULT_KEY).arg(field).arg(value).query(&mut con).unwrap();
}

fn hget(url: &str, field: &str) -> Option<String> {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("HGET").arg(DEFAULT_KEY).arg(field).query(&mut con).unwrap()
}

/// One region, `eu`, on `server`, with the fast timings and `extra` flags.
fn args(rules: &RulesFile, server: &Server, extra: &[&str]) -> Vec<String> {
    let mut a = base_args(rules, &[("eu", server.url())]);
    a.extend(FAST.iter().chain(extra).map(|s| s.to_string()));
    a
}

fn planned_round(log: &str) -> bool {
    log.lines().any(|l| l.contains(" round ") && l.contains("reached=1") && l.contains("held=\"-\""))
}

#[tokio::test]
async fn epochs_above_2_pow_53_compare_exactly() {
    let server = PlainServer::start();
    let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    // 2^53 + 1 and 2^53 are one double: a float comparison lets the older in.
    store::claim(&mut con, DEFAULT_KEY, 9_007_199_254_740_993).await.unwrap();
    let e = store::claim(&mut con, DEFAULT_KEY, 9_007_199_254_740_992).await.unwrap_err();
    assert!(e.to_string().contains("epoch 9007199254740992 is below 9007199254740993"), "{e}");
    let e = store::write(&mut con, DEFAULT_KEY, 9_007_199_254_740_992, &Default::default()).await.unwrap_err();
    assert!(e.to_string().contains("epoch 9007199254740992 is below 9007199254740993"), "{e}");
    assert_eq!(store::claim(&mut con, DEFAULT_KEY, 9_007_199_254_740_994).await.unwrap(), 9_007_199_254_740_993);
    let read = store::sync(&mut con, DEFAULT_KEY, &[]).await.unwrap();
    assert_eq!(hget(&server.url(), "epoch").as_deref(), Some("9007199254740994"));
    assert!(format!("{:?}", read.epoch).contains("9007199254740994"), "{:?}", read.epoch);
}

#[test]
fn an_epoch_flag_above_the_ceiling_is_refused_by_name() {
    let rules = RulesFile::new(&["eu"]);
    for epoch in ["18446744073709551615", "9223372036854775808"] {
        let mut a = base_args(&rules, &[("eu", "redis://127.0.0.1:1".into())]);
        a.extend(["--epoch".into(), epoch.into()]);
        let (status, log) = run_to_end(&a);
        assert_eq!(status.code(), Some(2), "{log}");
        assert!(log.contains(&format!("--epoch {epoch}")) && log.contains(CEILING), "{log}");
    }
}

#[test]
fn an_epoch_above_2_pow_53_is_kept_exactly_and_a_lower_one_is_fenced() {
    let server = Server::start(&[]);
    let rules = RulesFile::new(&["eu"]);
    let mut first = Running::start(&args(&rules, &server, &["--epoch", "9007199254740993"]));
    let log = first.wait_log(Duration::from_secs(10), planned_round);
    assert!(log.contains("epoch=9007199254740993"), "{log}");
    drop(first);
    assert_eq!(hget(&server.url(), "epoch").as_deref(), Some("9007199254740993"));
    // One below it is older: fenced at its first claim, and told why.
    let (status, log) = run_to_end(&args(&rules, &server, &["--epoch", "9007199254740992"]));
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("--epoch 9007199254740992 is below 9007199254740993"), "{log}");
    // A balancer without --epoch picks above it.
    let mut next = Running::start(&args(&rules, &server, &[]));
    next.wait_log(Duration::from_secs(10), planned_round);
    let stored: u64 = hget(&server.url(), "epoch").unwrap().parse().unwrap();
    assert!(stored > 9_007_199_254_740_993, "{stored}");
}

/// Epochs a balancer never writes: above the ceiling (written by an older
/// rl-balancer, which had none), or not an integer at all.
#[test]
fn a_stored_epoch_that_is_corrupt_or_above_the_ceiling_is_reported_then_taken_over() {
    let rules = RulesFile::new(&["eu"]);
    for (stored, what) in [
        ("18446744073709551615", "above the ceiling"),
        ("1e300", "not an integer"),
        ("abc", "not an integer"),
        ("-1", "not an integer"),
    ] {
        let server = Server::start(&[]);
        hset(&server.url(), "epoch", stored);
        let mut locked = Running::start(&args(&rules, &server, &[]));
        let log = locked.wait_log(Duration::from_secs(10), |l| l.contains("--take-over"));
        let line = binary::lines_with(&log, "--take-over").join("\n");
        for part in ["region=eu", DEFAULT_KEY, "epoch", stored, what] {
            assert!(line.contains(part), "{part:?} missing in {line}");
        }
        assert!(locked.is_running(), "not fenced off: nothing else runs\n{log}");
        for wrong in ["is below", "took over", "region unreachable"] {
            assert!(!log.contains(wrong), "{wrong:?} in\n{log}");
        }
        drop(locked);
        assert_eq!(hget(&server.url(), "epoch").as_deref(), Some(stored), "left alone without --take-over");
        // The operator takes over deliberately: the epoch replaced is named.
        let mut taking = Running::start(&args(&rules, &server, &["--take-over"]));
        let log = taking.wait_log(Duration::from_secs(10), planned_round);
        let took = binary::lines_with(&log, "taken over").join("\n");
        assert!(took.contains("region=eu") && took.contains(stored), "{log}");
        drop(taking);
        let now: u64 = hget(&server.url(), "epoch").unwrap().parse().unwrap();
        assert!(now <= CEILING.parse().unwrap(), "{now}");
        // And a plain balancer after it runs as usual, above that epoch.
        let mut after = Running::start(&args(&rules, &server, &[]));
        let log = after.wait_log(Duration::from_secs(10), planned_round);
        assert!(!log.contains("--take-over") && !log.contains("corrupt"), "{log}");
    }
}

/// An epoch at the ceiling leaves no room above it: said so, and
/// `--take-over` starts over from the bottom.
#[test]
fn no_epoch_left_above_the_highest_is_said_and_taken_over() {
    let server = Server::start(&[]);
    let rules = RulesFile::new(&["eu"]);
    hset(&server.url(), "epoch", CEILING);
    let (status, log) = run_to_end(&args(&rules, &server, &[]));
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains(CEILING) && log.contains("--take-over"), "{log}");
    let mut taking = Running::start(&args(&rules, &server, &["--take-over"]));
    taking.wait_log(Duration::from_secs(10), planned_round);
    let now: u64 = hget(&server.url(), "epoch").unwrap().parse().unwrap();
    assert!(now < 1 << 21, "from the bottom: {now}");
}
