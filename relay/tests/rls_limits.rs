//! The RLS front's bounds on what a caller may send (docs/envoy.md,
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
    rate_limit: { unit: hour, requests_per_unit: 1000 }
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
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Err(Read2::TimedOut),
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
    // The front shows it is full.
    assert_eq!(relay.metric("rl_relay_rls_connections"), 3.0);
    assert_eq!(relay.metric("rl_relay_rls_max_connections"), 3.0);
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
        Read2::Frame(..) => panic!("a connection past the three held was served at --max-clients 3"),
    }
    drop(held.remove(0));
    waiting.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    served(&mut waiting).unwrap_or_else(|e| panic!("served once a connection closed, got {e}"));
    drop(client);
    // Nothing was refused, so nothing is counted (rejected_clients is the
    // RESP front's); the connections gauge follows the closes.
    assert_eq!(relay.metric("rl_relay_rejected_clients_total"), 0.0);
    drop((held, waiting));
    wait_until(|| relay.metric("rl_relay_rls_connections") == 0.0, "the closed connections leave the gauge").await;
}

/// A connection that never sends HTTP/2's preface (or only part of it)
/// would hold its slot for good: it is closed after 10 s, counted, and the
/// connection waiting for its slot is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_no_preface_is_closed_and_its_slot_freed() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--max-clients", "2"]);
    let port = relay.rls_port;
    let started = Instant::now();
    let mut silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut partial = TcpStream::connect(("127.0.0.1", port)).unwrap();
    partial.write_all(&PREFACE[..10]).unwrap();
    let target = url(&relay);
    let call = tokio::spawn(async move {
        let mut client = RateLimitServiceClient::connect(target).await.unwrap();
        ask(&mut client, request("api", &[&[("wide", "p")]])).await.overall_code
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!call.is_finished(), "served while two idle connections held both slots");
    let code = tokio::time::timeout(Duration::from_secs(20), call).await.expect("served once an idle one closed");
    assert_eq!(code.unwrap(), OK);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(9), "closed after {waited:?}, before its 10 s");
    for (what, s) in [("silent", &mut silent), ("partial", &mut partial)] {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut byte = [0u8; 1];
        // Closed: an end of stream, or a reset (the relay closed it with
        // the partial preface unread).
        let read = s.read(&mut byte).map_err(|e| e.kind());
        assert!(matches!(read, Ok(0) | Err(ErrorKind::ConnectionReset)), "the {what} connection is closed: {read:?}");
    }
    assert_eq!(relay.metric("rl_relay_rls_handshake_timeouts_total"), 2.0);
}

// ---- 3. 16 KiB of headers ----

/// A call whose headers (HPACK's count: name + value + 32 a field,
/// pseudo-headers included) reach 16 KiB is refused by the HTTP/2 layer
/// with HTTP status 431 and no grpc-status (UNKNOWN to a gRPC client);
/// the same connection and others keep being served, and 512 bytes under is
/// served (the client's own headers, pseudo-headers and all, come to under
/// 512 of HPACK's bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_of_16_kib_are_refused_and_just_under_served() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    let with_pad = |field_bytes: usize| {
        // One field of `field_bytes` as HPACK counts it.
        let value = "p".repeat(field_bytes - "x-pad".len() - 32);
        let mut r = tonic::Request::new(request("api", &[&[("wide", "h")]]));
        r.metadata_mut().insert("x-pad", value.parse().unwrap());
        r
    };
    let e = client.should_rate_limit(with_pad(16 << 10)).await.unwrap_err();
    // HTTP 431 (h2's answer), which gRPC clients map to UNKNOWN.
    assert_eq!(e.code(), tonic::Code::Unknown, "{e:?}");
    assert!(e.message().contains("431"), "{e:?}");
    // The same connection still serves, a call just under too.
    assert_eq!(ask(&mut client, request("api", &[&[("wide", "h")]])).await.overall_code, OK);
    let r = client.should_rate_limit(with_pad((16 << 10) - 512)).await.unwrap().into_inner();
    assert_eq!(r.overall_code, OK);
    let mut other = relay.client().await;
    assert_eq!(ask(&mut other, request("api", &[&[("wide", "h")]])).await.overall_code, OK);
    // Refused before the service: not a request of its statistics.
    assert_eq!(relay.metric("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}"), 3.0);
}

