//! Window and quota rules through the guarded limiter: counted by
//! RL.WINDOW (or the Lua backend's window script), evaluated after the buckets, refused from the deny cache,
//! and answered by the fallback (or refused, fail-closed) while Redis is
//! down.

mod common;

use std::time::Duration;

use common::{calls, config, on_manual_clock, tokens};
use rl_gateway::{Backend, Event, Limiter, Policy, Rule, Source, WindowMode};
use testkit::{PlainServer, Server};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// 5 an hour of burst, and a quota of 3 a day: three requests admitted by
/// Redis, the quota binding, then the fourth refused by Redis. The policy.
async fn spend_the_daily_quota(l: &Limiter) -> Policy {
    let p = Policy::builder("api")
        .rule(Rule::per_hour("hourly", 5))
        .rule(Rule::window("daily", 3, DAY, WindowMode::Fixed))
        .build()
        .unwrap();
    for left in [2, 1, 0] {
        let d = l.check(&p, "u").await.unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Redis), "{d:?}");
        assert_eq!((d.rule, d.remaining, d.limit), (1, left, 3), "the quota binds: {d:?}");
    }
    let d = l.check(&p, "u").await.unwrap();
    assert_eq!((d.allowed, d.rule, d.limit, d.source), (false, 1, 3, Source::Redis));
    assert!(d.retry_after.is_some_and(|r| r > Duration::ZERO && r <= DAY), "{d:?}");
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_is_counted_by_the_module_after_the_bucket() {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let p = spend_the_daily_quota(&l).await;
    assert_eq!((calls(&s, "rl.take"), calls(&s, "rl.window")), (4, 4));
    // Refused again from memory until the quota's window ends: no RL.TAKE
    // either, and no bucket token spent on a request that cannot pass.
    for _ in 0..10 {
        let d = l.check(&p, "u").await.unwrap();
        assert_eq!((d.allowed, d.rule, d.source), (false, 1, Source::DenyCache), "{d:?}");
    }
    assert_eq!((calls(&s, "rl.take"), calls(&s, "rl.window")), (4, 4));
    let hourly = rl_gateway::Bucket::new(p.keys("u").unwrap().remove(0), 5, 5, HOUR).unwrap();
    assert_eq!(tokens(l.client(), &hourly).await, 2, "5 an hour, 4 taken, and the one the quota refused given back");
    assert_eq!(calls(&s, "rl.refund"), 1, "one refund, for the request the quota refused");
    assert_eq!(l.counters().get(Event::DenyCacheHit), 10);
    // The bucket refuses first: the quota does not count what the rate refused.
    let tight = Policy::builder("tight")
        .rule(Rule::per_hour("hourly", 1))
        .rule(Rule::window("daily", 100, DAY, WindowMode::Sliding))
        .build()
        .unwrap();
    assert!(l.check(&tight, "v").await.unwrap().allowed);
    let d = l.check(&tight, "v").await.unwrap();
    assert_eq!((d.allowed, d.rule), (false, 0));
    let w = [rl_gateway::Window::new(tight.keys("v").unwrap().remove(1), 100, DAY).unwrap()];
    let d = l.client().window_peek(&w, 1, WindowMode::Sliding).await.unwrap();
    assert_eq!(d.remaining, 98, "only the admitted request counted: {d:?}");
}

