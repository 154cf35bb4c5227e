//! The RLS front's config over xDS (envoyproxy/ratelimit's
//! CONFIG_TYPE=GRPC_XDS_SOTW): an ADS server written here (tonic, over
//! mutual TLS with certificates made here) pushes versions of
//! `ratelimit.config.ratelimit.v3.RateLimitConfig`; the relay answers
//! ShouldRateLimit per each good one, NACKs a bad one (the one in force
//! kept), and reconnects when the server goes away and comes back. Every
//! wait is for a condition, with a generous deadline.

mod common;

use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::certs::pem;
use common::rls::{get, request, OK, OVER_LIMIT};
use common::{Relay, Start};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::Any;
use futures_util::Stream;
use prost::Message;
use rl_relay::rls::xds_proto::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, TYPE_URL};
use testkit::{free_port, Server};
use tokio::sync::{mpsc, watch};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// A CA, and certificates it signed: `server` (localhost, 127.0.0.1: the
/// ADS server and the relay's front), `relay` (the relay as the ADS
/// server's client) and `envoy` (the front's gRPC client).
fn certificates(dir: &Path) {
    let leaves: [(&str, &[&str]); 3] =
        [("server", &["localhost", "127.0.0.1"]), ("relay", &["relay.client"]), ("envoy", &["envoy.client"])];
    common::certs::certificates(dir, "rl-relay xDS test CA", &leaves);
}

/// One domain `edge`: `user` limited to `n` a minute; with `n` 0, 5 of
/// an unknown unit (UNKNOWN, 0): a config the loader refuses.
fn version(n: u32) -> Vec<Any> {
    let rate_limit = match n {
        0 => RateLimitPolicy { unit: 0, requests_per_unit: 5, ..Default::default() },
        n => RateLimitPolicy { unit: 2, requests_per_unit: n, ..Default::default() },
    };
    let config = RateLimitConfig {
        name: "edge-config".into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(rate_limit),
            ..Default::default()
        }],
    };
    vec![Any { type_url: TYPE_URL.into(), value: config.encode_to_vec() }]
}

/// What the test's ADS server pushes, and what it saw.
#[derive(Clone)]
struct Ads {
    /// The version in force on the server: (version, resources).
    snapshot: watch::Sender<Option<(String, Vec<Any>)>>,
    /// Every request received, with the stream's headers.
    seen: Arc<Mutex<Vec<DiscoveryRequest>>>,
    headers: Arc<Mutex<Vec<tonic::metadata::MetadataMap>>>,
    /// Every stream ends when it turns true.
    stop: watch::Sender<bool>,
}

/// Once `stop` turns true.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        self.headers.lock().unwrap().push(request.metadata().clone());
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<DiscoveryResponse, Status>>(4);
        let (seen, mut snapshot, mut stop) = (self.seen.clone(), self.snapshot.subscribe(), self.stop.subscribe());
        tokio::spawn(async move {
            // The relay speaks first.
            match incoming.message().await {
                Ok(Some(first)) => seen.lock().unwrap().push(first),
                _ => return,
            }
            snapshot.mark_changed();
            loop {
                tokio::select! {
                    message = incoming.message() => match message {
                        Ok(Some(r)) => seen.lock().unwrap().push(r),
                        _ => return,
                    },
                    changed = snapshot.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let pushed = snapshot.borrow_and_update().clone();
                        if let Some((version, resources)) = pushed {
                            let response = DiscoveryResponse {
                                version_info: version.clone(),
                                resources,
                                type_url: TYPE_URL.into(),
                                nonce: format!("nonce-{version}"),
                                ..Default::default()
                            };
                            if tx.send(Ok(response)).await.is_err() {
                                return;
                            }
                        }
                    }
                    _ = stopped(&mut stop) => return,
                }
            }
        });
        let responses = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        Ok(Response::new(Box::pin(responses)))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

impl Ads {
    fn new() -> Ads {
        Ads {
            snapshot: watch::channel(None).0,
            seen: Arc::default(),
            headers: Arc::default(),
            stop: watch::channel(false).0,
        }
    }

