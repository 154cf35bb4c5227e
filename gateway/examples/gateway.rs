//! An API gateway on axum in front of a small HTTP service, rate-limited by
//! live rules: bootstrapped from a rules file, then whatever `rlctl
//! publish` puts in Redis, behind rl-gateway's http tower layer.
//!
//! ```text
//! make run                                      # redis-server with the module on :6379
//! cargo run -p rl-gateway --example gateway      # backend on :8081, gateway on :8080
//! curl -i -H 'x-api-key: alice' localhost:8080/hello
//! curl -i localhost:8080/reports/7              # keyless: the IP tier; a slow route
//! rlctl publish my-rules.toml                   # every gateway within seconds
//! ```
//!
//! The rules (`examples/gateway.toml`, or `RULES_FILE`) are only the
//! bootstrap: the gateway watches Redis (`rl:rules`, published with rlctl)
//! and a published set replaces them. Per API key (`x-api-key`): 100 a
//! second with bursts of 200 and 5,000 a minute (a window); a request
//! without a key is limited by its address in the keyless tier (20 a
//! second, bursts of 40); `POST /login` is 5 a minute and fail-closed
//! (503 while Redis cannot answer); `GET /reports/{id}` (the backend takes
//! `SLOW_MS`, default 500 ms, to answer) holds at most 20 in flight per
//! key, each slot until the response is sent. Rules match the route as the
//! router names it (`/reports/{id}`), not the raw path.
//!
//! Environment: `REDIS_URL` (default `redis://127.0.0.1:6379/`), or
//! `REDIS_SENTINELS` (comma-separated `host:port` of sentinels) with
//! `REDIS_MASTER` (the name they monitor, default `mymaster`) for a primary
//! that Redis Sentinel fails over; `RL_BACKEND=lua` for servers without
//! the module; `RL_RELAY` (a lease relay's URL, rl-relay: calls go to it,
//! and to Redis directly while it is down), `GATEWAYS` (the fleet size, default 1), `GATEWAY_PORT`
//! (8080), `BACKEND_PORT` (8081), `RULES_FILE` (the bootstrap rules),
//! `SLOW_MS`, and `TRUSTED_PROXIES` (comma-separated networks of your load
//! balancers: their `X-Forwarded-For` is believed, nobody else's). For a
//! `rediss://` Redis: `RL_TLS_CA_FILE`, `RL_TLS_CERT_FILE`, `RL_TLS_KEY_FILE`
//! (docs/security.md), for the limiter and the rules watcher alike.
//! Counters are printed every 10 seconds; stop with Ctrl-C.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Response, StatusCode};
use axum::routing::{any, get, post};
use axum::Router;
use rl_gateway::http::{ClientIp, MissingKey, RateLimitLayer, Trust};
use rl_gateway::live::{LiveDecide, LiveRules, RedisSource, RuleSetSpec};
use rl_gateway::{Backend, Config, Limiter, LimiterConfig, Target};
use tokio::net::TcpListener;

