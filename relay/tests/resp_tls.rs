//! The RESP front over TLS (`--resp-tls-cert`, `--resp-tls-key`,
//! `--resp-tls-client-ca`), with certificates made here (testkit's rcgen
//! files, no key committed): a gateway leases through the relay with a
//! `rediss://` relay URL; a plaintext client is told to use TLS and closed;
//! with a client CA a client without a certificate is refused; a
//! certificate file replaced is served on the next connection.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{call, Relay, Start};
use rl_gateway::{Config, Limiter, LimiterConfig, Policy, Rule, Source};
use testkit::{Server, TlsFiles};

/// A relay in front of `redis` serving its RESP front over TLS with
/// `files`' server certificate, `extra` flags after.
fn tls_relay(redis: &Server, files: &TlsFiles, extra: &[&str]) -> Relay {
    let (cert, key) = (files.server_cert.to_str().unwrap(), files.server_key.to_str().unwrap());
    let mut args = vec!["--resp-tls-cert", cert, "--resp-tls-key", key];
    args.extend_from_slice(extra);
    Relay::start(&redis.url(), &args)
}

/// A TLS connection to the relay trusting `ca`, showing `client`'s
/// certificate and key if given; the error if it cannot answer a PING.
fn tls_con(port: u16, ca: &Path, client: Option<&TlsFiles>) -> redis::RedisResult<redis::Connection> {
    #[allow(deprecated)]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |p: &Path| std::fs::read(p).unwrap();
    let certificates = redis::TlsCertificates {
        client_tls: client
            .map(|f| redis::ClientTlsConfig { client_cert: read(&f.client_cert), client_key: read(&f.client_key) }),
        root_cert: Some(read(ca)),
    };
    let url = format!("rediss://127.0.0.1:{port}/");
    let mut con =
        redis::Client::build_with_tls(url, certificates)?.get_connection_with_timeout(Duration::from_secs(5))?;
    con.set_read_timeout(Some(Duration::from_secs(5)))?;
    redis::cmd("PING").query::<String>(&mut con)?;
    Ok(con)
}

