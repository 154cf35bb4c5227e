//! What a gateway pays for the decisions `Limiter::check` makes from memory:
//! a lease spend, a deny-cache hit, and the local fallback while Redis is
//! down. The target is under 200 ns per decision and no Redis call.
//!
//! ```text
//! cargo build --release -p redis-rl        # the module the server loads
//! cargo bench -p rl-gateway --bench decisions
//! ```
//!
//! Each path is set up against a real redis-server with the module
//! (testkit), so the answer really comes from the limiter's memory. After
//! each path a line says how many of the measured decisions took that path
//! (from the limiter's counters) and how many calls reached Redis meanwhile.
//!
//! One more row, `Redis decision`, puts a check Redis answers (in wall
//! time) next to them. The HTTP side of the same decisions is rl-gateway's http
//! bench; the deciders of its layer (fixed policies, live rules) are
//! benches/live_decide.rs.
//!
//! The time reported is the CPU time of the thread making the decisions
//! (`CLOCK_THREAD_CPUTIME_ID`), not wall time (but for `Redis decision`): on a shared machine wall time
//! also counts the moments other processes hold the core. On an idle
//! machine the two agree.

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use rl_gateway::{Config, Event, Limiter, LimiterConfig, Policy, Rule};
use testkit::{thread_cpu_time, Server};
use tokio::runtime::Runtime;

/// A multi-threaded runtime: criterion runs the measured loop with
/// `block_on` on this thread, and the limiter's background lease top-ups
/// run on the worker, as they would in a gateway.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a tokio runtime")
}

fn config(server: &Server) -> Config {
    Config {
        // Generous so that the set-up calls succeed on a loaded machine; the
        // measured decisions make no call at all.
        timeout: Duration::from_secs(1),
        ..Config::standalone(server.url())
    }
}

/// Calls of the limiter's commands the server has run since it started
/// (the module's own counters in `INFO rl`).
fn redis_calls(server: &Server) -> u64 {
    let count = |field: &str| server.info("rl", field).parse::<u64>().expect("a count in INFO rl");
    ["rl_take_calls", "rl_lease_calls", "rl_refund_calls"].into_iter().map(count).sum()
}

/// One decision path: what to check, and the event that counts it.
struct Path<'a> {
    name: &'a str,
    limiter: &'a Limiter,
    policy: &'a Policy,
    subject: &'a str,
    expected: Event,
    /// The server to count calls on; None while it is down.
    server: Option<&'a Server>,
}

/// Measures `limiter.check(policy, subject)` and reports how many measured
/// decisions were counted as `expected` (the path under test).
fn bench_path(c: &mut Criterion, rt: &Runtime, path: Path) {
    let Path { name, limiter, policy, subject, expected, server } = path;
    let measured = Cell::new(0u64);
    let on_path = Cell::new(0u64);
    let calls_before = server.map(redis_calls);
    c.bench_function(name, |b| {
        b.to_async(rt).iter_custom(|iters| {
            let (measured, on_path) = (&measured, &on_path);
            async move {
                // Not timed: renews a lease that expired between samples.
                black_box(limiter.check(policy, subject).await.expect("check"));
                let before = limiter.counters().get(expected);
                let start = thread_cpu_time();
                for _ in 0..iters {
                    black_box(limiter.check(policy, black_box(subject)).await.expect("check"));
                }
                let elapsed = thread_cpu_time() - start;
                measured.set(measured.get() + iters);
                on_path.set(on_path.get() + limiter.counters().get(expected) - before);
                elapsed
            }
        })
    });
    let calls = match (server, calls_before) {
        (Some(s), Some(before)) => format!("{} calls reached Redis meanwhile", redis_calls(s) - before),
        _ => format!("Redis down; {} calls attempted in all", limiter.counters().get(Event::Error)),
    };
    if measured.get() == 0 {
        return; // filtered out on the command line
    }
    let all = if on_path.get() == measured.get() { "all on the path" } else { "NOT ALL on the path" };
    println!(
        "{name}: {} of {} measured decisions were {} ({all}); {calls}\n",
        on_path.get(),
        measured.get(),
        expected.name()
    );
}

