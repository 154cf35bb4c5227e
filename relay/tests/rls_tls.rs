//! The RLS front over TLS and mutual TLS (envoyproxy/ratelimit's
//! GRPC_SERVER_USE_TLS), with certificates made here (rcgen): a real gRPC
//! client with the CA and its certificate is answered; a plain-text
//! client, one without a certificate, and one whose certificate is not for
//! the client SAN are not.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::certs::pem;
use common::rls::*;
use common::{Relay, Start};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use testkit::{free_port, Server};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const CONFIG: &str =
    "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";

/// A CA, the server's certificate (for 127.0.0.1 and localhost) and two
/// client certificates (for `envoy.client` and `other.client`), as PEM
/// files in `dir`.
fn certificates(dir: &Path) {
    certificates_as(dir, "rl-relay test CA")
}

fn certificates_as(dir: &Path, ca_name: &str) {
    let leaves: [(&str, &[&str]); 3] =
        [("server", &["localhost", "127.0.0.1"]), ("client", &["envoy.client"]), ("other", &["other.client"])];
    common::certs::certificates(dir, ca_name, &leaves);
}

/// A client of `port` over TLS (the CA trusted), with `client`'s
/// certificate if given; the error of its first call, if any.
async fn call(port: u16, dir: &Path, client: Option<&str>) -> Result<i32, String> {
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem(dir, "ca.crt"))).domain_name("localhost");
    if let Some(name) = client {
        tls = tls.identity(Identity::from_pem(pem(dir, &format!("{name}.crt")), pem(dir, &format!("{name}.key"))));
    }
    let channel = Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    let channel = channel.connect().await.map_err(|e| format!("connect: {e:?}"))?;
    let mut client = RateLimitServiceClient::new(channel);
    client
        .should_rate_limit(request("edge", &[&[("user", "ann")]]))
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|e| format!("{:?}: {}", e.code(), e.message()))
}

fn wait_port(relay: &mut Relay, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(relay.alive(), "rl-relay exited: {}", relay.log());
        assert!(Instant::now() < deadline, "the Envoy front did not listen: {}", relay.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_a_client_san() {
    let redis = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let (_cfg, config) = config_file(CONFIG);
    let file = |n: &str| dir.path().join(n).display().to_string();
    let relay = RlsRelay::start(
        &[redis.url()],
        false,
        &config,
        &[
            "--rls-tls-cert",
            &file("server.crt"),
            "--rls-tls-key",
            &file("server.key"),
            "--rls-tls-client-ca",
            &file("ca.crt"),
            "--rls-tls-client-san",
            "envoy.client",
        ],
    );
    let port = relay.rls_port;
    assert_eq!(call(port, dir.path(), Some("client")).await, Ok(OK), "{}", relay.relay.log());
    let other = call(port, dir.path(), Some("other")).await.unwrap_err();
    assert!(other.contains("Unauthenticated") && other.contains("envoy.client"), "{other}");
    assert_eq!(relay.metric("rl_relay_rls_san_refused_total"), 1.0);
    assert!(call(port, dir.path(), None).await.is_err(), "a client without a certificate");
    // Under TLS 1.3 the client may see its failure before the server has
    // counted it: the count is waited for.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while relay.metric("rl_relay_rls_tls_handshake_failures_total") < 1.0 {
        assert!(std::time::Instant::now() < deadline, "the refused handshake is never counted");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Plain text is not served.
    let mut plain = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await;
    if let Ok(client) = plain.as_mut() {
        assert!(client.should_rate_limit(request("edge", &[&[("user", "ann")]])).await.is_err());
    }
    assert!(!relay.relay.log().contains("PRIVATE KEY"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_envoy_gateway_starts_it_with_grpc_tls() {
    let redis = Server::start(&[]);
    let certs = tempfile::tempdir().unwrap();
    certificates(certs.path());
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("ratelimit/config")).unwrap();
    std::fs::write(root.path().join("ratelimit/config/config.yaml"), CONFIG).unwrap();
    let file = |n: &str| certs.path().join(n).display().to_string();
    let grpc = free_port();
    let mut relay = Relay::spawn(Start {
        env: vec![
            ("GRPC_HOST", "127.0.0.1".into()),
            ("GRPC_PORT", grpc.to_string()),
            ("HOST", "127.0.0.1".into()),
            ("PORT", free_port().to_string()),
            ("RUNTIME_ROOT", root.path().display().to_string()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
            ("REDIS_SOCKET_TYPE", "tcp".into()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("GRPC_SERVER_USE_TLS", "true".into()),
            ("GRPC_SERVER_TLS_CERT", file("server.crt")),
            ("GRPC_SERVER_TLS_KEY", file("server.key")),
            ("GRPC_CLIENT_TLS_CACERT", file("ca.crt")),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
            ("USE_STATSD", "false".into()),
        ],
        bare: true,
        ..Start::default()
    });
    wait_port(&mut relay, grpc);
    assert_eq!(call(grpc, certs.path(), Some("client")).await, Ok(OK), "{}", relay.log());
    assert_eq!(call(grpc, certs.path(), Some("other")).await, Ok(OK), "no SAN asked: any client the CA signed");
    assert!(call(grpc, certs.path(), None).await.is_err(), "a client without a certificate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_reloaded_when_their_files_change() {
    let redis = Server::start(&[]);
    let (live, first, second) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    certificates_as(first.path(), "first CA");
    certificates_as(second.path(), "second CA");
    for f in ["server.crt", "server.key"] {
        std::fs::copy(first.path().join(f), live.path().join(f)).unwrap();
    }
    let (_cfg, config) = config_file(CONFIG);
    let file = |n: &str| live.path().join(n).display().to_string();
    let relay = RlsRelay::start(
        &[redis.url()],
        false,
        &config,
        &["--rls-tls-cert", &file("server.crt"), "--rls-tls-key", &file("server.key")],
    );
    let port = relay.rls_port;
    assert_eq!(call(port, first.path(), None).await, Ok(OK));
    assert!(call(port, second.path(), None).await.is_err(), "the second CA is not trusted yet");
    // New files: new connections get them.
    for f in ["server.key", "server.crt"] {
        std::fs::copy(second.path().join(f), live.path().join(f)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while call(port, second.path(), None).await.is_err() {
        assert!(Instant::now() < deadline, "never reloaded: {}", relay.relay.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(call(port, first.path(), None).await.is_err(), "the first certificate is gone");
    assert!(relay.relay.log().contains("TLS certificates reloaded"), "{}", relay.relay.log());
    // A bad file is refused, the certificates in force kept.
    let errors = relay.metric("rl_relay_rls_tls_reload_errors_total");
    std::fs::write(live.path().join("server.crt"), "not a certificate\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while relay.metric("rl_relay_rls_tls_reload_errors_total") <= errors {
        assert!(Instant::now() < deadline, "the bad file never refused: {}", relay.relay.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Answered (over its limit of 2 by now: served all the same).
    assert!(call(port, second.path(), None).await.is_ok());
    assert!(relay.relay.log().contains("TLS certificates refused, the ones in force kept"), "{}", relay.relay.log());
}