/// What the relay answers `bytes` sent over TLS (trusting `ca`), read
/// until it closes.
fn tls_raw(port: u16, ca: &Path, bytes: &[u8]) -> String {
    use rustls_pki_types::pem::PemObject;
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let session = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut stream = rustls::StreamOwned::new(session, socket);
    stream.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A field of `INFO relay`, read over TLS.
fn info_field(con: &mut redis::Connection, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("relay").query(con).unwrap();
    let prefix = format!("{field}:");
    let line = info.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {field} in {info}"));
    line[prefix.len()..].trim().parse().unwrap()
}

/// Waits (20 s at most) for a field of `INFO relay` to reach `least`: the
/// relay counts a failed handshake after the client has seen it fail.
fn wait_field(con: &mut redis::Connection, field: &str, least: u64, relay: &Relay) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while info_field(con, field) < least {
        assert!(Instant::now() < deadline, "{field} never reached {least}: {}", relay.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (20 s at most) for `text` in the relay's log.
fn wait_log(relay: &Relay, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !relay.log().contains(text) {
        assert!(Instant::now() < deadline, "never logged {text:?}: {}", relay.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn policy() -> Arc<Policy> {
    Arc::new(Policy::builder("api").rule(Rule::per_minute("m", 100)).build().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_leases_through_the_relay_over_tls_and_plaintext_is_refused() {
    let redis = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles::create(dir.path());
    let relay = tls_relay(&redis, &files, &[]);
    let limiter = Limiter::new(LimiterConfig {
        // Exact calls: each check reaches the relay.
        lease_window: Duration::from_millis(1),
        ..LimiterConfig::new(Config {
            relay: Some(format!("rediss://127.0.0.1:{}/", relay.port)),
            tls: rl_gateway::Tls { ca_file: Some(files.ca.clone()), ..Default::default() },
            // A debug build's first handshake on a busy machine: never the fallback.
            timeout: Duration::from_secs(2),
            ..Config::standalone(redis.url())
        })
    })
    .unwrap();
    let policy = policy();
    for _ in 0..5 {
        let d = limiter.check(&policy, "k").await.unwrap();
        assert!(d.allowed && d.source != Source::Fallback, "{d:?}: {}", relay.log());
    }
    let mut con = tls_con(relay.port, &files.ca, None).expect("a TLS client with the CA");
    assert!(info_field(&mut con, "requests") >= 5, "the checks went through the relay: {}", relay.log());
    assert_eq!(info_field(&mut con, "tls_handshake_failures"), 0);
    wait_log(&relay, "over TLS only for redis://");

    // Plaintext: told why, and closed; counted.
    let reply = call(&mut relay.raw(), "PING");
    assert_eq!(
        reply.error(),
        "ERR relay: this port speaks TLS only (--resp-tls-cert): connect with rediss://",
        "{reply:?}"
    );
    assert_eq!(info_field(&mut con, "tls_plaintext_refused"), 1);
    let plain = redis::Client::open(relay.url()).unwrap().get_connection_with_timeout(Duration::from_secs(5));
    assert!(plain.and_then(|mut c| redis::cmd("PING").query::<String>(&mut c)).is_err());
    wait_log(&relay, "refused a plaintext client from 127.0.0.1");

    // A client trusting another CA fails its handshake (counted).
    let other = testkit::tls::unrelated_ca(dir.path(), "other.crt");
    assert!(tls_con(relay.port, &other, None).is_err());
    wait_field(&mut con, "tls_handshake_failures", 1, &relay);
    assert!(!relay.log().contains("PRIVATE KEY"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let redis = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles::create(dir.path());
    let relay = tls_relay(&redis, &files, &["--resp-tls-client-ca", files.ca.to_str().unwrap()]);
    let limiter = Limiter::new(LimiterConfig {
        lease_window: Duration::from_millis(1),
        ..LimiterConfig::new(Config {
            relay: Some(format!("rediss://127.0.0.1:{}/", relay.port)),
            tls: rl_gateway::Tls {
                ca_file: Some(files.ca.clone()),
                cert_file: Some(files.client_cert.clone()),
                key_file: Some(files.client_key.clone()),
                insecure: false,
            },
            timeout: Duration::from_secs(2),
            ..Config::standalone(redis.url())
        })
    })
    .unwrap();
    let policy = policy();
    for _ in 0..3 {
        let d = limiter.check(&policy, "k").await.unwrap();
        assert!(d.allowed && d.source != Source::Fallback, "{d:?}: {}", relay.log());
    }
    let mut con = tls_con(relay.port, &files.ca, Some(&files)).expect("a client with its certificate");
    assert!(info_field(&mut con, "requests") >= 3, "through the relay: {}", relay.log());

    let refused = tls_con(relay.port, &files.ca, None).map(|_| ()).unwrap_err();
    assert!(refused.to_string().contains("CertificateRequired"), "{refused}");
    wait_field(&mut con, "tls_handshake_failures", 1, &relay);
    wait_log(&relay, "clients show a certificate the client CA signed");
    // The gateway's connection is untouched.
    assert!(limiter.check(&policy, "k").await.unwrap().allowed);
}

#[test]
fn a_replaced_certificate_is_served_on_the_next_connection() {
    let redis = Server::start(&[]);
    let (live, first, second) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = TlsFiles::create(first.path());
    let second = TlsFiles::create(second.path());
    let (cert, key) = (live.path().join("server.crt"), live.path().join("server.key"));
    std::fs::copy(&first.server_cert, &cert).unwrap();
    std::fs::copy(&first.server_key, &key).unwrap();
    let relay = Relay::start(
        &redis.url(),
        &["--resp-tls-cert", cert.to_str().unwrap(), "--resp-tls-key", key.to_str().unwrap()],
    );
    let mut before = tls_con(relay.port, &first.ca, None).expect("the first certificate");
    assert!(tls_con(relay.port, &second.ca, None).is_err(), "the second CA signed nothing served yet");

    // New files: the next connection gets them.
    std::fs::copy(&second.server_key, &key).unwrap();
    std::fs::copy(&second.server_cert, &cert).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut after = loop {
        if let Ok(con) = tls_con(relay.port, &second.ca, None) {
            break con;
        }
        assert!(Instant::now() < deadline, "never reloaded: {}", relay.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(tls_con(relay.port, &first.ca, None).is_err(), "the first certificate is gone");
    wait_log(&relay, "RESP front: TLS certificates reloaded");
    // A connection open before keeps what it was accepted with.
    assert_eq!(info_field(&mut before, "tls_reload_errors"), 0);

    // A bad file is refused, counted, and the certificates in force kept.
    std::fs::write(&cert, "not a certificate\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while info_field(&mut after, "tls_reload_errors") == 0 {
        assert!(Instant::now() < deadline, "the bad file never refused: {}", relay.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(tls_con(relay.port, &second.ca, None).is_ok(), "still served: {}", relay.log());
    wait_log(&relay, "RESP front: TLS certificates refused, the ones in force kept: --resp-tls-cert");
}

#[test]
fn bad_files_refuse_the_start() {
    let redis = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles::create(dir.path());
    let missing = dir.path().join("missing.key");
    let mut relay = Relay::spawn(Start {
        no_wait: true,
        ..Start::args(&[
            "--redis",
            &redis.url(),
            "--resp-tls-cert",
            files.server_cert.to_str().unwrap(),
            "--resp-tls-key",
            missing.to_str().unwrap(),
        ])
    });
    assert_eq!(relay.exit_code(), Some(2));
    assert!(relay.log().contains(&format!("--resp-tls-key {}", missing.display())), "{}", relay.log());

    // By environment, alike; a key without its certificate is refused by clap.
    let mut start = Start::args(&["--redis", &redis.url()]);
    start.no_wait = true;
    start.env.push(("RL_RELAY_RESP_TLS_KEY", files.server_key.display().to_string()));
    let mut relay = Relay::spawn(start);
    assert_eq!(relay.exit_code(), Some(2));
    assert!(relay.log().contains("--resp-tls-cert"), "clap names the flag missing: {}", relay.log());
}

/// Past `--max-clients`, a TLS client gets Redis's answer over TLS (a
/// plaintext error on a TLS port would read as garbage), then the close.
#[test]
fn past_max_clients_a_tls_client_is_told_over_tls() {
    let redis = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles::create(dir.path());
    let relay = tls_relay(&redis, &files, &["--max-clients", "1"]);
    // The start's probe (a connect and a close) holds the slot a moment.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut first = loop {
        match tls_con(relay.port, &files.ca, None) {
            Ok(con) => break con,
            Err(e) => assert!(Instant::now() < deadline, "the one client never served: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Raw: redis-rs would swallow the error as the answer to its CLIENT
    // SETINFO at connect, and report the close after it.
    assert_eq!(tls_raw(relay.port, &files.ca, b"PING\r\n"), "-ERR max number of clients reached\r\n");
    assert!(info_field(&mut first, "rejected_clients") >= 1);
}

/// Started as envoyproxy/ratelimit (no argument) there is no RESP front
/// unless `--listen` is given: its TLS asked for by environment is refused,
/// never ignored.
#[test]
fn resp_tls_without_a_resp_front_refuses_the_start() {
    let redis = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles::create(dir.path());
    let mut relay = Relay::spawn(Start {
        env: vec![
            ("REDIS_SOCKET_TYPE", "tcp".into()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("USE_STATSD", "false".into()),
            ("RL_RELAY_RESP_TLS_CERT", files.server_cert.display().to_string()),
            ("RL_RELAY_RESP_TLS_KEY", files.server_key.display().to_string()),
        ],
        bare: true,
        ..Start::default()
    });
    assert_eq!(relay.exit_code(), Some(2), "{}", relay.log());
    assert!(relay.log().contains("--resp-tls-cert: the RESP front does not serve"), "{}", relay.log());
}
