//! Live rules behind rl-gateway's http tower layer, against a real server: which
//! views of a request are limited (its key, its address), the headers a
//! refusal carries whoever answers it, routes by template, and in-flight
//! limits held for the life of a response.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;

use common::config;
use http::{Request, Response, StatusCode};
use rl_gateway::http::{MissingKey, PeerAddr, RateLimitLayer};
use rl_gateway::live::{LiveDecide, LiveRules, RuleSetSpec};
use rl_gateway::{Backend, Limiter};
use testkit::Server;
use tower::{service_fn, Layer, Service, ServiceExt};

fn spec(toml: &str) -> RuleSetSpec {
    RuleSetSpec::from_toml(toml).unwrap()
}

fn limiter(s: &Server) -> Limiter {
    Limiter::new(config(s.url(), Backend::Module)).unwrap()
}

fn request(method: &str, path: &str, key: Option<&str>, peer: &str) -> Request<String> {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(key) = key {
        b = b.header("x-api-key", key);
    }
    let mut req = b.body(String::new()).unwrap();
    req.extensions_mut().insert(PeerAddr(SocketAddr::new(peer.parse().unwrap(), 4000)));
    req
}

fn header<B>(r: &Response<B>, name: &str) -> String {
    r.headers().get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect::<Vec<_>>().join(", ")
}

/// A service behind the live-rules layer that answers at once.
fn layered(
    rules: LiveRules,
) -> impl Service<Request<String>, Response = Response<impl http_body::Body>, Error = Infallible> + Clone {
    let hello = service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new("hello".to_string())) });
    RateLimitLayer::new(LiveDecide::new(rules)).key_header("x-api-key").missing_key(MissingKey::UseIp).layer(hello)
}

/// Two limits per rule, so a view announces two members: a request seen
/// by its key and by its address announces four.
const TWO_VIEWS: &str = r#"
    [[rules]]
    id = "default"
    reason = "everyone, and keyed requests by their address too"
    ip_tier = "all"
    limits = [{ name = "s", rate = 3, per = "1h" }, { name = "m", rate = 100, per = "1h" }]
"#;

/// RateLimit-Policy lists the same members on every response of a request
/// shape: allowed, refused by Redis, and refused from the deny cache (which
/// decides one view and leaves the other undecided).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_field_is_the_same_whoever_refuses() {
    let s = Server::start(&[]);
    let rules = LiveRules::new(limiter(&s), &spec(TWO_VIEWS)).unwrap();
    let svc = layered(rules.clone());
    let mut policies = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = svc.clone().oneshot(request("GET", "/", Some("k"), "198.51.100.7")).await.unwrap();
        statuses.push(r.status());
        policies.push(header(&r, "ratelimit-policy"));
    }
    assert_eq!(statuses[..3], [StatusCode::OK; 3]);
    assert_eq!(statuses[3..], [StatusCode::TOO_MANY_REQUESTS; 3]);
    let deny = rules.limiter().counters().get(rl_gateway::Event::DenyCacheHit);
    assert!(deny > 0, "the later refusals came from the deny cache");
    let first = &policies[0];
    assert_eq!(first.matches(";q=").count(), 4, "two views of two limits: {first}");
    for (i, p) in policies.iter().enumerate() {
        assert_eq!(p, first, "response {i}: {p}");
    }
}

/// Without a rule saying so, a request with an API key is limited by its
/// key's rules only: two keys behind one NAT do not share the address's
/// bucket. A rule with `ip_tier = "all"` limits keyed requests by their
/// address too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_behind_one_address_are_limited_by_their_own_rules_unless_an_ip_tier_says_so() {
    let s = Server::start(&[]);
    let rules = LiveRules::new(
        limiter(&s),
        &spec(
            r#"
            [[rules]]
            id = "default"
            reason = "everyone"
            limits = [{ name = "s", rate = 5, per = "1h" }]
        "#,
        ),
    )
    .unwrap();
    let svc = layered(rules);
    let nat = "198.51.100.7";
    for key in ["k1", "k2"] {
        for i in 0..5 {
            let r = svc.clone().oneshot(request("GET", "/", Some(key), nat)).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{key} request {i}: {}", header(&r, "ratelimit"));
            assert!(!header(&r, "ratelimit-policy").contains("ip."), "no IP view: {}", header(&r, "ratelimit-policy"));
        }
    }
    // A request without a key is limited by its address, as before.
    for i in 0..5 {
        let r = svc.clone().oneshot(request("GET", "/", None, nat)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "keyless request {i}");
    }
    let r = svc.clone().oneshot(request("GET", "/", None, nat)).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);

    // An IP tier over a network: its keys share each address's buckets.
    let rules = LiveRules::new(
        limiter(&s),
        &spec(
            r#"
            [[rules]]
            id = "default"
            reason = "everyone"
            limits = [{ name = "s", rate = 5, per = "1h" }]

            [[rules]]
            id = "nat"
            match = { ip = "203.0.113.0/24" }
            ip_tier = "all"
            reason = "an office behind one address"
            limits = [{ name = "s", rate = 6, per = "1h" }]
        "#,
        ),
    )
    .unwrap();
    let svc = layered(rules);
    let office = "203.0.113.9";
    for i in 0..5 {
        let r = svc.clone().oneshot(request("GET", "/", Some("k3"), office)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "k3 request {i}");
    }
    let r = svc.clone().oneshot(request("GET", "/", Some("k4"), office)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(header(&r, "ratelimit-policy").contains("\"ip.nat.s\";q=6"), "{}", header(&r, "ratelimit-policy"));
    let r = svc.clone().oneshot(request("GET", "/", Some("k4"), office)).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "the address's sixth");
    let body =
        String::from_utf8(http_body_util::BodyExt::collect(r.into_body()).await.ok().unwrap().to_bytes().to_vec());
    assert!(body.unwrap().contains("\"ip.nat.s\""), "the IP tier refused");
}

