//! The decisions `Limiter::check` makes from memory, on 1, 2, 4 and 8
//! threads sharing one limiter: a lease spend, a deny-cache hit, the local
//! fallback, and a full check (two leased rules and a shadow rule), each on
//! one hot subject (every thread on the same subject: its lease, its entry)
//! and on many subjects (each thread its own 1,000).
//!
//! ```text
//! cargo bench -p rl-gateway --bench threads
//! ```
//!
//! The time reported per decision is the CPU time all threads spent
//! (`CLOCK_THREAD_CPUTIME_ID`, summed) divided by the decisions they made:
//! what a decision costs a gateway's cores, contention included (a cache
//! line bouncing between cores, a spin on a busy lock). A thread parked on
//! a lock costs no CPU, so each row also prints its wall-clock throughput.
//! On a machine with fewer cores than threads (the one the README's numbers
//! come from has 2) threads beyond the cores take turns rather than
//! contend: the rows past the core count show the cost of sharing, not of
//! more parallelism. The line after each row counts the decisions that
//! took the path, from the limiter's counters, and the lock waits meanwhile
//! (`rl_gateway::internal::lock_waits`: a lock of the client found held, waited for):
//! the contention a row met, which on 2 cores its CPU time alone can hide.
//! The decision paths have no compare-and-swap loop to count retries of
//! (the counters add with `fetch_add`; the breaker's closed path only
//! loads and adds).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rl_gateway::internal::lock_waits;
use rl_gateway::{Config, Event, Limiter, LimiterConfig, Policy, Rule};
use testkit::{thread_cpu_time, Server};
use tokio::runtime::Runtime;

const THREADS: [usize; 4] = [1, 2, 4, 8];
/// Subjects per thread in the "many" rows.
const MANY: usize = 1000;

fn config(server: &Server) -> LimiterConfig {
    // Generous so that set-up calls succeed on a loaded machine; the
    // measured decisions make no call.
    LimiterConfig {
        gateways: 100,
        ..LimiterConfig::new(Config { timeout: Duration::from_secs(1), ..Config::standalone(server.url()) })
    }
}

/// The subjects thread `t` checks: the hot one, or its own `MANY`.
fn subjects(hot: bool, t: usize) -> Vec<String> {
    if hot {
        vec!["customer-1".to_string()]
    } else {
        (0..MANY).map(|i| format!("t{t}-s{i}")).collect()
    }
}

/// One path: a limiter and a policy whose checks all take it.
struct Path<'a> {
    name: &'a str,
    limiter: &'a Limiter,
    policy: &'a Policy,
    expected: Event,
}

/// `iters` checks split over `threads` threads, each on its own
/// current-thread runtime (a gateway's workers): the summed CPU time.
fn run(path: &Path, hot: bool, threads: usize, iters: u64, wall: &AtomicU64) -> Duration {
    let cpu = AtomicU64::new(0);
    let began = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let cpu = &cpu;
            s.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
                let subjects = subjects(hot, t);
                let n = iters / threads as u64 + u64::from((t as u64) < iters % threads as u64);
                rt.block_on(async {
                    let start = thread_cpu_time();
                    for i in 0..n {
                        let subject = &subjects[i as usize % subjects.len()];
                        black_box(path.limiter.check(path.policy, black_box(subject)).await.expect("check"));
                    }
                    cpu.fetch_add((thread_cpu_time() - start).as_nanos() as u64, Ordering::Relaxed);
                });
            });
        }
    });
    wall.fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
    Duration::from_nanos(cpu.load(Ordering::Relaxed))
}

