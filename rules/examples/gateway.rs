//! An API gateway on axum in front of a small HTTP service, rate-limited
//! by redis-rl: per client IP and per API key, from fixed policies or from
//! a rules file reloaded live.
//!
//! ```text
//! make run                                      # redis-server with the module on :6379
//! cargo run -p rl-rules --example gateway       # backend on :8081, gateway on :8080
//! curl -i -H 'x-api-key: alice' localhost:8080/hello
//! RULES_FILE=rules/rules.example.toml cargo run -p rl-rules --example gateway
//! ```
//!
//! Without `RULES_FILE`: each client IP (an IPv6 client is its /64) may
//! make 20 requests a second with bursts of 40; each API key (`x-api-key`)
//! 5 a second with bursts of 10, and 100 a minute. A request without a key
//! is limited by its IP only. With `RULES_FILE=path`: the file's rules,
//! read again every second (a broken file is refused and logged; the rules
//! in force stay); the key is the subject, and the IP's rule applies too.
//!
//! Environment: `REDIS_URL` (default `redis://127.0.0.1:6379/`), or
//! `REDIS_SENTINELS` (comma-separated `host:port` of sentinels) with
//! `REDIS_MASTER` (the name they monitor, default `mymaster`) for a primary
//! that Redis Sentinel fails over; `RL_BACKEND=lua` for servers without
//! the module, `GATEWAYS` (the fleet size, default 1), `GATEWAY_PORT`
//! (8080), `BACKEND_PORT` (8081), `RULES_FILE`, and `TRUSTED_PROXIES` (comma-separated networks of your
//! load balancers: their `X-Forwarded-For` is believed, nobody else's).
//! Counters are printed every 10 seconds; stop with Ctrl-C.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Response, StatusCode};
use axum::routing::any;
use axum::Router;
use rl_client::{Backend, Config, Limiter, Policy, Rule, Target};
use rl_http::{By, ClientIp, Decide, MissingKey, Policies, RateLimitLayer, Trust};
use rl_rules::{LiveDecide, LiveRules, RuleSetSpec};
use tokio::net::TcpListener;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// `REDIS_SENTINELS` and `REDIS_MASTER`, else `REDIS_URL`.
fn redis_target() -> Result<Target, rl_client::Error> {
    match std::env::var("REDIS_SENTINELS") {
        Ok(sentinels) => Ok(Target::sentinel(env("REDIS_MASTER", "mymaster"), sentinels.split(',').map(str::trim))),
        Err(_) => Target::from_url(&env("REDIS_URL", "redis://127.0.0.1:6379/")),
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

    // The service behind the gateway: it knows nothing of rate limits.
    let backend = Router::new().fallback(any(|req: Request| async move {
        format!("hello from the backend: {} {}\n", req.method(), req.uri().path())
    }));
    let upstream = TcpListener::bind(("127.0.0.1", backend_port)).await?;
    tokio::spawn(async move { axum::serve(upstream, backend).await });

    let config = Config {
        backend: if env("RL_BACKEND", "module") == "lua" { Backend::Lua } else { Backend::Module },
        gateways: env("GATEWAYS", "1").parse()?,
        ..Config::for_target(redis_target()?)
    };
    let limiter = Limiter::new(config)?;
    let proxies = env("TRUSTED_PROXIES", "");
    let trust = match proxies.as_str() {
        "" => Trust::Nobody,
        nets => Trust::Networks(nets.split(',').map(|n| n.trim().parse()).collect::<Result<_, _>>()?),
    };
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let forward = Router::new().fallback(any(proxy)).with_state((client, backend_port));

    // The layer order matters only when layers are stacked: an outer layer
    // charges a request the inner one may refuse. One layer with several
    // policies charges all of them or, on a refusal, gives back the rest.
    let app = match std::env::var("RULES_FILE") {
        Ok(path) => {
            let rules = LiveRules::new(limiter.clone(), &RuleSetSpec::from_file(&path)?)?;
            let watcher = rules.watch_file(&path, Duration::from_secs(1))?;
            std::mem::forget(watcher); // reload for the life of the process
            forward.layer(layer(LiveDecide::new(rules), trust))
        }
        Err(_) => {
            let per_ip =
                Policy::builder("gw:ip").label("ip").rule(Rule::per_second("per_second", 20).burst(40)).build()?;
            let per_key = Policy::builder("gw:key")
                .label("key")
                .rule(Rule::per_second("per_second", 5).burst(10))
                .rule(Rule::per_minute("per_minute", 100))
                .build()?;
            let policies = Policies::new(limiter.clone()).add(per_ip, By::Ip).add(per_key, By::Key);
            forward.layer(layer(policies, trust))
        }
    };

    let counters = limiter.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let redis = counters.client().connection().status();
            println!(
                "counters: {:?}  shards: {:?}  redis: {redis:?}",
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
    Ok(())
}

/// The gateway's layer: the API key from `x-api-key`, else the client IP.
fn layer<D: Decide>(decide: D, trust: Trust) -> RateLimitLayer<D> {
    RateLimitLayer::new(decide)
        .peer(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
        .client_ip(ClientIp::new(trust))
        .key_header("x-api-key")
        .missing_key(MissingKey::UseIp)
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