/// A hot bucket paid from its lease, then refused by a quota: the token is
/// given back to Redis's bucket (RL.REFUND), as for a bucket Redis charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_refusal_gives_back_a_leased_buckets_token() {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let p = Policy::builder("api")
        .rule(Rule::per_second("rate", 100_000))
        .rule(Rule::window("daily", 2, DAY, WindowMode::Fixed))
        .build()
        .unwrap();
    for _ in 0..2 {
        let d = l.check(&p, "u").await.unwrap();
        assert!(d.allowed, "{d:?}");
    }
    assert!(calls(&s, "rl.lease") >= 1, "the bucket is leased");
    let d = l.check(&p, "u").await.unwrap();
    assert_eq!((d.allowed, d.rule), (false, 1), "the quota refuses: {d:?}");
    assert_eq!(calls(&s, "rl.refund"), 1, "the refused request's bucket token given back");
    // Then refused from the deny cache, before the bucket pays anything.
    for _ in 0..5 {
        let d = l.check(&p, "u").await.unwrap();
        assert_eq!((d.allowed, d.source), (false, Source::DenyCache), "{d:?}");
    }
    assert_eq!(calls(&s, "rl.refund"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_windows_report_and_never_refuse() {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let p = Policy::builder("api")
        .rule(Rule::per_hour("hourly", 100))
        .rule(Rule::window("trial", 2, HOUR, WindowMode::Exact).shadow())
        .build()
        .unwrap();
    let mut shadow = Vec::new();
    for _ in 0..4 {
        let d = l.check(&p, "u").await.unwrap();
        assert!(d.allowed, "{d:?}");
        shadow.push(d.shadow_refused);
    }
    assert_eq!(shadow, [None, None, Some(1), Some(1)]);
    assert_eq!(l.counters().get(Event::ShadowRefused), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_windows_fall_back_or_refuse() {
    let mut s = Server::start(&[]);
    let c = rl_gateway::Config { timeout: Duration::from_millis(200), ..config(s.url(), Backend::Module) };
    let l = Limiter::new(c).unwrap();
    let open = Policy::builder("open").rule(Rule::window("hourly", 4, HOUR, WindowMode::Sliding)).build().unwrap();
    let closed = Policy::builder("closed")
        .rule(Rule::window("logins", 4, HOUR, WindowMode::Exact).fail_closed())
        .build()
        .unwrap();
    assert!(l.check(&open, "u").await.unwrap().allowed);
    s.kill();
    // One gateway, slack 2: at most 8 in any hour. The local stand-in holds
    // half of that and refills the other half over the hour.
    let mut allowed = 0;
    for _ in 0..12 {
        let d = l.check(&open, "u").await.unwrap();
        assert_eq!(d.source, Source::Fallback, "{d:?}");
        allowed += u64::from(d.allowed);
    }
    assert_eq!(allowed, 4, "half of limit x slack at once");
    let d = l.check(&closed, "u").await.unwrap();
    assert_eq!((d.allowed, d.source, d.rule), (false, Source::FailClosed, 0));
}

/// On a server without the module (a managed Redis), window and quota
/// rules run on the Lua backend's window script: the same quota as on the
/// module, after the bucket, refused from memory, the refused request's
/// bucket token given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_is_counted_by_the_lua_backend_without_the_module() {
    let s = PlainServer::start();
    let l = Limiter::new(config(s.url(), Backend::Lua)).unwrap();
    let p = spend_the_daily_quota(&l).await;
    let d = l.check(&p, "u").await.unwrap();
    assert_eq!((d.allowed, d.rule, d.source), (false, 1, Source::DenyCache), "{d:?}");
    let hourly = rl_gateway::Bucket::new(p.keys("u").unwrap().remove(0), 5, 5, HOUR).unwrap();
    assert_eq!(tokens(l.client(), &hourly).await, 2, "5 an hour, 4 taken, the one the quota refused given back");
    // An EXACT window and a SLIDING one, each in its own policy.
    for mode in [WindowMode::Exact, WindowMode::Sliding] {
        let logins = Policy::builder(format!("login-{}", mode.name().to_lowercase()))
            .rule(Rule::window("attempts", 2, HOUR, mode).fail_closed())
            .build()
            .unwrap();
        assert!(l.check(&logins, "u").await.unwrap().allowed, "{mode:?}");
        assert!(l.check(&logins, "u").await.unwrap().allowed, "{mode:?}");
        let d = l.check(&logins, "u").await.unwrap();
        assert_eq!((d.allowed, d.source), (false, Source::Redis), "{mode:?}: {d:?}");
        // EXACT: when the first attempt leaves the hour; SLIDING: half way
        // into the next hour-aligned window, when the two weigh one.
        let (earliest, latest) = match mode {
            WindowMode::Exact => (HOUR - Duration::from_secs(60), HOUR),
            _ => (HOUR / 2, HOUR * 3 / 2),
        };
        assert!(d.retry_after.is_some_and(|r| r >= earliest && r <= latest), "{mode:?}: {d:?}");
    }
}

#[tokio::test]
async fn windows_are_refused_where_they_cannot_run() {
    let s = PlainServer::start();
    let lua = Limiter::new(config(s.url(), Backend::Lua)).unwrap();
    // An EXACT log above 10,000: the Lua script reads and writes a log whole.
    let p = Policy::builder("api").rule(Rule::window("hourly", 20_000, HOUR, WindowMode::Exact)).build().unwrap();
    let e = lua.check(&p, "u").await.unwrap_err().to_string();
    assert!(
        e.contains("limit 'hourly': an EXACT window's limit must be at most 10000 on the Lua scripts, got 20000"),
        "{e}"
    );
    let module_server = Server::start(&[]);
    let module = Limiter::new(config(module_server.url(), Backend::Module)).unwrap();
    let p = Policy::builder("api").rule(Rule::window("daily", 10, DAY, WindowMode::Fixed)).build().unwrap();
    let e = module.check_cost(&p, "u", 2_000_000_000_000).await.unwrap_err().to_string();
    assert!(e.contains("cost must be at most 1000000000000"), "{e}");
    let e = module.refund(&p, "u", 1).await.unwrap_err().to_string();
    assert!(e.contains("neither settled nor refunded"), "{e}");
    assert_eq!(calls(&module_server, "rl.window"), 0);
}

/// The outage fallback over a whole window, not only its first burst: at
/// most about `slack` x the limit in any window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_a_window_admits_at_most_slack_times_its_limit() {
    let mut s = Server::start(&[]);
    let c = rl_gateway::Config { timeout: Duration::from_millis(200), ..config(s.url(), Backend::Module) };
    let (c, clock) = on_manual_clock(c);
    let l = Limiter::new(c).unwrap();
    // 10 in any 2 s; one gateway, slack 2: at most 20 in any 2 s.
    let window = Duration::from_secs(2);
    let p = Policy::builder("open").rule(Rule::window("w", 10, window, WindowMode::Sliding)).build().unwrap();
    assert!(l.check(&p, "u").await.unwrap().allowed);
    s.kill();
    // A request every 10 ms of the limiter's clock for a whole window.
    let started = clock.now_ms();
    let elapsed = || Duration::from_millis(clock.now_ms() - started);
    let mut allowed = 0u128;
    while elapsed() < window {
        let d = l.check(&p, "u").await.unwrap();
        assert_eq!(d.source, Source::Fallback, "{d:?}");
        allowed += u128::from(d.allowed);
        clock.advance(Duration::from_millis(10));
    }
    // 10 at once, then 10 a window: never more than 20 over one window
    // (40 before: a full bucket of 20 and 20 more over the window).
    let most = 10 + 10 * elapsed().as_millis() / window.as_millis();
    assert!(allowed <= most, "{allowed} admitted in {:?}, at most {most}", elapsed());
    assert!(allowed >= 15, "{allowed} admitted: the fallback still admits about its share");
}
