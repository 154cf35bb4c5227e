//! The decision as rl-gateway's http layer makes it, by its two deciders: fixed
//! policies (`Policies::decide`, one policy by API key) and live rules
//! (`LiveDecide`: the request seen by its key and by its address, both on
//! the default rule, two lease spends in one batch).
//!
//! ```text
//! cargo build --release -p redis-rl        # the module the server loads
//! cargo bench -p rl-gateway --bench live_decide
//! ```
//!
//! The facts are made untimed, in batches (the layer's extraction makes
//! them); the time is the deciding thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`). After each row a line says how many lease
//! spends the measured decisions made.

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use rl_gateway::http::{By, Decide, Facts, Policies};
use rl_gateway::live::{LiveDecide, LiveRules, RuleSetSpec};
use rl_gateway::{Config, Event, Limiter, LimiterConfig, Policy, Rule};
use testkit::{thread_cpu_time, Server};
use tokio::runtime::Runtime;

fn deciders(c: &mut Criterion) {
    // Background lease top-ups run on the worker, as in a gateway.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime");
    let _guard = rt.enter();
    // Busy subjects on 100 gateways: leases of 100,000 tokens.
    let server = Server::start(&[]);
    let config = LimiterConfig {
        gateways: 100,
        ..LimiterConfig::new(Config { timeout: Duration::from_secs(1), ..Config::standalone(server.url()) })
    };
    let limiter = Limiter::new(config).expect("limiter");
    let facts = Facts {
        ip: Some("192.0.2.1".parse().expect("an address")),
        key: Some("customer-1".to_owned()),
        route: "GET /search".to_owned(),
        cost: 1,
    };
    let policy = Policy::builder("big").rule(Rule::per_second("per_second", 100_000_000)).build().expect("policy");
    bench_decide(c, &rt, "layer decision", &Policies::new(limiter.clone()).add(policy, By::Key), &facts);
    let spec = RuleSetSpec::from_toml(
        r#"
        [[rules]]
        id = "default"
        reason = "everyone"
        limits = [{ name = "per_second", rate = 100000000, per = "1s" }]
    "#,
    )
    .expect("a rule set");
    let live = LiveDecide::new(LiveRules::new(limiter, &spec).expect("live rules"));
    bench_decide(c, &rt, "live rules decision", &live, &facts);
}

/// `decide` on `facts`, the checked list dropped.
fn bench_decide(c: &mut Criterion, rt: &Runtime, name: &str, decide: &impl Decide, facts: &Facts) {
    let leased_before = decide.limiter().counters().get(Event::LeaseHit);
    let measured = Cell::new(0u64);
    c.bench_function(name, |b| {
        let measured = &measured;
        b.to_async(rt).iter_custom(|iters| async move {
            measured.set(measured.get() + iters);
            let mut elapsed = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let batch = left.min(1024);
                left -= batch;
                let made: Vec<Facts> = (0..batch).map(|_| facts.clone()).collect();
                let start = thread_cpu_time();
                for facts in made {
                    black_box(decide.decide(facts).await.expect("decide"));
                }
                elapsed += thread_cpu_time() - start;
            }
            elapsed
        })
    });
    if measured.get() > 0 {
        let spends = decide.limiter().counters().get(Event::LeaseHit) - leased_before;
        println!("{name}: {spends} lease spends for {} measured decisions (and warm-up)\n", measured.get());
    }
}

criterion_group!(benches, deciders);
criterion_main!(benches);
