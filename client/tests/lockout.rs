//! A subject is never locked out by what a gateway remembers: a refusal's
//! retry time is the module's, a remembered refusal is held a bounded time
//! before Redis is asked again, and `Limiter::forget_subject` drops a
//! subject's local state at once (what `rlctl unlock` asks every gateway).

mod common;

use std::time::Duration;

use common::{calls, config, on_manual_clock};
use rl_client::{Backend, Config, Limiter, Policy, Rule, Source};
use testkit::Server;

const DAY: Duration = Duration::from_secs(86_400);

/// 3 a day on a fleet of 300 gateways.
fn three_a_day() -> Policy {
    Policy::builder("login").rule(Rule::new("daily", 3, 3, DAY)).build().unwrap()
}

fn fleet_of_300(url: String) -> Config {
    Config { gateways: 300, ..config(url, Backend::Module) }
}

/// Deletes every key of `policy` for `subject` on the server.
fn del_keys(s: &Server, policy: &Policy, subject: &str) {
    let keys = policy.keys(subject).unwrap();
    let _: u64 = redis::cmd("DEL").arg(&keys).query(&mut s.con()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_subject_drops_deny_entries_leases_and_fallback_buckets() {
    let s = Server::start(&[]);
    let (c, _clock) = on_manual_clock(fleet_of_300(s.url()));
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
