//! The guarded limiter against a real server, on both backends: quiet
//! subjects, leases, the deny cache, shadow rules, settling and metrics.

mod common;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{calls, config, limiter_calls, on_manual_clock, tokens};
use rl_gateway::{Backend, Bucket, Event, Limiter, LimiterConfig, Metrics, Policy, Rule, Source};
use testkit::Server;

const HOUR: Duration = Duration::from_secs(3600);

on_both_backends!(
    quiet_subjects_ask_redis_on_every_request,
    the_deny_cache_refuses_until_the_retry_time,
    busy_subjects_spend_leases_from_memory,
    leases_never_over_admit_across_gateways,
    concurrent_first_requests_take_one_batch,
    expired_leases_are_dropped_never_refunded,
    shadow_rules_are_reported_never_enforced,
    settle_and_refund_adjust_every_rule,
);

async fn quiet_subjects_ask_redis_on_every_request(backend: Backend) {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), backend)).unwrap();
    let p = Policy::builder("api").rule(Rule::per_hour("hourly", 5)).build().unwrap();
    for left in (0..5).rev() {
        let d = l.check(&p, "u").await.unwrap();
        assert_eq!((d.allowed, d.remaining, d.source), (true, left, Source::Redis));
    }
    let d = l.check(&p, "u").await.unwrap();
    assert_eq!((d.allowed, d.rule, d.limit, d.source), (false, 0, 5, Source::Redis));
    let retry = d.retry_after.unwrap();
    assert!(retry > HOUR / 5 - Duration::from_secs(60) && retry <= HOUR / 5, "{retry:?}");
    assert_eq!(limiter_calls(&s, backend), 6, "one call per request");
    let c = l.counters();
    assert_eq!((c.get(Event::Allowed), c.get(Event::Refused), c.get(Event::Error)), (5, 1, 0));
}

async fn the_deny_cache_refuses_until_the_retry_time(backend: Backend) {
    let s = Server::start(&[]);
    let (c, clock) = on_manual_clock(config(s.url(), backend));
    let l = Limiter::new(c).unwrap();
    // One token, back after a second.
    let p = Policy::builder("api").rule(Rule::new("r", 1, 1, Duration::from_secs(1))).build().unwrap();
    assert!(l.check(&p, "u").await.unwrap().allowed);
    let d = l.check(&p, "u").await.unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Redis));
    let mut from_memory = 0;
    for _ in 0..50 {
        let d = l.check(&p, "u").await.unwrap();
        if d.source == Source::DenyCache {
            assert!(!d.allowed && d.retry_after.is_some_and(|r| r <= Duration::from_secs(1)));
            from_memory += 1;
        }
    }
    // The limiter's clock stood still: every one was refused from memory.
    assert_eq!(from_memory, 50);
    assert_eq!(limiter_calls(&s, backend), 2 + (50 - from_memory));
    assert_eq!(l.counters().get(Event::DenyCacheHit), from_memory);
    // Once the retry time passes on the limiter's clock, Redis is asked
    // again (its token handed back meanwhile: Redis's clock is real time).
    l.refund(&p, "u", 1).await.unwrap();
    assert_eq!(l.check(&p, "u").await.unwrap().source, Source::DenyCache, "not before the retry time");
    clock.advance(Duration::from_millis(1100));
    let d = l.check(&p, "u").await.unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Redis));
}

/// A rule of 1,000 a second on one gateway: leases of 100 (100 ms of it,
/// with `lease_window` 100 ms).
fn busy_policy() -> Policy {
    Policy::builder("api").rule(Rule::per_second("per_second", 1000)).build().unwrap()
}