fn decisions(c: &mut Criterion) {
    let rt = runtime();
    let _guard = rt.enter();

    // Lease spend: 100 million a second on 100 gateways leases 100,000
    // tokens at a time (100 ms of this gateway's share); a top-up every
    // 50,000 requests runs in the background and is never waited for.
    let server = Server::start(&[]);
    let leasing =
        Limiter::new(LimiterConfig { gateways: 100, ..LimiterConfig::new(config(&server)) }).expect("limiter");
    let big = Policy::builder("big").rule(Rule::per_second("per_second", 100_000_000)).build().expect("policy");
    bench_path(
        c,
        &rt,
        Path {
            name: "lease spend",
            limiter: &leasing,
            policy: &big,
            subject: "customer-1",
            expected: Event::LeaseHit,
            server: Some(&server),
        },
    );

    bench_redis_decision(c, &rt, &server);

    // Deny-cache hit: one request an hour, spent; Redis refused the next
    // and named a retry time about an hour away.
    let denying = Limiter::new(config(&server)).expect("limiter");
    let hourly = Policy::builder("api").rule(Rule::per_hour("per_hour", 1)).build().expect("policy");
    rt.block_on(async {
        denying.check(&hourly, "abuser").await.expect("check");
        let refused = denying.check(&hourly, "abuser").await.expect("check");
        assert!(!refused.allowed, "the second request of the hour is refused");
    });
    bench_path(
        c,
        &rt,
        Path {
            name: "deny-cache hit",
            limiter: &denying,
            policy: &hourly,
            subject: "abuser",
            expected: Event::DenyCacheHit,
            server: Some(&server),
        },
    );

    // Local fallback: the server is gone and the breaker is open. It stays
    // open for the whole run here, so no probe call lands in the measurement.
    let mut down = Server::start(&[]);
    let config = LimiterConfig {
        gateways: 100,
        ..LimiterConfig::new(Config { breaker_open_for: Duration::from_secs(3600), ..config(&down) })
    };
    let falling_back = Limiter::new(config).expect("limiter");
    rt.block_on(async { falling_back.check(&big, "customer-1").await.expect("check") });
    down.kill();
    rt.block_on(async {
        while !falling_back.shards().iter().all(|(_, open)| *open) {
            falling_back.check(&big, "customer-1").await.expect("check");
        }
    });
    bench_path(
        c,
        &rt,
        Path {
            name: "local fallback",
            limiter: &falling_back,
            policy: &big,
            subject: "customer-1",
            expected: Event::Fallback,
            server: None,
        },
    );
}

/// A decision Redis makes: what most subjects get (one that is not busy
/// enough for a lease, nor refused). Each decision is a new subject of a
/// 1,000-a-minute policy, so each is one RL.TAKE. Wall time, since the wait
/// for the reply is the cost here (the deciding thread's CPU time is a small
/// part of it), over loopback to a server on the same machine.
fn bench_redis_decision(c: &mut Criterion, rt: &Runtime, server: &Server) {
    let limiter = Limiter::new(config(server)).expect("limiter");
    let policy = Policy::builder("typical").rule(Rule::per_minute("per_minute", 1000)).build().expect("policy");
    let subjects: Vec<String> = (0..200_000).map(|n| format!("subject-{n}")).collect();
    let next = Cell::new(0usize);
    let measured = Cell::new(0u64);
    let calls_before = redis_calls(server);
    c.bench_function("Redis decision", |b| {
        b.to_async(rt).iter_custom(|iters| {
            let (limiter, policy, subjects, next, measured) = (&limiter, &policy, &subjects, &next, &measured);
            async move {
                let start = std::time::Instant::now();
                for _ in 0..iters {
                    let subject = &subjects[next.get() % subjects.len()];
                    next.set(next.get() + 1);
                    let decision = limiter.check(policy, subject).await.expect("check");
                    black_box(decision);
                }
                measured.set(measured.get() + iters);
                start.elapsed()
            }
        })
    });
    if measured.get() == 0 {
        return;
    }
    println!(
        "Redis decision: {} calls reached Redis for {} measured decisions (and warm-up); {} decisions were from the fallback\n",
        redis_calls(server) - calls_before,
        measured.get(),
        limiter.counters().get(Event::Fallback)
    );
}

criterion_group!(benches, decisions);
criterion_main!(benches);
