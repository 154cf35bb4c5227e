//! The relay reaches a Redis that speaks only TLS: `rediss://` with a CA
//! file (by flag or by RL_TLS_CA_FILE, as every binary names it), mTLS with
//! a client certificate, and a wrong CA refused, said in the log and by
//! /ready, never decided silently.

mod common;

use std::time::{Duration, Instant};

use common::{call, Relay, Start};
use testkit::{Server, Tls};

/// RL.TAKE through the relay's RESP front (a quiet bucket: forwarded to Redis).
fn take(relay: &Relay, key: &str) -> Vec<i64> {
    call(&mut relay.raw(), &format!("RL.TAKE 1 {key} 5 1 60000")).ints()
}

#[test]
fn the_relay_reaches_a_tls_only_redis_by_flag_and_by_environment() {
    let server = Server::start_tls(Tls::Server, &[]);
    let files = server.tls().expect("a TLS server's files");
    let ca = files.ca.to_str().unwrap();
    let by_flag = Relay::start(&server.url(), &["--tls-ca-file", ca]);
    assert_eq!(take(&by_flag, "{t}:a")[..2], [1, 4], "{}", by_flag.log());
    assert_eq!(take(&by_flag, "{t}:a")[..2], [1, 3]);
    let mut start = Start::args(&["--redis", &server.url(), "--timeout-ms", "1000"]);
    start.env.push(("RL_TLS_CA_FILE", ca.to_owned()));
    let by_env = Relay::spawn(start);
    assert_eq!(take(&by_env, "{t}:a")[..2], [1, 2], "the same bucket, counted by Redis: {}", by_env.log());
}

#[test]
fn mutual_tls_and_a_wrong_ca() {
    let server = Server::start_tls(Tls::Mutual, &[]);
    let files = server.tls().expect("a TLS server's files");
    let ca = files.ca.to_str().unwrap();
    let relay = Relay::start(
        &server.url(),
        &[
            "--tls-ca-file",
            ca,
            "--tls-cert-file",
            files.client_cert.to_str().unwrap(),
            "--tls-key-file",
            files.client_key.to_str().unwrap(),
        ],
    );
    assert_eq!(take(&relay, "{m}:a")[..2], [1, 4], "{}", relay.log());

    // A CA that signed nothing of the server's: no call reaches Redis, the
    // client gets an error (never a decision), and the log names the CA.
    let dir = tempfile::tempdir().unwrap();
    let other = testkit::tls::unrelated_ca(dir.path(), "other");
    let wrong = Relay::start(&server.url(), &["--tls-ca-file", other.to_str().unwrap()]);
    let reply = call(&mut wrong.raw(), "RL.TAKE 1 {m}:b 5 1 60000");
    assert!(!reply.error().is_empty(), "a refused handshake answers an error: {reply:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !wrong.log().contains("not trusted by the CA file") {
        assert!(Instant::now() < deadline, "the log does not say why: {}", wrong.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(wrong.log().contains(other.to_str().unwrap()), "the CA file is named: {}", wrong.log());
}