/// The bootstrap rules when `RULES_FILE` names none.
const BOOTSTRAP: &str = include_str!("gateway.toml");

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// `REDIS_SENTINELS` and `REDIS_MASTER` as a `redis+sentinel://` URL (the
/// limiter and the rules watcher follow the same primary), else `REDIS_URL`.
fn redis_url() -> String {
    match std::env::var("REDIS_SENTINELS") {
        Ok(sentinels) => {
            let hosts: Vec<&str> = sentinels.split(',').map(str::trim).filter(|h| !h.is_empty()).collect();
            format!("redis+sentinel://{}/{}", hosts.join(","), env("REDIS_MASTER", "mymaster"))
        }
        Err(_) => env("REDIS_URL", "redis://127.0.0.1:6379/"),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // rl-client's warnings (a breaker opening, calls moving to another
    // Redis server after a failover) on standard error.
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(colours).init();
    let backend_port: u16 = env("BACKEND_PORT", "8081").parse()?;
    let gateway_port: u16 = env("GATEWAY_PORT", "8080").parse()?;
    let slow = Duration::from_millis(env("SLOW_MS", "500").parse()?);

    // The service behind the gateway: it knows nothing of rate limits.
    let backend = Router::new()
        .route(
            "/reports/{id}",
            get(move || async move {
                tokio::time::sleep(slow).await;
                "a report, slowly made\n"
            }),
        )
        .fallback(any(|req: Request| async move {
            format!("hello from the backend: {} {}\n", req.method(), req.uri().path())
        }));
    let upstream = TcpListener::bind(("127.0.0.1", backend_port)).await?;
    tokio::spawn(async move { axum::serve(upstream, backend).await });

    // Redis: the limiter's server, and where the rules are published.
    let redis_url = redis_url();
    let tls = rl_gateway::Tls::from_env()?;
    let config = LimiterConfig {
        gateways: env("GATEWAYS", "1").parse()?,
        ..LimiterConfig::new(Config {
            tls: tls.clone(),
            backend: if env("RL_BACKEND", "module") == "lua" { Backend::Lua } else { Backend::Module },
            relay: std::env::var("RL_RELAY").ok().filter(|url| !url.is_empty()),
            ..Config::for_target(Target::from_url(&redis_url)?)
        })
    };
    let limiter = Limiter::new(config)?;

    // The file only bootstraps: a set published in Redis replaces it (and
    // a broken file stops the gateway here, before it serves anything).
    let bootstrap = match std::env::var("RULES_FILE") {
        Ok(path) => RuleSetSpec::from_file(&path)?,
        Err(_) => RuleSetSpec::from_toml(BOOTSTRAP)?,
    };
    let rules = LiveRules::new(limiter.clone(), &bootstrap)?;
    // A limit the server refuses (an EXACT window above its max-log-limit)
    // would error at Redis on every request: refused here, before serving.
    rules.verify_server().await?;
    let watcher = rules.watch_redis(RedisSource { tls, ..RedisSource::new(redis_url) })?;

    let proxies = env("TRUSTED_PROXIES", "");
    let trust = match proxies.as_str() {
        "" => Trust::Nobody,
        nets => Trust::Networks(nets.split(',').map(|n| n.trim().parse()).collect::<Result<_, _>>()?),
    };
    // One layer decides every rule a request meets (its key's, or its
    // address's without a key), rates and in-flight slots together. It
    // goes on the router (`Router::layer`), so it sees the matched route.
    let layer = RateLimitLayer::new(LiveDecide::new(rules.clone()))
        .peer(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
        .client_ip(ClientIp::new(trust))
        .key_header("x-api-key")
        .missing_key(MissingKey::UseIp);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let app = Router::new()
        .route("/reports/{id}", get(proxy))
        .route("/login", post(proxy))
        .fallback(any(proxy))
        .layer(layer)
        .with_state((client, backend_port));

    let counters = limiter.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let redis = counters.client().connection().status();
            let status = rules.status();
            println!(
                "rules: version {} from {}  counters: {:?}  shards: {:?}  redis: {redis:?}",
                status.version,
                status.source,
                counters.counters().snapshot(),
                counters.shards()
            );
        }
    });

    let listener = TcpListener::bind(("127.0.0.1", gateway_port)).await?;
    println!("gateway on http://127.0.0.1:{gateway_port}/ -> backend on http://127.0.0.1:{backend_port}/");
    // The peer address reaches the layer only through ConnectInfo.
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::select! {
        served = axum::serve(listener, service) => served?,
        _ = tokio::signal::ctrl_c() => println!("bye"),
    }
    drop(watcher); // stops watching Redis
    Ok(())
}

type HttpClient = hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

/// Forwards a request to the backend on `port`, body and all.
async fn proxy(State((client, port)): State<(HttpClient, u16)>, mut req: Request) -> Response<Body> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("http://127.0.0.1:{port}{path}").parse() else {
        return status(StatusCode::BAD_REQUEST, "bad path\n");
    };
    *req.uri_mut() = uri;
    match client.request(req).await {
        Ok(response) => response.map(Body::new),
        Err(_) => status(StatusCode::BAD_GATEWAY, "backend unreachable\n"),
    }
}

fn status(code: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = code;
    r
}
