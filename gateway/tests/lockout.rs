//! A subject is never locked out by what a gateway remembers: a refusal's
//! retry time is the module's, a remembered refusal is held a bounded time
//! before Redis is asked again, and `Limiter::forget_subject` drops a
//! subject's local state at once (what `rlctl unlock` asks every gateway).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{calls, config, on_manual_clock};
use rl_gateway::{Backend, Config, Limiter, LimiterConfig, ManualClock, Policy, Rule, Source};
use testkit::Server;

const DAY: Duration = Duration::from_secs(86_400);

/// 3 a day on a fleet of 300 gateways.
fn three_a_day() -> Policy {
    Policy::builder("login").rule(Rule::new("daily", 3, 3, DAY)).build().unwrap()
}

/// On a manual clock.
fn fleet_of_300(url: String) -> (LimiterConfig, Arc<ManualClock>) {
    let (c, clock) = on_manual_clock(config(url, Backend::Module));
    (LimiterConfig { gateways: 300, ..LimiterConfig::new(c) }, clock)
}

/// Deletes every key of `policy` for `subject` on the server.
fn del_keys(s: &Server, policy: &Policy, subject: &str) {
    let keys = policy.keys(subject).unwrap();
    let _: u64 = redis::cmd("DEL").arg(&keys).query(&mut s.con()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_subject_drops_deny_entries_leases_and_fallback_buckets() {
    let s = Server::start(&[]);
    let (c, _clock) = fleet_of_300(s.url());
    let l = Limiter::new(c).unwrap();
    let login = three_a_day();
    for _ in 0..3 {
        assert!(l.check(&login, "cust").await.unwrap().allowed);
    }
    assert_eq!(l.check(&login, "cust").await.unwrap().source, Source::Redis);
    assert_eq!(l.check(&login, "cust").await.unwrap().source, Source::DenyCache);
    // A busy policy of the same subject holds a lease (1 s of 100,000/s
    // over 300 gateways: 333 tokens), with a shadow rule of its own.
    let busy = Policy::builder("api")
        .rule(Rule::per_second("s", 100_000))
        .rule(Rule::per_second("trial", 100_000).shadow())
        .build()
        .unwrap();
    assert!(l.check(&busy, "cust").await.unwrap().allowed);
    assert_eq!(l.check(&busy, "cust").await.unwrap().source, Source::Lease);
    // Someone else's state stays.
    for _ in 0..4 {
        l.check(&login, "other").await.unwrap();
    }

    // The operator clears the keys; the gateway still remembers the refusal.
    del_keys(&s, &login, "cust");
    assert_eq!(l.check(&login, "cust").await.unwrap().source, Source::DenyCache);
    // One deny entry, two leases (the enforced group's and the shadow's).
    assert_eq!(l.forget_subject("cust"), 3);
    assert_eq!(l.forget_subject("cust"), 0, "nothing left to drop");
    let d = l.check(&login, "cust").await.unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Redis), "asked Redis again at once");
    // The dropped leases were never handed back: a new one is taken.
    assert_eq!(calls(&s, "rl.refund"), 0);
    assert_eq!(l.check(&busy, "cust").await.unwrap().source, Source::Redis);
    assert_eq!(l.check(&login, "other").await.unwrap().source, Source::DenyCache, "other subjects keep theirs");

    // Fallback buckets: a gateway whose Redis is unreachable.
    let dead = Limiter::new(Config { breaker_trip_after: 1, ..config("redis://127.0.0.1:1/".into(), Backend::Module) })
        .unwrap();
    for _ in 0..3 {
        assert_eq!(dead.check(&login, "cust").await.unwrap().source, Source::Fallback);
    }
    assert!(dead.check(&busy, "cust").await.unwrap().allowed);
    // The login group's and the busy policy's two (enforced and shadow).
    assert_eq!(dead.forget_subject("cust"), 3);
}

/// Past its three a day, a subject is told when the module's next token
/// comes (8 hours), counted down, on every refusal: never the 100 days a
/// fleet of 300 gateways would take to refill its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusals_retry_time_is_the_modules_never_scaled_by_the_fleet() {
    let s = Server::start(&[]);
    let (c, clock) = fleet_of_300(s.url());
    let l = Limiter::new(c).unwrap();
    let login = three_a_day();
    for _ in 0..3 {
        assert!(l.check(&login, "cust").await.unwrap().allowed);
    }
    let first = l.check(&login, "cust").await.unwrap();
    assert_eq!((first.allowed, first.source, first.remaining), (false, Source::Redis, 0));
    let module = first.retry_after.unwrap();
    assert!(module <= DAY / 3 && module > DAY / 3 - Duration::from_secs(60), "{module:?}");
    for n in 1..=9 {
        clock.advance(Duration::from_millis(100));
        let d = l.check(&login, "cust").await.unwrap();
        assert_eq!((d.allowed, d.source, d.remaining), (false, Source::DenyCache, 0));
        assert_eq!(d.retry_after, Some(module - n * Duration::from_millis(100)), "refusal {n}");
        assert!(d.reset_after >= d.retry_after.unwrap(), "{d:?}");
    }
}

/// A remembered refusal is held at most `deny_hold_max`, then Redis is
/// asked again: a subject whose keys were cleared is admitted without any
/// gateway being told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_refusal_is_held_at_most_deny_hold_max() {
    let s = Server::start(&[]);
    let hold_max = LimiterConfig::new(Config::standalone("redis://127.0.0.1/")).deny_hold_max;
    assert_eq!(hold_max, Duration::from_secs(5), "the documented default");
    for hold_max in [hold_max, Duration::from_secs(30)] {
        let (c, clock) = fleet_of_300(s.url());
        let c = LimiterConfig { deny_hold_max: hold_max, ..c };
        let l = Limiter::new(c).unwrap();
        let login = three_a_day();
        del_keys(&s, &login, "cust");
        for _ in 0..3 {
            assert!(l.check(&login, "cust").await.unwrap().allowed);
        }
        assert_eq!(l.check(&login, "cust").await.unwrap().source, Source::Redis);
        del_keys(&s, &login, "cust");
        let takes = calls(&s, "rl.take");
        clock.advance(hold_max - Duration::from_millis(1));
        assert_eq!(l.check(&login, "cust").await.unwrap().source, Source::DenyCache);
        assert_eq!(calls(&s, "rl.take"), takes, "held: no call");
        clock.advance(Duration::from_millis(1));
        let d = l.check(&login, "cust").await.unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Redis), "asked again after {hold_max:?}");
    }
}

#[test]
fn deny_hold_max_must_be_above_zero() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let c = LimiterConfig {
        deny_hold_max: Duration::ZERO,
        ..LimiterConfig::new(Config::standalone("redis://127.0.0.1:1/"))
    };
    let e = Limiter::new(c).err().expect("refused");
    assert!(e.to_string().contains("deny_hold_max must be above zero"), "{e}");
}
