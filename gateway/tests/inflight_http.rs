//! The in-flight layer in a real hyper server on loopback: a request holds
//! its slot until its response body is done (not when the handler
//! returns), refusals are 429 (or 503) with the headers and Retry-After.

mod common;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::config;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rl_gateway::http::InflightLayer;
use rl_gateway::{Backend, InflightPolicy, InflightRule, Limiter};
use testkit::Server;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tower::{service_fn, Layer, ServiceExt};

/// A response body the test streams by hand: done when its sender drops.
struct Streamed(mpsc::Receiver<Bytes>);

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

fn by_api_key<B>(req: &Request<B>) -> Option<String> {
    req.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// Serves `policy` on loopback; every request's handler returns at once
/// with a body the test writes through the sender it receives.
async fn serve(limiter: Limiter, policy: InflightPolicy) -> (String, mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>) {
    let (handlers, bodies) = mpsc::unbounded_channel();
    let handler = service_fn(move |_req: Request<Incoming>| {
        let handlers = handlers.clone();
        async move {
            let (tx, rx) = mpsc::channel(4);
            handlers.send(tx).unwrap();
            Ok::<_, Infallible>(Response::new(Streamed(rx)))
        }
    });
    let service = InflightLayer::new(limiter, Arc::new(policy), by_api_key::<Incoming>).layer(handler);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    (url, bodies)
}

fn get(url: &str, key: &str) -> Request<String> {
    Request::builder().uri(url).header("x-api-key", key).body(String::new()).unwrap()
}

fn header<B>(r: &Response<B>, name: &str) -> String {
    r.headers().get(name).map_or(String::new(), |v| v.to_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_held_until_the_response_body_is_done() {
    let s = Server::start(&[]);
    let limiter = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let policy = InflightPolicy::builder("reports")
        .rule(InflightRule::new("concurrent", 2, Duration::from_secs(30)))
        .build()
        .unwrap();
    let (url, mut bodies) = serve(limiter, policy).await;
    let http = HttpClient::builder(TokioExecutor::new()).build_http::<String>();

    let first = http.request(get(&url, "k")).await.unwrap();
    let first_body = bodies.recv().await.unwrap();
    let second = http.request(get(&url, "k")).await.unwrap();
    let second_body = bodies.recv().await.unwrap();
    for (r, left) in [(&first, "1"), (&second, "0")] {
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(r, "ratelimit-policy"), r#""concurrent";q=2"#);
        assert_eq!(header(r, "ratelimit"), format!("\"concurrent\";r={left}"));
        assert_eq!((header(r, "x-ratelimit-limit"), header(r, "x-ratelimit-remaining")), ("2".into(), left.into()));
    }
    // Both handlers have returned, their bodies are still streaming: full.
    let refused = http.request(get(&url, "k")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(&refused, "retry-after").parse().unwrap();
    assert!((29..=30).contains(&retry), "Retry-After {retry}: the earliest deadline");
    assert_eq!(header(&refused, "x-ratelimit-remaining"), "0");
    let text = String::from_utf8(refused.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.contains("2 of 2 requests in flight for rule \"concurrent\" of policy \"reports\""), "{text}");
    assert!(bodies.try_recv().is_err(), "a refused request never reached the handler");
    assert_eq!(http.request(get(&url, "other")).await.unwrap().status(), StatusCode::OK, "subjects are apart");

    // The first body ends: its slot comes back.
    first_body.send(Bytes::from("report")).await.unwrap();
    drop(first_body);
    assert_eq!(first.into_body().collect().await.unwrap().to_bytes(), "report");
    let third = until_ok(&http, &url).await;
    let third_body = bodies.recv().await.unwrap();
    // A client that goes away mid-body gives its slot back too.
    drop(second);
    let fourth = until_ok(&http, &url).await;
    drop((second_body, third_body, third, fourth));
}

/// Asks until a request is admitted (background releases land), at most 5 s.
async fn until_ok(
    http: &HttpClient<hyper_util::client::legacy::connect::HttpConnector, String>,
    url: &str,
) -> Response<Incoming> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = http.request(get(url, "k")).await.unwrap();
        if r.status() == StatusCode::OK {
            return r;
        }
        assert!(Instant::now() < deadline, "the slot was never given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_rule_may_refuse_with_503_and_bad_subjects_are_400() {
    let s = Server::start(&[]);
    let limiter = Limiter::new(config(s.url(), Backend::Lua)).unwrap();
    let policy = InflightPolicy::builder("exports")
        .rule(InflightRule::new("concurrent", 1, Duration::from_secs(30)).unavailable())
        .build()
        .unwrap();
    let ok = service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::from("done"))) });
    let svc = InflightLayer::new(limiter.clone(), Arc::new(policy.clone()), by_api_key::<String>).layer(ok);
    let req = |key: &str| Request::builder().header("x-api-key", key).body(String::new()).unwrap();
    // The first response is held, unread: its slot stays taken.
    let held = svc.clone().oneshot(req("k")).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    assert!(held.body().permit().is_some_and(|p| !p.expired()));
    let r = svc.clone().oneshot(req("k")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!header(&r, "retry-after").is_empty());
    let r = svc.clone().oneshot(req("a{b")).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let text = String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.contains("subject must be"), "{text}");
    // Reading the body to its end gives the slot back.
    let mut body = held.into_body();
    while body.frame().await.is_some() {}
    assert!(body.permit().is_none());
    let deadline = Instant::now() + Duration::from_secs(5);
    while svc.clone().oneshot(req("k")).await.unwrap().status() != StatusCode::OK {
        assert!(Instant::now() < deadline, "the slot was never given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
