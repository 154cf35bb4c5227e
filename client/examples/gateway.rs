//! A small API gateway in front of a small HTTP service, rate-limited by
//! redis-rl through the tower layer.
//!
//! ```text
//! make run                                      # redis-server with the module on :6379
//! cargo run -p rl-client --example gateway      # backend on :8081, gateway on :8080
//! curl -i -H 'x-api-key: alice' localhost:8080/hello
//! ```
//!
//! Each API key may make 5 requests a second with bursts of 10, and 100 a
//! minute. Requests without a key are limited as "anonymous". Settings come
//! from the environment: `REDIS_URL` (default `redis://127.0.0.1:6379/`),
//! `RL_BACKEND=lua` for servers without the module, `GATEWAYS` (the fleet
//! size, default 1), `GATEWAY_PORT` (8080) and `BACKEND_PORT` (8081).
//! Counters are printed every 10 seconds; stop with Ctrl-C.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rl_client::{Backend, Config, Limiter, Policy, RateLimitLayer, Rule};
use tokio::net::TcpListener;
use tower::{service_fn, Layer};

type Body = Full<Bytes>;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend_port: u16 = env("BACKEND_PORT", "8081").parse()?;
    let gateway_port: u16 = env("GATEWAY_PORT", "8080").parse()?;
    let backend_addr = SocketAddr::from(([127, 0, 0, 1], backend_port));

    // The service behind the gateway: it knows nothing of rate limits.
    let upstream = TcpListener::bind(backend_addr).await?;
    tokio::spawn(serve(
        upstream,
        service_fn(|req: Request<Incoming>| async move {
            let body = format!("hello from the backend: {} {}\n", req.method(), req.uri().path());
            Ok::<_, Infallible>(Response::new(Body::from(body)))
        }),
    ));

    let config = Config {
        backend: if env("RL_BACKEND", "module") == "lua" { Backend::Lua } else { Backend::Module },
        gateways: env("GATEWAYS", "1").parse()?,
        ..Config::standalone(env("REDIS_URL", "redis://127.0.0.1:6379/"))
    };
    let limiter = Limiter::new(config)?;
    let policy = Arc::new(
        Policy::builder("gw")
            .rule(Rule::per_second("per_second", 5).burst(10))
            .rule(Rule::per_minute("per_minute", 100))
            .build()?,
    );

    // Forward every request to the backend, body and all.
    let client = HttpClient::builder(TokioExecutor::new()).build_http::<Body>();
    let forward = service_fn(move |req: Request<Incoming>| {
        let client = client.clone();
        async move { Ok::<_, Infallible>(proxy(&client, backend_addr, req).await) }
    });
    let by_api_key = |req: &Request<Incoming>| {
        let key = req.headers().get("x-api-key").and_then(|v| v.to_str().ok());
        Some(key.unwrap_or("anonymous").to_string())
    };
    let gateway = RateLimitLayer::new(limiter.clone(), policy, by_api_key).layer(forward);

    let counters = limiter.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            println!("counters: {:?}  shards: {:?}", counters.counters().snapshot(), counters.shards());
        }
    });

    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], gateway_port))).await?;
    println!("gateway on http://127.0.0.1:{gateway_port}/ -> backend on http://{backend_addr}/");
    tokio::select! {
        _ = serve(listener, gateway) => {}
        _ = tokio::signal::ctrl_c() => println!("bye"),
    }
    Ok(())
}

/// Serves HTTP/1 on `listener` with a tower service.
async fn serve<S>(listener: TcpListener, service: S)
where
    S: tower::Service<Request<Incoming>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let service = TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

async fn proxy(
    client: &HttpClient<hyper_util::client::legacy::connect::HttpConnector, Body>,
    backend: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("http://{backend}{path}").parse() else {
        return status(StatusCode::BAD_REQUEST, "bad path\n");
    };
    parts.uri = uri;
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return status(StatusCode::BAD_REQUEST, "unreadable body\n");
    };
    match client.request(Request::from_parts(parts, Body::new(body))).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            match body.collect().await {
                Ok(body) => Response::from_parts(parts, Body::new(body.to_bytes())),
                Err(_) => status(StatusCode::BAD_GATEWAY, "backend broke off\n"),
            }
        }
        Err(_) => status(StatusCode::BAD_GATEWAY, "backend unreachable\n"),
    }
}

fn status(code: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = code;
    r
}
