//! The RLS front's bounds on what a caller may send (relay/README.md,
//! "What a caller may send") and its local fallback's share while Redis is
//! down ("Redis down"), against the relay as a child process and real
//! servers with the module, through envoy-types' generated client and, where
//! a client would not break a rule on its own, raw HTTP/2 frames over TCP.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::rls::*;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use testkit::Server;

const CONFIG: &str = "\
domain: api
descriptors:
  - key: wide
    rate_limit: { unit: hour, requests_per_unit: 100000 }
";

/// Waits (without blocking the runtime) until `done`, 10 s at most.
async fn wait_until(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn url(relay: &RlsRelay) -> String {
    format!("http://127.0.0.1:{}", relay.rls_port)
}

// ---- raw HTTP/2 ----

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 0x4;

enum Read2 {
    /// (type, flags, stream, payload)
    Frame(u8, u8, u32, Vec<u8>),
    TimedOut,
    Closed,
}

fn read_exact_or(s: &mut TcpStream, buf: &mut [u8]) -> Result<(), Read2> {
    let mut at = 0;
    while at < buf.len() {
        match s.read(&mut buf[at..]) {
            Ok(0) => return Err(Read2::Closed),
            Ok(n) => at += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(Read2::TimedOut)
            }
            Err(_) => return Err(Read2::Closed),
        }
    }
    Ok(())
}

/// One frame, or what happened instead within the read timeout.
fn read_frame(s: &mut TcpStream) -> Read2 {
    let mut head = [0u8; 9];
    if let Err(e) = read_exact_or(s, &mut head) {
        return e;
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    if let Err(e) = read_exact_or(s, &mut payload) {
        return e;
    }
    Read2::Frame(head[3], head[4], stream, payload)
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A TCP connection to the RLS front that has sent the client preface and
/// an empty SETTINGS frame; reads time out after `timeout`.
fn h2_open(port: u16, timeout: Duration) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(PREFACE).unwrap();
    s.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
    s
}

/// Whether the server's preface (a SETTINGS frame) arrives on `s`: the
/// connection is being served.
fn served(s: &mut TcpStream) -> Result<(), &'static str> {
    match read_frame(s) {
        Read2::Frame(SETTINGS, 0, 0, _) => Ok(()),
        Read2::Frame(..) => Err("a frame other than the server's SETTINGS"),
        Read2::TimedOut => Err("nothing (timed out)"),
        Read2::Closed => Err("closed"),
    }
}

// ---- 1. --max-clients ----

/// Past `--max-clients` RLS connections the next one is not refused: the
/// relay stops accepting, so it waits in the listen backlog (the TCP
/// connect succeeds, nothing is answered), and is served as soon as one of
/// the others closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_clients_a_connection_waits_until_one_closes() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--max-clients", "3"]);
    let port = relay.rls_port;
    // Three connections, each answered with the server's preface.
    let mut held: Vec<TcpStream> = (0..3).map(|_| h2_open(port, Duration::from_secs(10))).collect();
    for (i, s) in held.iter_mut().enumerate() {
        served(s).unwrap_or_else(|e| panic!("connection {i} of 3 should be served: {e}"));
    }
    // A real gRPC client as the fourth: its call is not answered...
    let target = url(&relay);
    let call = tokio::spawn(async move {
        let mut client = RateLimitServiceClient::connect(target).await.unwrap();
        let code = ask(&mut client, request("api", &[&[("wide", "c")]])).await.overall_code;
        (client, code)
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!call.is_finished(), "a fourth connection was served at --max-clients 3");
    // ...the RESP front has its own --max-clients: still served meanwhile.
    let pong: String = redis::cmd("PING").query(&mut relay.relay.con()).unwrap();
    assert_eq!(pong, "PONG");
    // One of the three closes: the waiting call is served.
    drop(held.remove(0));
    let answered = tokio::time::timeout(Duration::from_secs(10), call).await;
    let (client, code) = answered.expect("served once a connection closed").unwrap();
    assert_eq!(code, OK);
    // Two raw connections and the client's hold the three slots: a raw
    // fifth gets nothing, not even a refusal, until one of them closes.
    let mut waiting = h2_open(port, Duration::from_secs(1));
    match read_frame(&mut waiting) {
        Read2::TimedOut => {}
        Read2::Closed => panic!("refused (closed) rather than held in the backlog"),
        Read2::Frame(..) => panic!("a fourth connection was served at --max-clients 3"),
    }
    drop(held.remove(0));
    waiting.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    served(&mut waiting).unwrap_or_else(|e| panic!("served once a connection closed, got {e}"));
    drop(client);
    // The RLS front counts none of this: no connection was refused.
    assert_eq!(relay.metric("rl_relay_rejected_clients_total"), 0.0);
}