// ---- 4. compression ----

/// A message compressed with gzip (or any encoding) is answered
/// UNIMPLEMENTED, naming the encoding and saying `grpc-accept-encoding:
/// identity`, and the connection keeps serving. The request says its
/// encoding in `grpc-encoding`, which tonic's server reads before the
/// message (so the message's bytes do not matter; tonic's client would
/// need its `gzip` feature, which brings flate2 and crc32fast, to compress
/// one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_messages_are_unimplemented() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    let encoded = |encoding: &'static str| {
        let mut r = tonic::Request::new(request("api", &[&[("wide", "z")]]));
        r.metadata_mut().insert("grpc-encoding", encoding.parse().unwrap());
        r
    };
    for encoding in ["gzip", "deflate", "zstd"] {
        let e = client.should_rate_limit(encoded(encoding)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unimplemented, "{encoding}: {e:?}");
        assert!(e.message().contains(encoding), "{e:?}");
        let accepted = e.metadata().get("grpc-accept-encoding").and_then(|v| v.to_str().ok());
        assert_eq!(accepted, Some("identity"), "{e:?}");
    }
    // Uncompressed, said or not: served.
    let r = client.should_rate_limit(encoded("identity")).await.unwrap().into_inner();
    assert_eq!(r.overall_code, OK);
    assert_eq!(ask(&mut client, request("api", &[&[("wide", "z")]])).await.statuses[0].limit_remaining, 998);
}

// ---- 5. --max-request-bytes ----

fn varint_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

/// A length-delimited field (number below 16) of `n` bytes, 0 if empty
/// (proto3 leaves empty strings out).
fn field(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        1 + varint_len(n) + n
    }
}

/// Protobuf's length of a request of plain descriptors (no hits, no
/// override): what the gRPC layer compares with --max-request-bytes.
fn encoded_len(r: &RateLimitRequest) -> usize {
    let descriptors: usize = r
        .descriptors
        .iter()
        .map(|d| {
            assert!(d.limit.is_none() && d.hits_addend.is_none() && !d.is_negative_hits);
            let entries: usize = d.entries.iter().map(|e| field(field(e.key.len()) + field(e.value.len()))).sum();
            1 + varint_len(entries) + entries
        })
        .sum();
    assert_eq!(r.hits_addend, 0);
    field(r.domain.len()) + descriptors
}

/// A request of four `wide` descriptors of `bytes` encoded (each within the
/// service's 1 KiB of keys and values).
fn request_of(bytes: usize) -> RateLimitRequest {
    let values: Vec<String> = (0..4).map(|i| format!("{i}{}", "v".repeat(899))).collect();
    let descriptors: Vec<[(&str, &str); 1]> = values.iter().map(|v| [("wide", v.as_str())]).collect();
    let mut r = request("api", &descriptors.iter().map(|d| &d[..]).collect::<Vec<_>>());
    let mut next = 0;
    while encoded_len(&r) < bytes {
        r.descriptors[next % 4].entries[0].value.push('v');
        next += 1;
    }
    assert_eq!(encoded_len(&r), bytes, "no value lengths give exactly {bytes} bytes");
    r
}

