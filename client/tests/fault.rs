//! Redis stops mid-run: fail-open rules fall back to local limits, fail-closed
//! rules refuse, the breaker stops the waiting, and both recover when the
//! server returns. Run on both backends.

mod common;

use std::time::{Duration, Instant};

use common::config;
use rl_client::{Backend, Config, Event, Limiter, Policy, Rule, Source};
use testkit::Server;

on_both_backends!(an_outage_degrades_the_limits_not_the_api, a_limiter_starts_while_redis_is_down);

fn policies() -> (Policy, Policy) {
    let api = Policy::builder("api").rule(Rule::per_hour("hourly", 10)).build().unwrap();
    let login = Policy::builder("login").rule(Rule::per_hour("attempts", 5).fail_closed()).build().unwrap();
    (api, login)
}

fn fault_config(url: String, backend: Backend) -> Config {
    Config {
        breaker_trip_after: 3,
        breaker_open_for: Duration::from_millis(300),
        fallback_slack: 2.0,
        gateways: 1,
        ..config(url, backend)
    }
}

/// Checks until `subject` is decided by Redis again; false after 20 s.
async fn until_redis_answers(l: &Limiter, p: &Policy, subject: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if l.check(p, subject).await.unwrap().source == Source::Redis {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn an_outage_degrades_the_limits_not_the_api(backend: Backend) {
    let mut s = Server::start(&[]);
    let l = Limiter::new(fault_config(s.url(), backend)).unwrap();
    let (api, login) = policies();
    assert_eq!(l.check(&api, "u").await.unwrap().source, Source::Redis);
    assert_eq!(l.check(&login, "ip").await.unwrap().source, Source::Redis);

    s.kill();
    // Fail-open: a local bucket at 10 x slack 2 / 1 gateway = 20 an hour.
    let started = Instant::now();
    let mut allowed = 0;
    for _ in 0..40 {
        let d = l.check(&api, "u").await.unwrap();
        assert_eq!((d.source, d.rule), (Source::Fallback, 0), "{d:?}");
        allowed += u32::from(d.allowed);
    }
    assert_eq!(allowed, 20, "the local limit is the share times the slack");
    // Fail-closed: refused, naming the rule, with a time to come back.
    for _ in 0..5 {
        let d = l.check(&login, "ip").await.unwrap();
        assert_eq!((d.allowed, d.source, d.rule), (false, Source::FailClosed, 0), "{d:?}");
        assert!(d.retry_after.is_some_and(|r| r > Duration::ZERO));
    }
    // The breaker opened: most of those never waited on the dead server.
    let c = l.counters();
    assert!(c.get(Event::BreakerOpened) >= 1);
    assert!((3..45).contains(&c.get(Event::Error)), "{} errors", c.get(Event::Error));
    assert_eq!(c.get(Event::Fallback), 45);
    assert_eq!(l.shards(), [("standalone".to_string(), true)]);
    assert!(started.elapsed() < Duration::from_secs(10), "45 checks took {:?}", started.elapsed());

    s.restart();
    assert!(until_redis_answers(&l, &api, "u").await, "fail-open rules recover");
    assert!(until_redis_answers(&l, &login, "ip").await, "fail-closed rules recover");
    // The restarted server kept nothing (no persistence): full buckets again.
    let d = l.check(&login, "ip").await.unwrap();
    assert_eq!((d.allowed, d.source, d.remaining), (true, Source::Redis, 3));
    assert_eq!(l.shards(), [("standalone".to_string(), false)]);
}

async fn a_limiter_starts_while_redis_is_down(backend: Backend) {
    let mut s = Server::start(&[]);
    s.kill();
    let l = Limiter::new(fault_config(s.url(), backend)).unwrap();
    let (api, login) = policies();
    let d = l.check(&api, "u").await.unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Fallback));
    assert_eq!(l.check(&login, "ip").await.unwrap().source, Source::FailClosed);
    s.restart();
    assert!(until_redis_answers(&l, &api, "u").await);
}
