//! What leases admit against what Redis alone admits: each request of the
//! same offered traffic goes to a gateway (leases, deny cache, pacing) on
//! one subject and, as a plain RL.TAKE, to a bucket of the same rule on
//! another key, at the same moment. The direct bucket is the module's exact
//! answer; the gateway must match it alone, and stay within its stated
//! bound in a fleet. Both paths see the same machine, so a busy machine
//! moves both.

mod common;

use std::time::{Duration, Instant};

use common::config;
use rl_gateway::{Backend, Bucket, Decision, Event, Limiter, LimiterConfig, Policy, Rule, Source};
use testkit::Server;

const SECOND: Duration = Duration::from_secs(1);

/// 100 a second, a burst of 200, and 5,000 a minute (the plan of the
/// issue's gateway: the minute's rule sets the lease size, 83).
fn per_second() -> Policy {
    Policy::builder("key")
        .rule(Rule::per_second("per_second", 100).burst(200))
        .rule(Rule::per_minute("per_minute", 5000))
        .build()
        .unwrap()
}

fn direct_bucket() -> Bucket {
    Bucket::new("direct:{d}:per_second", 200, 100, SECOND).unwrap()
}

/// What one run saw: requests, admitted by the gateways and directly, and
/// how long it took (the allowance grows with it).
#[derive(Debug, Default)]
struct Run {
    requests: u64,
    gateways: u64,
    direct: u64,
    elapsed: Duration,
    refusals: Vec<Decision>,
}

impl Run {
    /// What an exact bucket of 100/s burst 200 allows over the run.
    fn allowance(&self) -> u64 {
        200 + (100.0 * self.elapsed.as_secs_f64()).ceil() as u64
    }
}

/// Offers `rate` requests a second for `duration`, each to the next of
/// `gateways` (round robin) and to the direct bucket.
async fn offer(gateways: &[Limiter], rate: u64, duration: Duration) -> Run {
    let policy = per_second();
    let direct = [direct_bucket()];
    let client = gateways[0].client();
    let mut tick = tokio::time::interval(SECOND / rate as u32);
    let mut run = Run::default();
    let started = Instant::now();
    for n in 0..rate * duration.as_secs() {
        tick.tick().await;
        let gateway = &gateways[n as usize % gateways.len()];
        let d = gateway.check(&policy, "customer").await.unwrap();
        if d.allowed {
            run.gateways += 1;
        } else {
            run.refusals.push(d);
        }
        run.direct += u64::from(client.take(&direct, 1).await.unwrap().allowed);
        run.requests += 1;
    }
    run.elapsed = started.elapsed();
    run
}

/// No refusal shows quota left, whatever decided it.
fn assert_no_quota_left(run: &Run) {
    for d in &run.refusals {
        assert_eq!(d.remaining, 0, "a refusal showing quota left: {d:?}");
        assert!(d.retry_after.is_some_and(|r| !r.is_zero()), "a refusal with no retry time: {d:?}");
    }
}

/// Three times the rate for 5 s: an exact bucket admits its burst and the
/// refill, about 700; a gateway alone admits the same, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_alone_admits_what_redis_admits_under_overload() {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let run = offer(std::slice::from_ref(&l), 300, Duration::from_secs(5)).await;
    println!("{run:?}", run = (run.requests, run.gateways, run.direct, run.elapsed, run.allowance()));
    assert!(run.direct <= run.allowance() && run.gateways <= run.allowance(), "over: {run:?}");
    assert!(
        run.gateways as f64 >= 0.99 * run.direct as f64,
        "the gateway admitted {} where RL.TAKE admitted {} ({} requests in {:?})",
        run.gateways,
        run.direct,
        run.requests,
        run.elapsed
    );
    assert_no_quota_left(&run);
    assert!(l.counters().get(Event::LeaseHit) > 0, "leases were used");
}

/// 108 a second on 100/s burst 200 for 20 s: the burst covers the excess
/// (an exact bucket admits every request for 25 s, and 5,000 a minute is
/// more than 2,160), so nothing is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_alone_refuses_nothing_an_exact_bucket_admits() {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let run = offer(std::slice::from_ref(&l), 108, Duration::from_secs(20)).await;
    let sources: Vec<Source> = run.refusals.iter().map(|d| d.source).collect();
    assert_eq!(run.direct, run.requests, "the direct bucket admitted every request: the test's premise");
    assert_eq!(run.gateways, run.requests, "false refusals: {sources:?}");
}

/// Three gateways (`gateways = 3`) share the overload: never over, and
/// short of the exact bucket by at most the README's bound, whatever the
/// run's length: two batches a gateway leased and unspent (2 × 27 × 3 =
/// 162) and what the bucket refills in one pace, at most two batches'
/// share (2 s of 100/s: 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_is_short_by_a_bounded_amount_never_over() {
    let s = Server::start(&[]);
    let fleet: Vec<Limiter> = (0..3)
        .map(|_| {
            Limiter::new(LimiterConfig { gateways: 3, ..LimiterConfig::new(config(s.url(), Backend::Module)) }).unwrap()
        })
        .collect();
    let run = offer(&fleet, 300, Duration::from_secs(5)).await;
    println!("{run:?}", run = (run.requests, run.gateways, run.direct, run.elapsed, run.allowance()));
    assert!(run.gateways <= run.allowance(), "over: {run:?}");
    let batch = 5000 / 60 / 3;
    assert!(
        run.gateways + 2 * batch * 3 + 200 >= run.direct,
        "the fleet admitted {} where RL.TAKE admitted {}: short by more than the bound",
        run.gateways,
        run.direct
    );
    assert_no_quota_left(&run);
}