/// A message of exactly --max-request-bytes is served; one byte more is
/// OUT_OF_RANGE from the gRPC layer, which the service never sees (no
/// statistics); the connection keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_past_max_request_bytes_is_out_of_range() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--max-request-bytes", "4096"]);
    let mut client = relay.client().await;
    let r = ask(&mut client, request_of(4096)).await;
    assert_eq!((r.overall_code, r.statuses.len()), (OK, 4));
    let e = client.should_rate_limit(request_of(4097)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    assert!(e.message().contains("4097") && e.message().contains("4096"), "{e:?}");
    assert_eq!(ask(&mut client, request_of(4000)).await.overall_code, OK);
    assert_eq!(relay.metric("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}"), 2.0);
    assert_eq!(relay.metric("ratelimit_service_should_rate_limit_error{err_type=\"service_error\"}"), 0.0);
    let hits = relay.metric("ratelimit_service_rate_limit_total_hits{domain=\"api\",key1=\"wide\"}");
    assert_eq!(hits, 8.0, "the refused message's descriptors are not counted");
}

// ---- 2. 256 calls at once on a connection ----

/// At most 256 calls run at once on one connection (the server's
/// SETTINGS_MAX_CONCURRENT_STREAMS): of 300 calls sent at once on one
/// connection while Redis holds every write (CLIENT PAUSE WRITE), 256 reach
/// the service and ask Redis, the others wait in the client (as Envoy's
/// does) until some finish; a call needing no Redis waits behind them on
/// that connection, and is answered at once on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_256_calls_at_once_on_a_connection() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    // Nothing times out while Redis is paused.
    let extra = ["--timeout-ms", "30000", "--rls-timeout-ms", "60000"];
    let relay = RlsRelay::start(&[server.url()], false, &config, &extra);
    let client = relay.client().await;
    // The connection's settings are known once a call is answered.
    assert_eq!(ask(&mut client.clone(), request("api", &[&[("wide", "warm")]])).await.overall_code, OK);
    let calls = || relay.metric("rl_relay_rls_redis_calls_total");
    let before = calls();
    let mut admin = server.con();
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(20_000).arg("WRITE").query(&mut admin).unwrap();
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let value = format!("s{i}");
                ask(&mut client, request("api", &[&[("wide", value.as_str())]])).await.overall_code
            })
        })
        .collect();
    wait_until(|| calls() >= before + 256.0, "256 calls asking Redis").await;
    // An unknown domain needs no Redis: on this connection it waits for a
    // stream too.
    let unknown = || request("elsewhere", &[&[("k", "v")]]);
    let behind = {
        let mut client = client.clone();
        tokio::spawn(async move { ask(&mut client, unknown()).await.overall_code })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(calls(), before + 256.0, "more than 256 calls at once on one connection");
    assert_eq!(relay.metric("rl_relay_rls_domain_not_found_total"), 0.0, "the 301st call ran");
    assert!(!behind.is_finished());
    assert_eq!(tasks.iter().filter(|t| t.is_finished()).count(), 0, "answered while Redis is paused");
    // Meanwhile the front and Redis's readiness probe are fine: another
    // connection is answered at once.
    let mut other = relay.client().await;
    assert_eq!(ask(&mut other, unknown()).await.overall_code, OK);
    assert_eq!(relay.metric("rl_relay_rls_domain_not_found_total"), 1.0);
    assert_eq!(relay.metric("rl_relay_rls_fallback_total"), 0.0, "every call asked Redis");
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut admin).unwrap();
    for t in tasks {
        assert_eq!(tokio::time::timeout(Duration::from_secs(20), t).await.unwrap().unwrap(), OK);
    }
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), behind).await.unwrap().unwrap(), OK);
    assert_eq!(relay.metric("rl_relay_rls_domain_not_found_total"), 2.0);
}

const HEADERS: u8 = 0x1;
const DATA: u8 = 0x0;
const RST_STREAM: u8 = 0x3;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const REFUSED_STREAM: u32 = 0x7;

