//! What a gateway pays for the decisions `Limiter::check` makes from memory:
//! a lease spend, a deny-cache hit, and the local fallback while Redis is
//! down. The target is under 200 ns per decision and no Redis call.
//!
//! ```text
//! cargo build --release -p redis-rl        # the module the server loads
//! cargo bench -p rl-client --bench decisions
//! ```
//!
//! Each path is set up against a real redis-server with the module
//! (testkit), so the answer really comes from the limiter's memory. After
//! each path a line says how many of the measured decisions took that path
//! (from the limiter's counters) and how many calls reached Redis meanwhile.
//!
//! More rows put the HTTP side next to the lease spend, and `Redis decision`
//! (a check Redis answers, in wall time) next to them: `layer decision`,
//! the decision as the layer makes it (`Policies::decide`); `headers`, the
//! draft's headers for a decision in a new map (their fixed parts are built
//! once per policy); `headers into a response` and `draft headers into a
//! response`, the step as the layer takes it, with every field and with
//! the draft's only, into a response's map that holds a content-type, next
//! to `response alone` (the map emptied and refilled, nothing added) and
//! `five static fields into a response` (the `http` map's own floor); and
//! `layer pass`, a whole request through `RateLimitLayer` in front of a
//! service that answers at once: key and peer extraction, the lease spend,
//! the headers, and building the request and response.
//!
//! The time reported is the CPU time of the thread making the decisions
//! (`CLOCK_THREAD_CPUTIME_ID`), not wall time (but for `Redis decision`): on a shared machine wall time
//! also counts the moments other processes hold the core. On an idle
//! machine the two agree.

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use rl_client::{headers, By, Config, Decide, Event, Facts, Limiter, PeerAddr, Policies, Policy, RateLimitLayer, Rule};
use testkit::{thread_cpu_time, Server};
use tokio::runtime::Runtime;
use tower::{Layer, ServiceExt};

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
    let leasing = Limiter::new(Config { gateways: 100, ..config(&server) }).expect("limiter");
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

    bench_http(c, &rt, &leasing, &big, &server);
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
    let config = Config { gateways: 100, breaker_open_for: Duration::from_secs(3600), ..config(&down) };
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