async fn busy_subjects_spend_leases_from_memory(backend: Backend) {
    let s = Server::start(&[]);
    let l = Limiter::new(LimiterConfig {
        lease_window: Duration::from_millis(100),
        ..LimiterConfig::new(config(s.url(), backend))
    })
    .unwrap();
    let p = busy_policy();
    let first = l.check(&p, "big").await.unwrap();
    assert_eq!((first.allowed, first.source), (true, Source::Redis));
    let mut sources = Vec::new();
    for _ in 0..299 {
        let d = l.check(&p, "big").await.unwrap();
        assert!(d.allowed);
        sources.push(d.source);
    }
    let hits = sources.iter().filter(|&&s| s == Source::Lease).count();
    assert!(hits >= 290, "{hits} of 299 from the lease");
    assert_eq!(l.counters().get(Event::LeaseHit), hits as u64);
    // 300 tokens at 100 a lease, refilled at half empty: a handful of calls.
    let calls = limiter_calls(&s, backend);
    assert!((3..=12).contains(&calls), "{calls} calls for 300 requests");
}

async fn leases_never_over_admit_across_gateways(backend: Backend) {
    let s = Server::start(&[]);
    // Two gateways share 100 an hour; each leases a share of 6 minutes: 5.
    let gateway = || {
        let c = LimiterConfig {
            gateways: 2,
            lease_window: Duration::from_secs(360),
            ..LimiterConfig::new(config(s.url(), backend))
        };
        Limiter::new(c).unwrap()
    };
    let p = Arc::new(Policy::builder("api").rule(Rule::per_hour("hourly", 100)).build().unwrap());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for l in [gateway(), gateway()] {
        for _ in 0..4 {
            let (l, p) = (l.clone(), p.clone());
            tasks.push(tokio::spawn(async move {
                let mut allowed = 0u64;
                for _ in 0..40 {
                    allowed += u64::from(l.check(&p, "shared").await.unwrap().allowed);
                }
                allowed
            }));
        }
    }
    let mut allowed = 0;
    for t in tasks {
        allowed += t.await.unwrap();
    }
    // 320 requests for 100 tokens (plus one per 36 s of refill): never
    // more; at most a lease's worth stranded on each gateway.
    let refilled = started.elapsed().as_secs() / 36 + 1;
    assert!(allowed <= 100 + refilled, "{allowed} admitted");
    assert!(allowed >= 100 - 2 * 5, "{allowed} admitted");
}

async fn concurrent_first_requests_take_one_batch(backend: Backend) {
    let s = Server::start(&[]);
    // 10,000 a month, leases of 50.
    let month = Duration::from_secs(30 * 86_400);
    let c = LimiterConfig { lease_window: month / 200, ..LimiterConfig::new(config(s.url(), backend)) };
    let l = Limiter::new(c).unwrap();
    let p = Policy::builder("api").rule(Rule::new("monthly", 10_000, 10_000, month)).build().unwrap();
    let bucket = Bucket::new(p.keys("u").unwrap().remove(0), 10_000, 10_000, month).unwrap();
    let full = tokens(l.client(), &bucket).await;
    // 40 requests of one subject arrive at once on an empty lease, while
    // the server holds every answer back (300 ms): polled together, each
    // reaches its call before the first answer can be read. (Spawned tasks
    // behind a barrier did not ensure it: on a busy machine the first
    // request's call was answered before the runtime polled the others,
    // which then spent from its batch and, at half empty, rightly sent a
    // top-up: a second batch held.)
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(300).arg("ALL").query(&mut s.con()).unwrap();
    let mut all = std::pin::pin!(futures_util::future::join_all((0..40).map(|_| l.check(&p, "u"))));
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(all.as_mut().poll(cx))).await;
    assert!(first.is_pending(), "answered while the server was paused");
    let decisions = all.await;
    let admitted = decisions.into_iter().filter(|d| d.as_ref().unwrap().allowed).count() as u64;
    assert_eq!(admitted, 40);
    // One of them leases a batch; the others ask for their own token only.
    let held = full - tokens(l.client(), &bucket).await - admitted;
    assert!(held <= 50, "this gateway holds {held} tokens: more than one batch of 50");
}