/// A ShouldRateLimit call's header block: every field a literal without
/// indexing (HPACK's simplest form, no Huffman).
fn call_headers(port: u16) -> Vec<u8> {
    let authority = format!("127.0.0.1:{port}");
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
        (":authority", authority.as_str()),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// The gRPC message of a request to an unknown domain (answered OK without
/// Redis): `domain: "elsewhere", descriptors: [{entries: [{k: v}]}]`.
fn unknown_domain_message() -> Vec<u8> {
    let entry = [0x0a, 1, b'k', 0x12, 1, b'v'];
    let mut descriptor = vec![0x0a, entry.len() as u8];
    descriptor.extend_from_slice(&entry);
    let mut message = vec![0x0a, 9];
    message.extend_from_slice(b"elsewhere");
    message.extend_from_slice(&[0x12, descriptor.len() as u8]);
    message.extend_from_slice(&descriptor);
    let mut out = vec![0, 0, 0, 0, message.len() as u8];
    out.extend_from_slice(&message);
    out
}

/// Frames until one on `stream` of `kind` (SETTINGS and the like skipped);
/// panics on a RST_STREAM of another stream or after 10 s.
fn wait_frame(s: &mut TcpStream, kind: u8, stream: u32) -> (u8, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no frame {kind} on stream {stream}");
        match read_frame(s) {
            Read2::Frame(k, flags, id, payload) if k == kind && id == stream => return (flags, payload),
            Read2::Frame(RST_STREAM, _, id, payload) => panic!("stream {id} reset: {payload:?}"),
            Read2::Frame(..) | Read2::TimedOut => {}
            Read2::Closed => panic!("closed waiting for frame {kind} on stream {stream}"),
        }
    }
}

/// A client that does not wait (opens a 257th stream past the server's
/// SETTINGS_MAX_CONCURRENT_STREAMS of 256) has it refused, REFUSED_STREAM,
/// safe to retry, the others untouched; once one ends, another is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_257th_stream_at_once_is_refused() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let port = relay.rls_port;
    tokio::task::spawn_blocking(move || {
        let mut s = h2_open(port, Duration::from_secs(10));
        let Read2::Frame(SETTINGS, 0, 0, settings) = read_frame(&mut s) else { panic!("no server preface") };
        let max_streams =
            settings.chunks(6).find(|e| e[..2] == [0, 3]).map(|e| u32::from_be_bytes([e[2], e[3], e[4], e[5]]));
        assert_eq!(max_streams, Some(256), "SETTINGS_MAX_CONCURRENT_STREAMS");
        s.write_all(&frame(SETTINGS, 0x1, 0, &[])).unwrap();
        // 257 calls opened, none sending its message yet.
        let headers = call_headers(port);
        let mut out = Vec::new();
        for n in 0..257u32 {
            out.extend(frame(HEADERS, END_HEADERS, 2 * n + 1, &headers));
        }
        s.write_all(&out).unwrap();
        let (_, code) = wait_frame(&mut s, RST_STREAM, 513);
        assert_eq!(u32::from_be_bytes(code[..4].try_into().unwrap()), REFUSED_STREAM);
        // Stream 1 sends its message and is answered OK (overall_code 1)...
        let message = unknown_domain_message();
        s.write_all(&frame(DATA, END_STREAM, 1, &message)).unwrap();
        let (_, data) = wait_frame(&mut s, DATA, 1);
        assert_eq!(data[5..7], [0x08, 0x01], "OK: {data:?}");
        loop {
            let (flags, _) = wait_frame(&mut s, HEADERS, 1);
            if flags & END_STREAM != 0 {
                break;
            }
        }
        // ...which frees a stream: a new call is served.
        let mut out = frame(HEADERS, END_HEADERS, 515, &headers);
        out.extend(frame(DATA, END_STREAM, 515, &message));
        s.write_all(&out).unwrap();
        let (_, data) = wait_frame(&mut s, DATA, 515);
        assert_eq!(data[5..7], [0x08, 0x01], "OK: {data:?}");
    })
    .await
    .unwrap();
    assert_eq!(relay.metric("rl_relay_rls_domain_not_found_total"), 2.0);
}

// ---- 6. the local fallback's share while Redis is down ----

const DOWN: &str = "\
domain: down
descriptors:
  - key: window
    rate_limit: { unit: hour, requests_per_unit: 40 }
  - key: tiny_window
    rate_limit: { unit: hour, requests_per_unit: 6 }
  - key: bucket
    rate_limit: { unit: hour, requests_per_unit: 40, algorithm: token_bucket, burst: 8 }
  - key: tiny_bucket
    rate_limit: { unit: hour, requests_per_unit: 40, algorithm: token_bucket, burst: 2 }
