//! The tower layer in front of a service, against a real server: headers on
//! every limited response, 429 with Retry-After and the rule's name.

mod common;

use std::convert::Infallible;
use std::sync::Arc;

use common::config;
use http::{Request, Response, StatusCode};
use rl_client::{Backend, Limiter, Policy, RateLimitLayer, Rule};
use testkit::Server;
use tower::{service_fn, Layer, Service, ServiceExt};

type Req = Request<String>;

fn by_api_key(req: &Req) -> Option<String> {
    req.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn service(
    limiter: Limiter,
    policy: Policy,
) -> impl Service<Req, Response = Response<String>, Error = Infallible> + Clone {
    let hello = service_fn(|_req: Req| async { Ok::<_, Infallible>(Response::new("hello".to_string())) });
    RateLimitLayer::new(limiter, Arc::new(policy), by_api_key).layer(hello)
}

fn request(key: Option<&str>) -> Req {
    let mut b = Request::builder().uri("/");
    if let Some(key) = key {
        b = b.header("x-api-key", key);
    }
    b.body(String::new()).unwrap()
}

fn header<'a>(r: &'a Response<String>, name: &str) -> &'a str {
    r.headers().get(name).map_or("", |v| v.to_str().unwrap())
}

#[tokio::test]
async fn allowed_then_429_with_headers_and_the_rule_named() {
    let s = Server::start(&[]);
    let limiter = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    // Two a minute, and a generous hourly rule: the minute rule binds.
    let policy = Policy::builder("api")
        .rule(Rule::per_hour("per_hour", 1000))
        .rule(Rule::per_minute("per_minute", 2))
        .build()
        .unwrap();
    let svc = service(limiter, policy);
    for left in ["1", "0"] {
        let r = svc.clone().oneshot(request(Some("k1"))).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.body(), "hello");
        assert_eq!(header(&r, "ratelimit-policy"), r#""per_hour";q=1000;w=3600, "per_minute";q=2;w=60"#);
        assert_eq!(header(&r, "x-ratelimit-limit"), "2");
        assert_eq!(header(&r, "x-ratelimit-remaining"), left);
        assert!(header(&r, "ratelimit").starts_with(&format!("\"per_minute\";r={left};t=")));
        assert!(header(&r, "x-ratelimit-reset").parse::<u64>().unwrap() > 1_700_000_000);
        assert!(r.headers().get("retry-after").is_none(), "Retry-After is for 429s only");
    }
    let r = svc.clone().oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // A token every 30 s: Retry-After in whole seconds, rounded up.
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((29..=30).contains(&retry), "Retry-After {retry}");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    assert!(r.body().contains("rule \"per_minute\" of policy \"api\""), "{}", r.body());
    assert_eq!(header(&r, "content-type"), "text/plain; charset=utf-8");
    // Another key has its own budget.
    assert_eq!(svc.clone().oneshot(request(Some("k2"))).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn requests_without_a_subject_pass_and_bad_subjects_are_400() {
    let s = Server::start(&[]);
    let limiter = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let svc = service(limiter, Policy::builder("api").rule(Rule::per_hour("h", 1)).build().unwrap());
    for _ in 0..3 {
        let r = svc.clone().oneshot(request(None)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers().get("ratelimit").is_none());
    }
    let r = svc.clone().oneshot(request(Some("a}b"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.body().contains("subject must be"), "{}", r.body());
}

#[tokio::test]
async fn a_policy_the_backend_cannot_run_is_a_500_not_the_clients_fault() {
    let s = Server::start(&[]);
    let limiter = Limiter::new(config(s.url(), Backend::Lua)).unwrap();
    let day = std::time::Duration::from_secs(86_400);
    let quota =
        Policy::builder("api").rule(Rule::window("daily", 10, day, rl_client::WindowMode::Fixed)).build().unwrap();
    let r = service(limiter, quota).oneshot(request(Some("k"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.body().contains("Lua backend has no RL.WINDOW"), "{}", r.body());
}

#[tokio::test]
async fn redis_down_never_fails_a_request() {
    let mut s = Server::start(&[]);
    let limiter = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let api = service(limiter.clone(), Policy::builder("api").rule(Rule::per_hour("h", 100)).build().unwrap());
    let otp = service(limiter, Policy::builder("otp").rule(Rule::per_hour("sends", 3).fail_closed()).build().unwrap());
    s.kill();
    for _ in 0..3 {
        let r = api.clone().oneshot(request(Some("k"))).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "fail-open: limited locally");
        let r = otp.clone().oneshot(request(Some("k"))).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "fail-closed: refused");
        assert!(r.body().contains("rule \"sends\""));
        let retry: u64 = header(&r, "retry-after").parse().unwrap();
        assert!(retry >= 1);
    }
}