async fn expired_leases_are_dropped_never_refunded(backend: Backend) {
    let s = Server::start(&[]);
    let (c, clock) = on_manual_clock(config(s.url(), backend));
    let c = LimiterConfig {
        lease_window: Duration::from_secs(360),
        lease_ttl: Duration::from_millis(200),
        ..LimiterConfig::new(c)
    };
    let l = Limiter::new(c).unwrap();
    // 100 an hour, leases of 10.
    let p = Policy::builder("api").rule(Rule::per_hour("hourly", 100)).build().unwrap();
    let bucket = [Bucket::new(p.keys("u").unwrap().remove(0), 100, 100, HOUR).unwrap()];
    let in_redis = || tokens(l.client(), &bucket[0]);
    assert!(l.check(&p, "u").await.unwrap().allowed);
    assert_eq!(in_redis().await, 90, "the lease left Redis before it was spent");
    clock.advance(Duration::from_millis(300));
    // The 9 unspent tokens expired: dropped, and a new lease taken. Handing
    // them back could admit more than the bucket allows over that time (the
    // bucket refilled meanwhile; the README has the arithmetic).
    assert!(l.check(&p, "u").await.unwrap().allowed);
    assert_eq!(in_redis().await, 80, "100 - 10 - 10 leased");
    // Time for a refund in the background to land, had one been sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(in_redis().await, 80, "expired tokens are never revived");
    if backend == Backend::Module {
        assert_eq!(calls(&s, "rl.refund"), 0);
    }
}

async fn shadow_rules_are_reported_never_enforced(backend: Backend) {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), backend)).unwrap();
    let p = Policy::builder("api")
        .rule(Rule::per_hour("hourly", 100))
        .rule(Rule::per_hour("trial", 2).shadow())
        .build()
        .unwrap();
    let mut shadow = Vec::new();
    for _ in 0..5 {
        let d = l.check(&p, "u").await.unwrap();
        assert!(d.allowed && d.limit == 100 && d.rule == 0, "{d:?}");
        shadow.push(d.shadow_refused);
    }
    assert_eq!(shadow, [None, None, Some(1), Some(1), Some(1)]);
    assert_eq!((l.counters().get(Event::ShadowRefused), l.counters().get(Event::Allowed)), (3, 5));
    // A policy of shadow rules only is a dry run.
    let dry = Policy::builder("dry").rule(Rule::per_hour("trial", 1).shadow()).build().unwrap();
    assert_eq!(l.check(&dry, "u").await.unwrap().shadow_refused, None);
    let d = l.check(&dry, "u").await.unwrap();
    assert_eq!((d.allowed, d.shadow_refused), (true, Some(0)));
}

async fn settle_and_refund_adjust_every_rule(backend: Backend) {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), backend)).unwrap();
    let p = Policy::builder("api").rule(Rule::per_hour("a", 10)).rule(Rule::per_hour("b", 20)).build().unwrap();
    let buckets: Vec<Bucket> =
        p.keys("u").unwrap().into_iter().zip([10, 20]).map(|(k, n)| Bucket::new(k, n, n, HOUR).unwrap()).collect();
    let left = || async { [tokens(l.client(), &buckets[0]).await, tokens(l.client(), &buckets[1]).await] };
    l.check(&p, "u").await.unwrap();
    let d = l.settle(&p, "u", 12).await.unwrap().unwrap();
    assert_eq!((d.allowed, d.remaining, d.rule), (true, 0, 0), "a is in debt by 3");
    assert_eq!(left().await, [0, 7]);
    assert!(!l.check(&p, "u").await.unwrap().allowed);
    l.refund(&p, "u", 5).await.unwrap().unwrap();
    assert_eq!(left().await, [2, 12]);
}

#[tokio::test]
async fn events_reach_a_metrics_sink_with_labels() {
    #[derive(Default)]
    struct Recorded(Mutex<Vec<(Event, String, Option<String>)>>);
    impl Metrics for Recorded {
        fn record(&self, event: Event, policy: &str, rule: Option<&str>) {
            self.0.lock().unwrap().push((event, policy.into(), rule.map(Into::into)));
        }
    }
    let s = Server::start(&[]);
    let sink = Arc::new(Recorded::default());
    let l = Limiter::with_metrics(config(s.url(), Backend::Module), sink.clone()).unwrap();
    let p = Policy::builder("login").rule(Rule::per_hour("attempts", 1)).build().unwrap();
    l.check(&p, "ip").await.unwrap();
    l.check(&p, "ip").await.unwrap();
    let got = sink.0.lock().unwrap().clone();
    assert_eq!(
        got,
        [(Event::Allowed, "login".into(), None), (Event::Refused, "login".into(), Some("attempts".into()))]
    );
}

