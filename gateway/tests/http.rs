//! The tower layer in front of a service, against a real server: the
//! draft's headers on every limited response, refusals as problem+json,
//! several policies per request, keys that cannot slip past, outages.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use common::config;
use http::{Request, Response, StatusCode};
use rl_gateway::http::{headers, By, MissingKey, PeerAddr, Policies, RateLimitLayer, Refused};
use rl_gateway::{Backend, Limiter, Policy, Rule};
use testkit::Server;
use tower::{service_fn, Layer, ServiceExt};

type Req = Request<String>;

type Hello = tower::util::ServiceFn<fn(Req) -> std::future::Ready<Result<Response<String>, Infallible>>>;

fn hello() -> Hello {
    service_fn(|_req: Req| std::future::ready(Ok(Response::new("hello".to_string()))))
}

fn by_key(limiter: Limiter, policy: Policy) -> RateLimitLayer<Policies> {
    RateLimitLayer::new(Policies::new(limiter).add(policy, By::Key)).key_header("x-api-key")
}

fn request(key: Option<&str>, peer: &str) -> Req {
    let mut b = Request::builder().uri("/search");
    if let Some(key) = key {
        b = b.header("x-api-key", key);
    }
    let mut req = b.body(String::new()).unwrap();
    req.extensions_mut().insert(PeerAddr(SocketAddr::new(peer.parse().unwrap(), 4000)));
    req
}

fn header<'a, B>(r: &'a Response<B>, name: &str) -> &'a str {
    r.headers().get(name).map_or("", |v| v.to_str().unwrap())
}

fn all<B>(r: &Response<B>, name: &str) -> Vec<String> {
    r.headers().get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect()
}

fn module(s: &Server) -> Limiter {
    Limiter::new(config(s.url(), Backend::Module)).unwrap()
}