    /// Serves on `port` over mutual TLS (clients the CA signed) until
    /// `stop`: every stream ended, then the server.
    fn serve(&self, port: u16, certs: &Path) -> tokio::task::JoinHandle<()> {
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(pem(certs, "server.crt"), pem(certs, "server.key")))
            .client_ca_root(Certificate::from_pem(pem(certs, "ca.crt")));
        let server = tonic::transport::Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(AggregatedDiscoveryServiceServer::new(self.clone()));
        let mut stop = self.stop.subscribe();
        tokio::spawn(async move {
            let address: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
            server.serve_with_shutdown(address, async move { stopped(&mut stop).await }).await.unwrap();
        })
    }

    fn push(&self, version: &str, resources: Vec<Any>) {
        self.snapshot.send_replace(Some((version.into(), resources)));
    }

    /// Waits (30 s at most) for the relay's answer to `version`: an ACK
    /// (None) or a NACK (its error_detail's message).
    async fn answer(&self, version: &str, relay: &mut Relay) -> Option<String> {
        let nonce = format!("nonce-{version}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = self.seen.lock().unwrap().iter().find(|r| r.response_nonce == nonce).cloned();
            if let Some(r) = found {
                assert_eq!(r.type_url, TYPE_URL);
                return r.error_detail.map(|e| format!("{} (version_info '{}')", e.message, r.version_info));
            }
            assert!(relay.alive(), "rl-relay exited: {}", relay.log());
            assert!(Instant::now() < deadline, "no answer to version {version}: {}", relay.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A gRPC client of the front on `port`, over TLS when `certs` are given
/// (the CA trusted, `envoy`'s certificate shown).
async fn client(port: u16, certs: Option<&Path>) -> RateLimitServiceClient<Channel> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let channel = match certs {
            None => Channel::from_shared(format!("http://127.0.0.1:{port}")).unwrap(),
            Some(dir) => Channel::from_shared(format!("https://127.0.0.1:{port}"))
                .unwrap()
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(pem(dir, "ca.crt")))
                        .domain_name("localhost")
                        .identity(Identity::from_pem(pem(dir, "envoy.crt"), pem(dir, "envoy.key"))),
                )
                .unwrap(),
        };
        match channel.connect_timeout(Duration::from_secs(5)).connect().await {
            Ok(channel) => return RateLimitServiceClient::new(channel),
            Err(e) => assert!(Instant::now() < deadline, "the front on {port}: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The overall codes of `n` requests for `user`, one after the other.
async fn codes(client: &mut RateLimitServiceClient<Channel>, user: &str, n: usize) -> Vec<i32> {
    let mut codes = Vec::new();
    for _ in 0..n {
        let answer = client.should_rate_limit(request("edge", &[&[("user", user)]])).await.unwrap();
        codes.push(answer.into_inner().overall_code);
    }
    codes
}

/// A sample of /metrics on `port` (0 if absent).
fn metric(port: u16, name: &str) -> f64 {
    let (_, body) = get(port, "/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .map_or(0.0, |v| v.parse().unwrap())
}

/// Waits (30 s at most) for `what` to hold.
async fn until(relay: &mut Relay, what: &str, mut check: impl FnMut(&Relay) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check(relay) {
        assert!(relay.alive(), "rl-relay exited: {}", relay.log());
        assert!(Instant::now() < deadline, "never {what}: {}", relay.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_applied_a_bad_one_nacked_and_the_server_may_go_away() {
    let redis = Server::start(&[]);
    let certs = tempfile::tempdir().unwrap();
    certificates(certs.path());
    let file = |n: &str| certs.path().join(n).display().to_string();
    let (ads_port, rls_port, metrics) = (free_port(), free_port(), free_port());
    let ads = Ads::new();
    let server = ads.serve(ads_port, certs.path());
    let mut relay = Relay::spawn(Start::args(&[
        "--redis",
        &redis.url(),
        "--rls-listen",
        &format!("127.0.0.1:{rls_port}"),
        "--metrics",
        &format!("127.0.0.1:{metrics}"),
        "--timeout-ms",
        "1000",
        "--rls-timeout-ms",
        "2000",
        "--rls-xds",
        &format!("127.0.0.1:{ads_port}"),
        "--rls-xds-node-id",
        "rl-test-node",
        "--rls-xds-node-metadata",
        "zone=a,team=edge",
        "--rls-xds-headers",
        "x-tenant:blue",
        "--rls-xds-tls",
        "--rls-xds-tls-ca",
        &file("ca.crt"),
        "--rls-xds-tls-cert",
        &file("relay.crt"),
        "--rls-xds-tls-key",
        &file("relay.key"),
        "--rls-xds-tls-san",
        "localhost",
        "--rls-xds-connect-retry-ms",
        "100",
        "--rls-xds-backoff-initial-ms",
        "100",
        "--rls-xds-backoff-max-ms",
        "400",
    ]));
    // Connected, asking as its node, and not ready before a first version.
    until(&mut relay, "connected", |_| metric(metrics, "rl_relay_rls_xds_connected") == 1.0).await;
    until(&mut relay, "asking for its config", |_| !ads.seen.lock().unwrap().is_empty()).await;
    {
        let seen = ads.seen.lock().unwrap();
        let node = seen[0].node.as_ref().unwrap();
        assert_eq!(node.id, "rl-test-node");
        let zone = node.metadata.as_ref().unwrap().fields["zone"].kind.clone();
        assert_eq!(zone, Some(envoy_types::pb::google::protobuf::value::Kind::StringValue("a".into())));
        assert_eq!((seen[0].type_url.as_str(), seen[0].version_info.as_str()), (TYPE_URL, ""));
        assert_eq!(ads.headers.lock().unwrap()[0].get("x-tenant").unwrap(), "blue");
    }
    assert_eq!(get(metrics, "/healthcheck").0, 500, "not ready before the first version");
    let mut client = client(rls_port, None).await;

    ads.push("1", version(1));
    assert_eq!(ads.answer("1", &mut relay).await, None, "v1 ACKed");
    assert_eq!(codes(&mut client, "ann", 2).await, [OK, OVER_LIMIT], "per v1: 1 a minute");
    until(&mut relay, "healthy", |_| get(metrics, "/healthcheck").0 == 200).await;

    ads.push("2", version(3));
    assert_eq!(ads.answer("2", &mut relay).await, None, "v2 ACKed");
    assert_eq!(codes(&mut client, "bob", 4).await, [OK, OK, OK, OVER_LIMIT], "per v2: 3 a minute");

    ads.push("3", version(0));
    let nack = ads.answer("3", &mut relay).await.expect("v3 NACKed");
    assert!(nack.contains("edge-config") && nack.contains("rate_limit") && nack.contains("UNKNOWN"), "{nack}");
    assert!(nack.ends_with("(version_info '2')"), "the version in force: {nack}");
    assert_eq!(codes(&mut client, "cy", 4).await, [OK, OK, OK, OVER_LIMIT], "still per v2");
    // Bytes that are no RateLimitConfig, and a resource of another type.
    ads.push("3b", vec![Any { type_url: TYPE_URL.into(), value: vec![0x0a, 0xff] }]);
    let nack = ads.answer("3b", &mut relay).await.expect("3b NACKed");
    assert!(nack.contains("resources[0]") && nack.contains("not a RateLimitConfig"), "{nack}");
    let cluster = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    ads.push("3c", vec![Any { type_url: cluster.into(), value: Vec::new() }]);
    let nack = ads.answer("3c", &mut relay).await.expect("3c NACKed");
    assert!(nack.contains(cluster) && nack.ends_with("(version_info '2')"), "{nack}");
    assert_eq!(codes(&mut client, "cyd", 4).await, [OK, OK, OK, OVER_LIMIT], "still per v2");
    assert_eq!(metric(metrics, "rl_relay_rls_xds_versions_applied_total"), 2.0);
    assert_eq!(metric(metrics, "rl_relay_rls_xds_nacks_total"), 3.0);
    assert_eq!(metric(metrics, "ratelimit_service_config_load_error"), 3.0);
    assert_eq!(metric(metrics, "ratelimit_service_config_load_success"), 2.0);
    assert!(relay.log().contains("refused (NACK)"), "{}", relay.log());

    // The server goes away: v2 stays in force meanwhile.
    ads.stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(30), server).await.expect("the server stopped").unwrap();
    until(&mut relay, "disconnected", |_| metric(metrics, "rl_relay_rls_xds_connected") == 0.0).await;
    assert_eq!(codes(&mut client, "dee", 4).await, [OK, OK, OK, OVER_LIMIT], "v2 kept while the server is away");
    assert_eq!(get(metrics, "/healthcheck").0, 200, "ready on the config in force");

    // It comes back (same port) with v4: the relay reconnects, says it
    // holds v2, and applies v4.
    let back = Ads::new();
    back.push("4", version(2));
    let _server = back.serve(ads_port, certs.path());
    assert_eq!(back.answer("4", &mut relay).await, None, "v4 ACKed");
    assert_eq!(back.seen.lock().unwrap()[0].version_info, "2", "the reconnection names the version in force");
    assert_eq!(codes(&mut client, "eve", 3).await, [OK, OK, OVER_LIMIT], "per v4: 2 a minute");
    assert_eq!(metric(metrics, "rl_relay_rls_xds_versions_applied_total"), 3.0);
    assert_eq!(metric(metrics, "rl_relay_rls_xds_connected"), 1.0);
    back.stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_envoy_gateway_deploys_it_config_over_xds_and_grpc_tls() {
    let redis = Server::start(&[]);
    let certs = tempfile::tempdir().unwrap();
    certificates(certs.path());
    let file = |n: &str| certs.path().join(n).display().to_string();
    let (ads_port, grpc, health) = (free_port(), free_port(), free_port());
    let ads = Ads::new();
    let _server = ads.serve(ads_port, certs.path());
    // Envoy Gateway's deployment of the rate limit service, on loopback.
    let mut relay = Relay::spawn(Start {
        env: vec![
            ("GRPC_HOST", "127.0.0.1".into()),
            ("GRPC_PORT", grpc.to_string()),
            ("HOST", "127.0.0.1".into()),
            ("PORT", health.to_string()),
            ("LOG_LEVEL", "info".into()),
            ("USE_STATSD", "false".into()),
            ("REDIS_SOCKET_TYPE", "tcp".into()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
            ("CONFIG_GRPC_XDS_SERVER_URL", format!("localhost:{ads_port}")),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", file("relay.crt")),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", file("relay.key")),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", file("ca.crt")),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "100ms".into()),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms".into()),
            ("GRPC_SERVER_USE_TLS", "true".into()),
            ("GRPC_SERVER_TLS_CERT", file("server.crt")),
            ("GRPC_SERVER_TLS_KEY", file("server.key")),
            ("GRPC_CLIENT_TLS_CACERT", file("ca.crt")),
        ],
        bare: true,
        ..Start::default()
    });
    until(&mut relay, "asking for its config", |_| !ads.seen.lock().unwrap().is_empty()).await;
    assert_eq!(ads.seen.lock().unwrap()[0].node.as_ref().unwrap().id, "envoy-ratelimit");
    assert_eq!(get(health, "/healthcheck").0, 500, "not ready before the first version (no FORCE_START)");
    ads.push("v1", version(2));
    assert_eq!(ads.answer("v1", &mut relay).await, None);
    until(&mut relay, "healthy", |_| get(health, "/healthcheck").0 == 200).await;
    let mut client = client(grpc, Some(certs.path())).await;
    // Per v1, 2 a minute, decided by Redis. Started with no argument, a
    // decision waits the default 15 ms for Redis: on a loaded machine the
    // fallback may answer one (counted); such a try is taken again with
    // another user, five tries at most.
    let disturbed = || metric(health, "rl_relay_rls_fallback_total") + metric(health, "rl_relay_rls_timeouts_total");
    for tries in 1.. {
        let before = disturbed();
        let got = codes(&mut client, &format!("ann{tries}"), 3).await;
        if disturbed() == before {
            assert_eq!(got, [OK, OK, OVER_LIMIT], "{}", relay.log());
            break;
        }
        assert!(tries < 5, "every try answered by the fallback: {}", relay.log());
    }
    let log = relay.log();
    assert!(!log.contains("not served"), "every variable set is served: {log}");
    assert!(!log.contains("PRIVATE KEY"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_to_start_it_is_ready_before_the_first_version() {
    let redis = Server::start(&[]);
    let (rls_port, metrics) = (free_port(), free_port());
    // No server listens: the relay starts, ready, and keeps trying.
    let mut relay = Relay::spawn(Start::args(&[
        "--redis",
        &redis.url(),
        "--rls-listen",
        &format!("127.0.0.1:{rls_port}"),
        "--metrics",
        &format!("127.0.0.1:{metrics}"),
        "--rls-xds",
        &format!("127.0.0.1:{}", free_port()),
        "--timeout-ms",
        "1000",
        "--rls-timeout-ms",
        "2000",
        "--rls-start-without-config",
        "--rls-ready-without-config",
        "--rls-xds-connect-retry-ms",
        "100",
    ]));
    until(&mut relay, "healthy", |_| get(metrics, "/healthcheck").0 == 200).await;
    until(&mut relay, "logging its tries", |r| r.log().contains("no config stream from")).await;
    assert_eq!(metric(metrics, "rl_relay_rls_xds_connected"), 0.0);
    let log = relay.log();
    assert!(log.contains("no config stream from") && log.contains("connecting"), "{log}");
    let mut client = client(rls_port, None).await;
    assert_eq!(codes(&mut client, "ann", 1).await, [OK], "an unknown domain answered OK, as upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_xds_servers_tls_is_checked_both_ways() {
    let redis = Server::start(&[]);
    let certs = tempfile::tempdir().unwrap();
    certificates(certs.path());
    let file = |n: &str| certs.path().join(n).display().to_string();
    let ads_port = free_port();
    let ads = Ads::new();
    ads.push("1", version(1));
    let _server = ads.serve(ads_port, certs.path());
    let start = |extra: &[&str]| {
        let (redis, rls, url) = (redis.url(), format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{ads_port}"));
        let mut args =
            vec!["--redis", &redis, "--rls-listen", &rls, "--rls-xds", &url, "--rls-xds-connect-retry-ms", "100"];
        args.extend_from_slice(extra);
        Relay::spawn(Start { no_wait: true, ..Start::args(&args) })
    };
    // No client certificate (the server asks for one), and a server name
    // its certificate does not hold: no stream, no request seen.
    let ca = file("ca.crt");
    let mut anonymous = start(&["--rls-xds-tls", "--rls-xds-tls-ca", &ca]);
    let (cert, key) = (file("relay.crt"), file("relay.key"));
    let mut misnamed = start(&[
        "--rls-xds-tls",
        "--rls-xds-tls-ca",
        &ca,
        "--rls-xds-tls-cert",
        &cert,
        "--rls-xds-tls-key",
        &key,
        "--rls-xds-tls-san",
        "elsewhere.example",
    ]);
    for relay in [&mut anonymous, &mut misnamed] {
        until(relay, "a failed try logged", |r| r.log().contains("no config stream from")).await;
    }
    assert!(ads.seen.lock().unwrap().is_empty(), "{}\n{}", anonymous.log(), misnamed.log());
    assert!(
        misnamed.log().contains("elsewhere.example") || misnamed.log().contains("NotValidForName"),
        "{}",
        misnamed.log()
    );
    // A CA file that cannot be read refuses the start, named.
    let mut refused = start(&["--rls-xds-tls", "--rls-xds-tls-ca", "/nonexistent/ca.crt"]);
    assert_eq!(refused.exit_code(), Some(2), "{}", refused.log());
    assert!(refused.log().contains("--rls-xds-tls-ca /nonexistent/ca.crt"), "{}", refused.log());
}
