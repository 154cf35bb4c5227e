//! What the HTTP side adds to a decision made from memory (a lease spend):
//! the headers, and a whole pass through the layer.
//!
//! ```text
//! cargo build --release -p redis-rl        # the module the server loads
//! cargo bench -p rl-gateway --bench http
//! ```
//!
//! The rows: `lease spend`, the decision alone, for scale; `headers`, the
//! draft's headers for a decision in a new map (their fixed parts are built
//! once, in the `PolicyHeaders` a gateway makes where it registers the
//! policy); `headers into a response` and `draft headers into a response`,
//! the step as the layer takes it, with every field and with the draft's
//! only, into a response's map that holds a content-type, next to
//! `response alone` (the map emptied and refilled, nothing added) and `five
//! static fields into a response` (the `http` map's own floor); and `layer
//! pass`, a whole request through `RateLimitLayer` in front of a service
//! that answers at once: key and peer extraction, the lease spend, the
//! headers, and building the request and response.
//!
//! The time reported is the CPU time of the thread making the decisions
//! (`CLOCK_THREAD_CPUTIME_ID`), not wall time: on a shared machine wall time
//! also counts the moments other processes hold the core.

use std::cell::Cell;
use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::{criterion_group, criterion_main, Criterion};
use rl_gateway::http::headers::{self, PolicyHeaders};
use rl_gateway::http::{By, PeerAddr, Policies, RateLimitLayer};
use rl_gateway::{Config, Event, Limiter, LimiterConfig, Policy, Rule};
use testkit::{thread_cpu_time, Server};
use tower::{Layer, ServiceExt};

/// Calls of the limiter's commands the server has run since it started
/// (the module's own counters in `INFO rl`).
fn redis_calls(server: &Server) -> u64 {
    let count = |field: &str| server.info("rl", field).parse::<u64>().expect("a count in INFO rl");
    ["rl_take_calls", "rl_lease_calls", "rl_refund_calls"].into_iter().map(count).sum()
}

fn http(c: &mut Criterion) {
    // A multi-threaded runtime: criterion runs the measured loop with
    // `block_on` on this thread, and the limiter's background lease top-ups
    // run on the worker, as they would in a gateway.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime");
    let _guard = rt.enter();
    // The lease spend of rl-client's decisions bench: 100 million a second
    // on 100 gateways, leases of 100,000 topped up in the background.
    let server = Server::start(&[]);
    let config = LimiterConfig {
        gateways: 100,
        ..LimiterConfig::new(Config { timeout: Duration::from_secs(1), ..Config::standalone(server.url()) })
    };
    let limiter = Limiter::new(config).expect("limiter");
    let policy = Policy::builder("big").rule(Rule::per_second("per_second", 100_000_000)).build().expect("policy");

    c.bench_function("lease spend", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (limiter, policy) = (&limiter, &policy);
            async move {
                let start = thread_cpu_time();
                for _ in 0..iters {
                    black_box(limiter.check(policy, black_box("customer-1")).await.expect("check"));
                }
                thread_cpu_time() - start
            }
        })
    });

    let decision = rt.block_on(limiter.check(&policy, "customer-1")).expect("check");
    let now = SystemTime::now();
    // Made once, where a gateway registers its policies.
    let headed = PolicyHeaders::new(policy.clone());
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
    let calls_before = redis_calls(&server);
    let leased_before = limiter.counters().get(Event::LeaseHit);
    let measured = Cell::new(0u64);
    c.bench_function("layer pass", |b| {
        b.to_async(&rt).iter_custom(|iters| {
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
        redis_calls(&server) - calls_before
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

criterion_group!(benches, http);
criterion_main!(benches);