";

/// With Redis stopped (and the relay knowing it), each limit of the
/// default failure mode is decided by the relay's local stand-in at its
/// share of `--relays` (relay/src/rls/fallback.rs): a window holds half of
/// the relay's share of its limit, `floor(limit / 2 / relays)`, and refuses
/// all when that is below one; a token bucket holds the relay's share of
/// its burst, `floor(burst / relays)`, one at least (so `max(burst,
/// relays)` fleet-wide). Limits are per hour: nothing refills meanwhile.
/// (`failure_mode: deny` answering OVER_LIMIT with Redis down is in
/// tests/rls.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_the_fallback_admits_this_relays_share() {
    let mut server = Server::start(&[]);
    let (_dir, config) = config_file(DOWN);
    let extra = |relays: &'static str| ["--timeout-ms", "100", "--rls-timeout-ms", "300", "--relays", relays];
    let one = RlsRelay::start(&[server.url()], false, &config, &extra("1"));
    let four = RlsRelay::start(&[server.url()], false, &config, &extra("4"));
    for relay in [&one, &four] {
        wait_until(|| relay.get("/healthcheck").0 == 200, "ready").await;
    }
    server.kill();
    // Once the probe has failed, decisions do not wait for Redis (one that
    // timed out would be charged to the stand-in once more when its call
    // fails in the background).
    for relay in [&one, &four] {
        wait_until(|| relay.get("/healthcheck").0 == 500, "not ready without Redis").await;
    }
    let asks = 30;
    // (key, admitted with --relays 1, with --relays 4)
    let expected = [("window", 20, 5), ("tiny_window", 3, 0), ("bucket", 8, 2), ("tiny_bucket", 2, 1)];
    for (relay, relays) in [(&one, 1), (&four, 4)] {
        let mut client = relay.client().await;
        for (key, with_one, with_four) in expected {
            let admitted = if relays == 1 { with_one } else { with_four };
            let mut codes = Vec::new();
            for _ in 0..asks {
                codes.push(ask(&mut client, request("down", &[&[(key, "k")]])).await.overall_code);
            }
            let mut want = vec![OK; admitted];
            want.resize(asks, OVER_LIMIT);
            assert_eq!(codes, want, "{key} with --relays {relays}: {admitted} admitted, then refused");
        }
        let fallback = relay.metric("rl_relay_rls_fallback_total");
        assert_eq!(fallback, (asks * expected.len()) as f64, "every decision by the stand-in, once");
        assert_eq!(relay.metric("rl_relay_rls_redis_calls_total"), 0.0, "nothing sent to a Redis known down");
    }
}

/// Each front takes up to `--max-clients` connections, so with the RLS
/// front the open-file limit must hold twice as many: the relay lowers
/// `--max-clients` to half of what the limit leaves (it fitted one front's
/// worth before, and both fronts full ran out of descriptors).
#[test]
fn max_clients_fits_the_open_file_limit_for_both_fronts() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    let rls_port = testkit::free_port();
    let args = [
        "--redis".to_string(),
        server.url(),
        "--rls-listen".into(),
        format!("127.0.0.1:{rls_port}"),
        "--rls-config".into(),
        config.display().to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut start = common::Start::args(&args);
    start.max_files = Some(256);
    let relay = common::Relay::spawn(start);
    // 256 files less the 48 the relay keeps, halved.
    assert_eq!(relay.info_field("max_clients"), 104, "{}", relay.log());
    assert!(relay.log().contains("lowered to 104 on each of the RESP and RLS fronts"), "{}", relay.log());
    // Without the RLS front, one front's worth.
    let mut start = common::Start::args(&["--redis", &server.url()]);
    start.max_files = Some(256);
    assert_eq!(common::Relay::spawn(start).info_field("max_clients"), 208);
}