fn bench(c: &mut Criterion, path: &Path) {
    let mut group = c.benchmark_group(path.name);
    for hot in [true, false] {
        // Warm: every subject has its lease, refusal or fallback entry.
        run(path, hot, 8, 16 * MANY as u64, &AtomicU64::new(0));
        for threads in THREADS {
            let label = if hot { "one hot subject" } else { "many subjects" };
            let (wall, measured) = (AtomicU64::new(0), AtomicU64::new(0));
            let before = path.limiter.counters().get(path.expected);
            let waits_before = lock_waits();
            group.bench_function(BenchmarkId::new(label, format!("{threads} threads")), |b| {
                b.iter_custom(|iters| {
                    measured.fetch_add(iters, Ordering::Relaxed);
                    run(path, hot, threads, iters, &wall)
                })
            });
            let n = measured.load(Ordering::Relaxed);
            if n == 0 {
                continue; // filtered out on the command line
            }
            let on_path = path.limiter.counters().get(path.expected) - before;
            let waits = lock_waits() - waits_before;
            println!(
                "{} / {label} / {threads} threads: {:.1} M decisions/s wall-clock; {on_path} of {n} measured were {}; \
                 {waits} lock waits ({:.1} per million decisions)\n",
                path.name,
                n as f64 / wall.load(Ordering::Relaxed).max(1) as f64 * 1000.0,
                path.expected.name(),
                waits as f64 * 1e6 / n as f64
            );
        }
    }
    group.finish();
}

fn decisions(c: &mut Criterion) {
    let rt: Runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a tokio runtime");
    let _guard = rt.enter();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{cores} cores available: rows past {cores} threads take turns on them\n");
    let server = Server::start(&[]);

    // Lease spend: 100 million a second on one gateway, leased 100,000,000
    // tokens at a time: more than 8 threads spend, so the lease is never
    // contended (a contended one is paced, and its refusals are not spends).
    // Room for every subject's leases (8,000 subjects, two groups in the full check).
    let leasing =
        Limiter::new(LimiterConfig { lease_entries: 100_000, gateways: 1, ..config(&server) }).expect("limiter");
    let big = Policy::builder("big").rule(Rule::per_second("per_second", 100_000_000)).build().expect("policy");
    // Connected here, on the runtime that outlives the rows: a connection
    // first made on a row's thread would lose its driver with that
    // thread's runtime, and its calls (lease renewals) would fail.
    rt.block_on(async { leasing.check(&big, "set-up").await.expect("check") });
    bench(c, &Path { name: "lease spend", limiter: &leasing, policy: &big, expected: Event::LeaseHit });

    // A full check: two leased rules and a leased shadow rule.
    let full = Policy::builder("full")
        .rule(Rule::per_second("per_second", 100_000_000))
        .rule(Rule::per_minute("per_minute", 6_000_000_000))
        .rule(Rule::per_second("shadow", 200_000_000).shadow())
        .build()
        .expect("policy");
    bench(c, &Path { name: "full check", limiter: &leasing, policy: &full, expected: Event::Allowed });

    // Deny-cache hit: one request an hour, spent; Redis refused the next.
    let denying = Limiter::new(LimiterConfig { gateways: 1, ..config(&server) }).expect("limiter");
    let hourly = Policy::builder("api").rule(Rule::per_hour("per_hour", 1)).build().expect("policy");
    rt.block_on(async {
        for hot in [true, false] {
            for t in 0..8 {
                for s in subjects(hot, t) {
                    denying.check(&hourly, &s).await.expect("check");
                    let refused = denying.check(&hourly, &s).await.expect("check");
                    assert!(!refused.allowed, "the second request of the hour is refused");
                }
            }
        }
    });
    bench(c, &Path { name: "deny-cache hit", limiter: &denying, policy: &hourly, expected: Event::DenyCacheHit });

    // Local fallback: the server is gone and the breaker stays open.
    let mut down = Server::start(&[]);
    let config = config(&down);
    let config = LimiterConfig {
        connection: Config { breaker_open_for: Duration::from_secs(3600), ..config.connection },
        ..config
    };
    let falling_back = Limiter::new(config).expect("limiter");
    rt.block_on(async { falling_back.check(&big, "warm-up").await.expect("check") });
    down.kill();
    rt.block_on(async {
        while !falling_back.shards().iter().all(|(_, open)| *open) {
            falling_back.check(&big, "warm-up").await.expect("check");
        }
    });
    bench(c, &Path { name: "local fallback", limiter: &falling_back, policy: &big, expected: Event::Fallback });
}

criterion_group!(benches, decisions);
criterion_main!(benches);