/// Rules match the route as the framework names it: axum's matched path,
/// `GET /users/{id}`, for every user id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_match_the_route_template() {
    use axum::routing::get;
    let s = Server::start(&[]);
    let rules = LiveRules::new(
        limiter(&s),
        &spec(
            r#"
            [[rules]]
            id = "default"
            reason = "everyone"
            limits = [{ name = "s", rate = 100, per = "1h" }]

            [[rules]]
            id = "users"
            match = { endpoint = "GET /users/{id}" }
            reason = "a user's page is expensive"
            limits = [{ name = "s", rate = 2, per = "1h" }]
        "#,
        ),
    )
    .unwrap();
    let layer = RateLimitLayer::new(LiveDecide::new(rules)).key_header("x-api-key");
    let app = axum::Router::new().route("/users/{id}", get(|| async { "user" })).layer(layer);
    let mut statuses = Vec::new();
    for id in 1..=3 {
        let mut req = axum::http::Request::builder()
            .uri(format!("/users/{id}"))
            .header("x-api-key", "k")
            .body(axum::body::Body::empty())
            .unwrap();
        req.extensions_mut().insert(PeerAddr(SocketAddr::new("192.0.2.1".parse().unwrap(), 4000)));
        let r = app.clone().oneshot(req).await.unwrap();
        if id == 1 {
            assert!(
                header(&r, "ratelimit-policy").contains("\"key.users.s\";q=2"),
                "{}",
                header(&r, "ratelimit-policy")
            );
        }
        statuses.push(r.status());
    }
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
}

/// A rule's in-flight limit behind the layer: a slot held for the life of
/// each response (until its body is done or dropped), a refusal with the
/// in-flight member in its headers and a Retry-After from how fast slots
/// were seen to free, not the slot timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_holds_in_flight_slots_for_the_life_of_a_response() {
    use std::time::Duration;
    let s = Server::start(&[]);
    let rules = LiveRules::new(
        limiter(&s),
        &spec(
            r#"
            [[rules]]
            id = "default"
            reason = "everyone"
            limits = [{ name = "s", rate = 1000, per = "1s" }]

            [[rules]]
            id = "reports"
            match = { endpoint = "POST /reports" }
            reason = "slow"
            limits = [
              { name = "s", rate = 1000, per = "1s" },
              { name = "concurrent", kind = "inflight", limit = 2, timeout = "30s" },
            ]
        "#,
        ),
    )
    .unwrap();
    // The handler holds each request for the milliseconds it names.
    let slow = service_fn(|req: Request<String>| async move {
        let ms: u64 = req.headers().get("x-hold-ms").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, Infallible>(Response::new("report".to_string()))
    });
    let svc = RateLimitLayer::new(LiveDecide::new(rules)).key_header("x-api-key").layer(slow);
    let report = |hold: u64| {
        let mut req = request("POST", "/reports", Some("k"), "192.0.2.1");
        req.headers_mut().insert("x-hold-ms", hold.into());
        req
    };
    let read = |r: Response<_>| async move { http_body_util::BodyExt::collect(r.into_body()).await.ok().unwrap() };
    // Slots seen to free after about 300 ms.
    for _ in 0..3 {
        let r = svc.clone().oneshot(report(300)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert!(
            header(&r, "ratelimit-policy").contains("\"key.reports.concurrent\";q=2"),
            "{}",
            header(&r, "ratelimit-policy")
        );
        read(r).await;
    }
    // Two responses whose bodies are not read yet hold both slots.
    let a = svc.clone().oneshot(report(0)).await.unwrap();
    let b = svc.clone().oneshot(report(0)).await.unwrap();
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    let r = svc.clone().oneshot(report(0)).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{}", header(&r, "ratelimit"));
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((1..=2).contains(&retry), "from the release rate, not the 30 s timeout: {retry}");
    assert!(
        header(&r, "ratelimit").contains(&format!("\"key.reports.concurrent\";r=0;t={retry}")),
        "{}",
        header(&r, "ratelimit")
    );
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0", "a refusal shows no quota left");
    assert!(header(&r, "ratelimit-policy").contains("\"key.reports.s\""), "the rule's rate is announced too");
    // One body read to its end frees a slot; one dropped frees the other.
    read(a).await;
    drop(b);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut ok = 0;
    while ok < 2 {
        assert!(std::time::Instant::now() < deadline, "the slots did not come back");
        let held: Vec<_> =
            vec![svc.clone().oneshot(report(0)).await.unwrap(), svc.clone().oneshot(report(0)).await.unwrap()];
        ok = held.iter().filter(|r| r.status() == StatusCode::OK).count();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
