//! envoyproxy/ratelimit's operational variables, rl-relay started as
//! `/bin/ratelimit` with them (no argument): USE_STATSD into a statsd
//! socket of the test, GRPC_UDS, LOG_FORMAT=json, the debug port's
//! /rlconfig, and SIGTERM's drain. Real Redis with the module, real
//! gRPC clients, a real process.

mod common;

use std::collections::HashMap;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::rls::{ask, config_folder, request, start_bare, OK, OVER_LIMIT};
use testkit::Server;

const CONFIG: &str =
    "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";

/// The statsd lines received on `socket` until `enough` says the sums
/// are there (20 s at most), then for `settle` more: name -> (sum of its
/// counter values, lines), and the timer lines.
fn statsd_lines(
    socket: &UdpSocket,
    enough: impl Fn(&HashMap<String, (u64, u64)>) -> bool,
    settle: Duration,
) -> (HashMap<String, (u64, u64)>, Vec<String>) {
    socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut counters: HashMap<String, (u64, u64)> = HashMap::new();
    let mut timers = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut settled: Option<Instant> = None;
    let mut buf = [0u8; 65536];
    loop {
        if let Ok(n) = socket.recv(&mut buf) {
            for line in std::str::from_utf8(&buf[..n]).unwrap().lines().filter(|l| !l.is_empty()) {
                let (name, rest) = line.split_once(':').unwrap_or_else(|| panic!("not a statsd line: {line}"));
                match rest.split_once('|') {
                    Some((value, "c")) => {
                        let entry = counters.entry(name.to_string()).or_default();
                        entry.0 += value.parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
                        entry.1 += 1;
                    }
                    Some((_, "ms")) => timers.push(line.to_string()),
                    _ => panic!("not a counter nor a timer: {line}"),
                }
            }
        }
        match settled {
            Some(at) if Instant::now() >= at => return (counters, timers),
            Some(_) => {}
            None if enough(&counters) => settled = Some(Instant::now() + settle),
            None => assert!(Instant::now() < deadline, "statsd lines never complete: {counters:?} {timers:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn use_statsd_sends_upstreams_names_with_exact_counts() {
    let redis = Server::start(&[]);
    let root = config_folder(Some(CONFIG));
    let statsd = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut bare = start_bare(
        root.path(),
        &[
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("USE_STATSD", "true".into()),
            ("STATSD_HOST", "localhost".into()),
            ("STATSD_PORT", statsd.local_addr().unwrap().port().to_string()),
            ("EXTRA_TAGS", "zone:eu.1".into()),
            ("STATS_FLUSH_INTERVAL", "100ms".into()),
        ],
    );
    let mut client = bare.client().await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER_LIMIT], "{}", bare.relay.log());
    assert_eq!(ask(&mut client, request("nowhere", &[&[("user", "ann")]])).await.overall_code, OK);

    let tag = ".__zone=eu_1";
    let per_key = "ratelimit.service.rate_limit.edge.user";
    let expected: HashMap<String, u64> = [
        (format!("{per_key}.total_hits{tag}"), 3),
        (format!("{per_key}.within_limit{tag}"), 2),
        (format!("{per_key}.near_limit{tag}"), 1),
        (format!("{per_key}.over_limit{tag}"), 1),
        (format!("ratelimit.service.rate_limit.nowhere.domain_not_found{tag}"), 1),
        (format!("ratelimit.service.config_load_success{tag}"), 1),
        (format!("ratelimit_server.ShouldRateLimit.total_requests{tag}"), 4),
    ]
    .into_iter()
    .collect();
    let enough =
        |got: &HashMap<String, (u64, u64)>| expected.iter().all(|(k, v)| got.get(k).is_some_and(|g| g.0 >= *v));
    // Ten flushes more after the sums are there: nothing is sent twice.
    let (counters, timers) = statsd_lines(&statsd, enough, Duration::from_secs(1));
    let sums: HashMap<String, u64> = counters.iter().map(|(k, v)| (k.clone(), v.0)).collect();
    assert_eq!(sums, expected, "{}", bare.relay.log());
    // A counter that did not move is not sent (shadow_mode, the errors).
    assert!(!counters.keys().any(|k| k.contains("shadow_mode") || k.contains("error")), "{counters:?}");
    // One response time per call, in whole ms, tagged.
    assert_eq!(timers.len(), 4, "{timers:?}");
    for t in &timers {
        let value = t.strip_prefix(&format!("ratelimit_server.ShouldRateLimit.response_time{tag}:")).unwrap();
        value.strip_suffix("|ms").unwrap().parse::<u64>().unwrap();
    }
    // /metrics stays, the same counts.
    let (code, body) = common::rls::get(bare.health, "/metrics");
    assert_eq!(code, 200);
    assert!(body.contains("ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"user\"} 1"), "{body}");
    assert!(body.contains("rl_relay_rls_statsd_dropped_total 0"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_uds_serves_the_envoy_front_on_a_unix_socket() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let redis = Server::start(&[]);
    let root = config_folder(Some(CONFIG));
    let socket = root.path().join("rls.sock");
    let mut bare = start_bare(
        root.path(),
        &[("REDIS_URL", format!("127.0.0.1:{}", redis.port)), ("GRPC_UDS", socket.display().to_string())],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let channel = loop {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("unix:{}", socket.display())).unwrap();
        match endpoint.connect().await {
            Ok(channel) => break channel,
            Err(e) => {
                assert!(bare.relay.alive(), "rl-relay exited: {}", bare.relay.log());
                assert!(Instant::now() < deadline, "no Unix socket: {e}: {}", bare.relay.log());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let mut client = RateLimitServiceClient::new(channel);
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER_LIMIT], "{}", bare.relay.log());
    // GRPC_UDS instead of GRPC_HOST:GRPC_PORT, as upstream.
    assert!(std::net::TcpStream::connect(("127.0.0.1", bare.grpc)).is_err());
    assert!(bare.relay.log().contains(&format!("RLS listening on unix:{}", socket.display())), "{}", bare.relay.log());
}

/// Every line of `log` parsed as JSON: one object of upstream's three
/// fields (logrus's, as its LOG_FORMAT=json names them).
fn json_lines(log: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    assert!(!log.is_empty());
    log.lines()
        .map(|line| {
            let value: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            let object = value.as_object().unwrap_or_else(|| panic!("not an object: {line}")).clone();
            let keys: Vec<&str> = object.keys().map(String::as_str).collect();
            assert_eq!(keys, ["@message", "@timestamp", "level"], "{line}");
            let at = object["@timestamp"].as_str().unwrap();
            humantime::parse_rfc3339(at).unwrap_or_else(|e| panic!("{at}: {e}"));
            object
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_json_writes_one_object_a_line() {
    let redis = Server::start(&[]);
    let root = config_folder(Some(CONFIG));
    let url = ("REDIS_URL", format!("127.0.0.1:{}", redis.port));
    let json = ("LOG_FORMAT", "json".to_string());
    let mut bare = start_bare(root.path(), &[url.clone(), json.clone(), ("TRACING_ENABLED", "true".into())]);
    let mut client = bare.client().await;
    assert_eq!(ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code, OK);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !bare.relay.log().contains("RLS listening") {
        assert!(Instant::now() < deadline, "{}", bare.relay.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let lines = json_lines(&bare.relay.log());
    let message = |needle: &str| {
        lines
            .iter()
            .find(|o| o["@message"].as_str().unwrap().contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle}: {lines:?}"))
    };
    assert_eq!(message("TRACING_ENABLED")["level"], "warning");
    assert_eq!(message("RLS listening on 127.0.0.1:")["level"], "warning");

    // A refused start: its reason as an error object.
    let mut refused = start_bare(root.path(), &[url.clone(), json.clone(), ("BACKEND_TYPE", "memcache".into())]);
    assert_eq!(refused.relay.exit_code(), Some(2));
    let lines = json_lines(&refused.relay.log());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["level"], "error");
    assert!(lines[0]["@message"].as_str().unwrap().contains("BACKEND_TYPE=memcache"), "{lines:?}");
    // A value the command line's own parser refuses, as an error object too.
    let mut refused = start_bare(root.path(), &[url.clone(), json.clone(), ("NEAR_LIMIT_RATIO", "2".into())]);
    assert_eq!(refused.relay.exit_code(), Some(2));
    let lines = json_lines(&refused.relay.log());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["level"], "error");
    assert!(lines[0]["@message"].as_str().unwrap().contains("'2': a ratio from 0 to 1"), "{lines:?}");

    // LOG_LEVEL=error: the warnings are not written; a level logrus cannot read refuses the start.
    let mut quiet = start_bare(
        root.path(),
        &[url.clone(), json, ("TRACING_ENABLED", "true".into()), ("LOG_LEVEL", "error".into())],
    );
    let mut client = quiet.client().await;
    assert_eq!(ask(&mut client, request("edge", &[&[("user", "bob")]])).await.overall_code, OK);
    assert_eq!(quiet.relay.log(), "");
    let mut loud = start_bare(root.path(), &[url, ("LOG_LEVEL", "loud".into())]);
    assert_eq!(loud.relay.exit_code(), Some(2));
    assert!(loud.relay.log().contains("LOG_LEVEL=loud"), "{}", loud.relay.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debug_port_prints_the_config_in_force_as_upstream() {
    use common::rls::get;
    let redis = Server::start(&[]);
    let root = config_folder(Some(CONFIG));
    let debug = testkit::free_port();
    let mut bare = start_bare(
        root.path(),
        &[("REDIS_URL", format!("127.0.0.1:{}", redis.port)), ("DEBUG_PORT", debug.to_string())],
    );
    bare.listening();
    let deadline = Instant::now() + Duration::from_secs(20);
    let line = "edge.user: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n";
    while get(debug, "/rlconfig") != (200, line.to_string()) {
        assert!(Instant::now() < deadline, "{:?}: {}", get(debug, "/rlconfig"), bare.relay.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        get(debug, "/"),
        (200, "/rlconfig: print out the currently loaded configuration for debugging\n".into())
    );
    let (code, body) = get(debug, "/debug/pprof/profile");
    assert_eq!(code, 404);
    assert!(body.contains("not served") && body.contains("/metrics"), "{body}");
    // The operator pages stay on PORT, not here.
    assert_eq!(get(debug, "/metrics").0, 404);
    assert_eq!(get(bare.health, "/rlconfig").0, 404);
    // A reload shows.
    let text = CONFIG.replace("requests_per_unit: 2", "requests_per_unit: 3");
    std::fs::write(root.path().join("ratelimit/config/config.yaml"), text).unwrap();
    let reloaded = line.replace("=2,", "=3,");
    while get(debug, "/rlconfig").1 != reloaded {
        assert!(Instant::now() < deadline + Duration::from_secs(10), "{:?}", get(debug, "/rlconfig"));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A relay on CONFIG with `extra` flags, a call of it in flight on Redis
/// (writes paused for `pause_ms`: its window lease waits), then SIGTERM.
/// Returns what must outlive the call (Redis, the config), the relay, the
/// call, and whether /healthcheck said 500 while the relay drained.
async fn sigterm_with_a_call_in_flight(pause_ms: u64, extra: &[&str]) -> Drained {
    use common::rls::{config_file, RlsRelay};
    let redis = Server::start(&[]);
    let (dir, config) = config_file(CONFIG);
    let mut args = vec!["--rls-timeout-ms", "30000"];
    args.extend_from_slice(extra);
    let mut relay = RlsRelay::start(&[redis.url()], false, &config, &args);
    let mut client = relay.client().await;
    // The connection up, no Redis call made (a domain no config names).
    assert_eq!(ask(&mut client, request("nowhere", &[&[("user", "ann")]])).await.overall_code, OK);
    let deadline = Instant::now() + Duration::from_secs(20);
    while relay.get("/healthcheck").0 != 200 {
        assert!(Instant::now() < deadline, "never ready: {}", relay.relay.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = "rl_relay_rls_redis_calls_total";
    let before = relay.metric(calls);
    // Writes paused (the health probe's PING and RL.PEEK still answered).
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(pause_ms).arg("WRITE").query(&mut redis.con()).unwrap();
    let mut caller = client.clone();
    let call = tokio::spawn(async move {
        caller.should_rate_limit(request("edge", &[&[("user", "bob")]])).await.map(|r| r.into_inner().overall_code)
    });
    // In the relay: its window lease sent to Redis.
    while relay.metric(calls) <= before {
        assert!(Instant::now() < deadline, "the call never reached Redis: {}", relay.relay.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // SAFETY: a signal to the child process this test started.
    assert_eq!(unsafe { libc::kill(relay.relay.pid() as i32, libc::SIGTERM) }, 0);
    let mut unready = false;
    while relay.relay.alive() && Instant::now() < deadline {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", relay.metrics_port)) else { break };
        use std::io::{Read, Write};
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = write!(s, "GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        if text.starts_with("HTTP/1.1 500") {
            unready = true;
            // No new connection on the Envoy front.
            assert!(std::net::TcpStream::connect(("127.0.0.1", relay.rls_port)).is_err(), "{}", relay.relay.log());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Drained { _kept: (redis, dir), relay, call, unready }
}

struct Drained {
    _kept: (Server, tempfile::TempDir),
    relay: common::rls::RlsRelay,
    call: tokio::task::JoinHandle<Result<i32, tonic::Status>>,
    unready: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_the_calls_in_flight_then_exits_0() {
    // The relay waits for Redis longer than the pause.
    let Drained { _kept, mut relay, call, unready } =
        sigterm_with_a_call_in_flight(3000, &["--timeout-ms", "10000"]).await;
    assert!(unready, "/healthcheck never said 500 while draining: {}", relay.relay.log());
    // Answered by Redis once its writes resumed, within the drain.
    assert_eq!(call.await.unwrap().unwrap(), OK, "{}", relay.relay.log());
    assert_eq!(relay.relay.exit_code(), Some(0), "{}", relay.relay.log());
    let log = relay.relay.log();
    assert!(log.contains("SIGTERM: draining the Envoy front") && log.contains("SIGTERM: drained, exiting"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_0_at_the_drain_bound_with_a_call_still_in_flight() {
    let Drained { _kept, mut relay, call, .. } =
        sigterm_with_a_call_in_flight(8000, &["--rls-drain-timeout-ms", "300", "--timeout-ms", "10000"]).await;
    assert_eq!(relay.relay.exit_code(), Some(0), "{}", relay.relay.log());
    assert!(call.await.unwrap().is_err(), "the call cut by the exit");
    let log = relay.relay.log();
    assert!(log.contains("300 ms passed (--rls-drain-timeout-ms): exiting with calls still in flight"), "{log}");
}