#[tokio::test]
async fn bad_input_is_an_error_never_a_decision() {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), Backend::Lua)).unwrap();
    let p = Policy::builder("api").rule(Rule::per_second("s", 10)).build().unwrap();
    assert!(l.check(&p, "a{b}").await.is_err());
    assert!(l.check(&p, "").await.is_err());
    assert!(l.check_cost(&p, "u", 0).await.is_err());
    let day = Duration::from_secs(86_400);
    let huge = Policy::builder("api").rule(Rule::new("d", 1_000_000_000, 1, day)).build().unwrap();
    let e = l.check(&huge, "u").await.unwrap_err();
    assert!(e.to_string().contains("Lua backend"), "{e}");
    assert!(l.settle(&huge, "u", 1).await.is_err());
    assert!(l.refund(&p, "u", 0).await.is_err());
    assert_eq!(limiter_calls(&s, Backend::Lua), 0);
}

/// Local state is keyed by what a policy is, not by the object: a policy
/// built on every request (each customer's plan) shares it with an equal one.
#[tokio::test]
async fn a_policy_built_per_request_behaves_like_a_shared_one() {
    let s = Server::start(&[]);
    let limiter = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let plan = || Policy::builder("plan").rule(Rule::per_hour("h", 2)).build().unwrap();
    for _ in 0..2 {
        assert!(limiter.check(&plan(), "cust").await.unwrap().allowed);
    }
    let refused = limiter.check(&plan(), "cust").await.unwrap();
    assert!(!refused.allowed);
    let takes = calls(&s, "RL.TAKE");
    for _ in 0..5 {
        let d = limiter.check(&plan(), "cust").await.unwrap();
        assert_eq!(d.source, Source::DenyCache, "the deny cache of an equal policy");
    }
    assert_eq!(calls(&s, "RL.TAKE"), takes, "refused from memory: no call to Redis");
}

/// In a fleet, a contended bucket's lease is paced once Redis refused this
/// gateway: its refusals from memory say `Source::Pacing` and count as
/// pacing refusals, apart from the deny cache's, with no quota left. (A
/// gateway alone is never paced: see `tests/lease_admission.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pacing_refusals_are_reported_apart_from_the_deny_cache() {
    let s = Server::start(&[]);
    // The limiter's clock stands still: once paced, it stays paced.
    let (c, _clock) = on_manual_clock(config(s.url(), Backend::Module));
    let l = Limiter::new(LimiterConfig { gateways: 2, ..LimiterConfig::new(c) }).unwrap();
    // Leases of 50 (two gateways, 1 s of 100 a second).
    let p = Policy::builder("api").rule(Rule::per_second("s", 100)).build().unwrap();
    let bucket = Bucket::new(p.keys("u").unwrap().remove(0), 100, 100, Duration::from_secs(1)).unwrap();
    // Someone else empties the bucket: the first lease call gets less than it asks.
    assert!(l.client().take(std::slice::from_ref(&bucket), 100).await.unwrap().allowed);
    let (mut paced, mut denied) = (0, 0);
    for _ in 0..20 {
        let d = l.check(&p, "u").await.unwrap();
        match d.source {
            Source::Pacing => {
                assert!(!d.allowed && d.remaining == 0 && d.retry_after.is_some(), "{d:?}");
                paced += 1;
            }
            Source::DenyCache => denied += 1,
            _ => {}
        }
    }
    assert!(paced > 0, "a contended lease is paced");
    assert_eq!(l.counters().get(Event::PacingRefusal), paced);
    assert_eq!(l.counters().get(Event::DenyCacheHit), denied);
}