#[tokio::test]
async fn allowed_then_429_with_the_drafts_headers() {
    let s = Server::start(&[]);
    // Two a minute, and a generous hourly rule: the minute rule binds.
    let policy = Policy::builder("api")
        .rule(Rule::per_hour("per_hour", 1000))
        .rule(Rule::per_minute("per_minute", 2))
        .build()
        .unwrap();
    let svc = by_key(module(&s), policy).layer(hello());
    for left in ["1", "0"] {
        let r = svc.clone().oneshot(request(Some("k1"), "192.0.2.1")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.body().get_ref(), "hello");
        assert_eq!(header(&r, "ratelimit-policy"), r#""per_hour";q=1000;w=3600, "per_minute";q=2;w=60"#);
        assert_eq!(header(&r, "x-ratelimit-limit"), "2", "the smallest capacity, on every response");
        assert_eq!(header(&r, "x-ratelimit-remaining"), left);
        // A token every 30 s.
        assert_eq!(header(&r, "ratelimit"), format!("\"per_minute\";r={left};t=30"));
        assert!(r.headers().get("retry-after").is_none(), "Retry-After is for 429s only");
    }
    let r = svc.clone().oneshot(request(Some("k1"), "192.0.2.1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((29..=30).contains(&retry), "Retry-After {retry}");
    assert_eq!(header(&r, "ratelimit"), format!("\"per_minute\";r=0;t={retry}"), "t is the retry time");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&r, "content-type"), "application/problem+json");
    assert!(r.body().get_ref().contains("\"violated-policies\":[\"per_minute\"]"), "{}", r.body().get_ref());
    assert_eq!(svc.clone().oneshot(request(Some("k2"), "192.0.2.1")).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn a_missing_key_is_refused_or_shared_as_configured_and_odd_keys_are_limited() {
    let s = Server::start(&[]);
    let policy = || Policy::builder("api").rule(Rule::per_hour("h", 1)).build().unwrap();
    let svc = by_key(module(&s), policy()).layer(hello());
    let r = svc.clone().oneshot(request(None, "192.0.2.1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "never unlimited by default");
    assert!(r.body().get_ref().contains("x-api-key"), "{}", r.body().get_ref());
    let shared = by_key(module(&s), policy()).missing_key(MissingKey::Shared).layer(hello());
    assert_eq!(shared.clone().oneshot(request(None, "192.0.2.1")).await.unwrap().status(), StatusCode::OK);
    let r = shared.clone().oneshot(request(None, "192.0.2.2")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "every keyless caller is one subject");
    // Braces, a long key, bytes that are not ASCII: limited, never 400.
    let long = "k".repeat(5000);
    for odd in ["a}b{", long.as_str()] {
        assert_eq!(svc.clone().oneshot(request(Some(odd), "192.0.2.1")).await.unwrap().status(), StatusCode::OK);
        let r = svc.clone().oneshot(request(Some(odd), "192.0.2.1")).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(!r.body().get_ref().contains(odd), "a key is never echoed");
    }
    let mut latin = request(None, "192.0.2.1");
    latin.headers_mut().insert("x-api-key", http::HeaderValue::from_bytes(b"cl\xe9").unwrap());
    assert_eq!(svc.clone().oneshot(latin).await.unwrap().status(), StatusCode::OK);
    let mut again = request(None, "192.0.2.1");
    again.headers_mut().insert("x-api-key", http::HeaderValue::from_bytes(b"cl\xe9").unwrap());
    assert_eq!(svc.clone().oneshot(again).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_configuration_fault_is_a_500_that_says_nothing_of_the_request() {
    let s = Server::start(&[]);
    let lua = Limiter::new(config(s.url(), Backend::Lua)).unwrap();
    let day = Duration::from_secs(86_400);
    // An EXACT window above what the Lua backend's script holds (10,000).
    let quota =
        Policy::builder("api").rule(Rule::window("daily", 20_000, day, rl_gateway::WindowMode::Exact)).build().unwrap();
    let r = by_key(lua, quota).layer(hello()).oneshot(request(Some("secret-key"), "192.0.2.1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!r.body().get_ref().contains("secret-key"));
    // No peer address and a policy by IP: loud, per request.
    let by_ip =
        Policies::new(module(&s)).add(Policy::builder("ip").rule(Rule::per_hour("h", 5)).build().unwrap(), By::Ip);
    let mut bare = request(None, "192.0.2.1");
    bare.extensions_mut().clear();
    let r = RateLimitLayer::new(by_ip).layer(hello()).oneshot(bare).await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn several_policies_apply_to_one_request_all_or_nothing() {
    let s = Server::start(&[]);
    let limiter = module(&s);
    let ip = Policy::builder("ip").label("ip").rule(Rule::per_hour("per_hour", 10)).build().unwrap();
    let key = Policy::builder("key").label("key").rule(Rule::per_hour("per_hour", 1)).build().unwrap();
    let svc = RateLimitLayer::new(Policies::new(limiter).add(ip, By::Ip).add(key, By::Key))
        .key_header("x-api-key")
        .layer(hello());
    let r = svc.clone().oneshot(request(Some("k"), "2001:db8:1:2::1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(all(&r, "ratelimit"), [r#""ip.per_hour";r=9;t=360"#, r#""key.per_hour";r=0;t=3600"#]);
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    // The key is spent: refused, and the IP's token given back. Another
    // address of the same /64 is the same client.
    let r = svc.clone().oneshot(request(Some("k"), "2001:db8:1:2::99")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.body().get_ref().contains("[\"key.per_hour\"]"), "{}", r.body().get_ref());
    let ip_item = all(&r, "ratelimit").into_iter().find(|i| i.starts_with("\"ip.")).unwrap();
    assert!(ip_item.starts_with(r#""ip.per_hour";r=8"#), "{ip_item}: counted by the IP before the key refused");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0", "the key's, not the IP's 8");
    let r = svc.clone().oneshot(request(Some("k2"), "2001:db8:1:2::5")).await.unwrap();
    let ip_item = all(&r, "ratelimit").into_iter().find(|i| i.starts_with("\"ip.")).unwrap();
    assert!(ip_item.starts_with(r#""ip.per_hour";r=8"#), "{ip_item}: the refused request's IP token came back");
}

#[tokio::test]
async fn stacked_layers_merge_their_headers() {
    let s = Server::start(&[]);
    let limiter = module(&s);
    let ip = Policy::builder("ip").label("ip").rule(Rule::per_second("per_second", 10)).build().unwrap();
    let key = Policy::builder("key").label("key").rule(Rule::per_hour("per_hour", 1)).build().unwrap();
    let inner = by_key(limiter.clone(), key).layer(hello());
    let svc = RateLimitLayer::new(Policies::new(limiter).add(ip, By::Ip)).layer(inner);
    svc.clone().oneshot(request(Some("k"), "192.0.2.1")).await.unwrap();
    let r = svc.clone().oneshot(request(Some("k"), "192.0.2.1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let items = all(&r, "ratelimit");
    assert!(items[0].starts_with(r#""key.per_hour";r=0;t="#), "{items:?}");
    assert!(items[1].starts_with(r#""ip.per_second";r="#), "{items:?}");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&r, "x-ratelimit-limit"), "1");
}

#[tokio::test]
async fn header_fields_choose_draft_only_or_retry_after_only() {
    let s = Server::start(&[]);
    let policy = || Policy::builder("api").rule(Rule::per_hour("per_hour", 1)).build().unwrap();
    let legacy = ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"];
    let draft = by_key(module(&s), policy()).header_fields(headers::Fields::Draft).layer(hello());
    let r = draft.clone().oneshot(request(Some("d"), "192.0.2.1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "ratelimit-policy"), r#""per_hour";q=1;w=3600"#);
    assert_eq!(header(&r, "ratelimit"), r#""per_hour";r=0;t=3600"#);
    assert!(legacy.iter().all(|name| !r.headers().contains_key(*name)), "{:?}", r.headers());
    let r = draft.clone().oneshot(request(Some("d"), "192.0.2.1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert_eq!(header(&r, "ratelimit"), format!("\"per_hour\";r=0;t={retry}"));
    assert!(legacy.iter().all(|name| !r.headers().contains_key(*name)), "{:?}", r.headers());

    let quiet = by_key(module(&s), policy()).header_fields(headers::Fields::RetryAfter).layer(hello());
    let r = quiet.clone().oneshot(request(Some("q"), "192.0.2.1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(!r.headers().keys().any(|name| name.as_str().contains("ratelimit")), "{:?}", r.headers());
    let r = quiet.clone().oneshot(request(Some("q"), "192.0.2.1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&r, "retry-after").parse::<u64>().unwrap() >= 1);
    assert!(!r.headers().keys().any(|name| name.as_str().contains("ratelimit")), "{:?}", r.headers());
}

#[tokio::test]
async fn cost_and_a_custom_refusal() {
    let s = Server::start(&[]);
    let policy = Policy::builder("up").rule(Rule::per_hour("bytes", 100)).build().unwrap();
    let svc = by_key(module(&s), policy)
        .cost(|parts| parts.headers.get("content-length").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1))
        .refusal(|refused: &Refused| {
            let mut r = Response::new(format!("slow down: {}", refused.violated.join(",")));
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            r
        })
        .layer(hello());
    let sized = |n: u64| {
        let mut r = request(Some("k"), "192.0.2.1");
        r.headers_mut().insert("content-length", n.into());
        r
    };
    let r = svc.clone().oneshot(sized(60)).await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), "40");
    let r = svc.clone().oneshot(sized(41)).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.body().get_ref(), "slow down: bytes");
    assert!(header(&r, "retry-after").parse::<u64>().unwrap() >= 1);
    assert_eq!(svc.clone().oneshot(sized(40)).await.unwrap().status(), StatusCode::OK, "the 41 took nothing");
}

#[tokio::test]
async fn redis_down_never_fails_a_request_nor_leaks_the_local_bucket() {
    let mut s = Server::start(&[]);
    let limiter = module(&s);
    let api =
        by_key(limiter.clone(), Policy::builder("api").rule(Rule::per_hour("h", 10)).build().unwrap()).layer(hello());
    let otp = by_key(limiter, Policy::builder("otp").rule(Rule::per_hour("sends", 3).fail_closed()).build().unwrap())
        .layer(hello());
    s.kill();
    for _ in 0..3 {
        let r = api.clone().oneshot(request(Some("k"), "192.0.2.1")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "fail-open: limited locally");
        // One gateway, slack 2: the local bucket holds 20; the headers say 10.
        assert_eq!(header(&r, "x-ratelimit-limit"), "10");
        assert!(header(&r, "x-ratelimit-remaining").parse::<u64>().unwrap() <= 10);
        assert_eq!(header(&r, "ratelimit-policy"), r#""h";q=10;w=3600"#);
        let r = otp.clone().oneshot(request(Some("k"), "192.0.2.1")).await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "fail-closed: refused for the outage");
        assert!(r.body().get_ref().contains("#temporary-reduced-capacity"), "{}", r.body().get_ref());
        assert!(header(&r, "retry-after").parse::<u64>().unwrap() >= 1);
    }
}