/// The headers of a decision, and a whole pass through the layer, on the
/// lease-spend path.
fn bench_http(c: &mut Criterion, rt: &Runtime, limiter: &Limiter, policy: &Policy, server: &Server) {
    let decision = rt.block_on(limiter.check(policy, "customer-1")).expect("check");
    let now = std::time::SystemTime::now();
    // Made once, where a gateway registers its policies.
    let headed = headers::PolicyHeaders::new(policy.clone());
    c.bench_function("headers", |b| {
        b.iter_custom(|iters| {
            let start = thread_cpu_time();
            for _ in 0..iters {
                black_box(headers::for_decision(&headed, black_box(&decision), now));
            }
            thread_cpu_time() - start
        })
    });
    // A response's map emptied and given its content-type, nothing added:
    // what the rows below spend besides the header step.
    c.bench_function("response alone", |b| {
        b.iter_custom(|iters| {
            into_responses(iters, |map| {
                black_box(map);
            })
        })
    });
    // As the layer does it: into the map of a response the service made
    // (with the content-type a framework sets).
    c.bench_function("headers into a response", |b| {
        b.iter_custom(|iters| {
            into_responses(iters, |map| {
                let _ = map.try_reserve(5);
                headers::insert(map, &headed, black_box(&decision), now);
            })
        })
    });
    // The same with the draft's fields only (the layer's
    // `header_fields(Fields::Draft)`).
    c.bench_function("draft headers into a response", |b| {
        b.iter_custom(|iters| {
            into_responses(iters, |map| {
                let _ = map.try_reserve(2);
                headers::insert_fields(map, &headed, None, headers::Fields::Draft, black_box(&decision), now);
            })
        })
    });
    // The floor the http crate sets: five fields of the same names with
    // static values (nothing allocated, nothing computed), into the same
    // kind of map.
    c.bench_function("five static fields into a response", |b| {
        b.iter_custom(|iters| {
            into_responses(iters, |map| {
                let _ = map.try_reserve(5);
                let value = || http::HeaderValue::from_static("1");
                map.insert(headers::RATELIMIT_POLICY, value());
                map.insert(headers::RATELIMIT, value());
                map.insert(headers::X_RATELIMIT_LIMIT, value());
                map.insert(headers::X_RATELIMIT_REMAINING, value());
                map.insert(headers::X_RATELIMIT_RESET, value());
            })
        })
    });
    // The decision as the layer makes it: `Decide::decide` on the facts
    // extraction found (one policy by API key, a lease spend).
    let facts = Facts {
        ip: Some("192.0.2.1".parse().expect("an address")),
        key: Some("customer-1".to_owned()),
        route: "GET /search".to_owned(),
        cost: 1,
    };
    let policies = Policies::new(limiter.clone()).add(policy.clone(), By::Key);
    bench_decide(c, rt, "layer decision", &policies, &facts);
    // The same on live rules (rl-rules' `LiveDecide`): the request seen by
    // its key and by its address, each matching the default rule, two lease
    // spends in one batch.
    let spec = rl_rules::RuleSetSpec::from_toml(
        r#"
        [[rules]]
        id = "default"
        reason = "everyone"
        limits = [{ name = "per_second", rate = 100000000, per = "1s" }]
    "#,
    )
    .expect("a rule set");
    let live = rl_rules::LiveDecide::new(rl_rules::LiveRules::new(limiter.clone(), &spec).expect("live rules"));
    bench_decide(c, rt, "live rules decision", &live, &facts);
    let hello = tower::service_fn(|_req: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    });
    let svc = RateLimitLayer::new(Policies::new(limiter.clone()).add(policy.clone(), By::Key))
        .key_header("x-api-key")
        .layer(hello);
    let peer = PeerAddr("192.0.2.1:4000".parse().expect("an address"));
    let request = move || {
        let built = http::Request::builder().uri("/search").header("x-api-key", "customer-1").body(String::new());
        let mut req = built.expect("a request");
        req.extensions_mut().insert(peer);
        req
    };
    let calls_before = redis_calls(server);
    let leased_before = limiter.counters().get(Event::LeaseHit);
    let measured = Cell::new(0u64);
    c.bench_function("layer pass", |b| {
        b.to_async(rt).iter_custom(|iters| {
            let (svc, measured) = (svc.clone(), &measured);
            async move {
                let start = thread_cpu_time();
                for _ in 0..iters {
                    let response = svc.clone().oneshot(request()).await.expect("infallible");
                    assert_eq!(response.status(), http::StatusCode::OK);
                    black_box(response);
                }
                measured.set(measured.get() + iters);
                thread_cpu_time() - start
            }
        })
    });
    if measured.get() == 0 {
        return;
    }
    println!(
        "layer pass: {} lease spends for {} measured requests (and warm-up); {} calls reached Redis meanwhile\n",
        limiter.counters().get(Event::LeaseHit) - leased_before,
        measured.get(),
        redis_calls(server) - calls_before
    );
}

/// `decide` on `facts`, the checked list dropped; the facts are made
/// untimed, in batches (the layer's extraction makes them).
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

/// The thread's CPU time for `iters` rounds on one response's map: emptied
/// (what the last round added is dropped, so frees and reference counts
/// are counted), given the content-type a framework sets, then handed to
/// `add`. The map keeps its room, as a new response's map has it, and stays
/// in cache, as it is in a layer; the `response alone` row (`add` doing
/// nothing) is the part that is not the header step.
fn into_responses(iters: u64, mut add: impl FnMut(&mut http::HeaderMap)) -> Duration {
    let mut response = http::Response::new(String::new());
    let start = thread_cpu_time();
    for _ in 0..iters {
        let map = response.headers_mut();
        map.clear();
        map.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; charset=utf-8"));
        add(map);
        black_box(&mut response);
    }
    thread_cpu_time() - start
}

criterion_group!(benches, decisions);
criterion_main!(benches);
