//! The RLS front's slots belong to callers who complete calls (with the
//! token, when one is set): over raw HTTP/2, connections that hold a slot
//! without the token, with a preface alone, with a call's headers and no
//! body, or reading nothing are closed at `--auth-timeout-ms` and counted,
//! and a caller with the token is then served; a call's body is due within
//! the same deadline; token-less health checks are still answered, a few of
//! their connections kept.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::rls::*;
use prost::Message;
use testkit::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb as health_pb;
use tonic_health::pb::HealthCheckRequest;

const CONFIG: &str = "\
domain: api
descriptors:
  - key: wide
    rate_limit: { unit: hour, requests_per_unit: 100000 }
";

const DECIDE: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const CHECK: &str = "/grpc.health.v1.Health/Check";
const TOKEN: &str = "s3cret";
/// serve.rs's HEALTH_CONNECTIONS: token-less health-only connections kept.
const HEALTH_CONNECTIONS: usize = 8;
/// `--auth-timeout-ms` of these tests: short, and long enough for a call
/// on loopback to land on a busy machine.
const DEADLINE_MS: u64 = 1500;

/// One gRPC message frame of `payload`.
fn frame(payload: &[u8]) -> Bytes {
    let mut out = vec![0];
    out.extend((payload.len() as u32).to_be_bytes());
    out.extend(payload);
    out.into()
}

fn decide_body() -> Bytes {
    frame(&request("api", &[&[("wide", "x")]]).encode_to_vec())
}

fn check_body() -> Bytes {
    frame(&HealthCheckRequest { service: String::new() }.encode_to_vec())
}

/// A raw HTTP/2 connection to the front; its driver answers PINGs and ends
/// when the relay closes the connection.
struct Conn {
    send: h2::client::SendRequest<Bytes>,
    driver: tokio::task::JoinHandle<()>,
    port: u16,
    /// Calls whose body is never sent, kept open.
    held: Vec<h2::SendStream<Bytes>>,
}

impl Conn {
    async fn open(port: u16) -> Conn {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (send, connection) = h2::client::handshake(tcp).await.unwrap();
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Conn { send, driver, port, held: Vec::new() }
    }

    fn head(&self, path: &str, token: Option<&str>) -> http::Request<()> {
        let mut request = http::Request::post(format!("http://127.0.0.1:{}{path}", self.port))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request.body(()).unwrap()
    }

    /// A call's headers, and its body when given: the answer's future.
    async fn start(&mut self, path: &str, token: Option<&str>, body: Option<Bytes>) -> h2::client::ResponseFuture {
        let head = self.head(path, token);
        let send = self.send.clone().ready().await.unwrap();
        self.send = send;
        let (response, mut stream) = self.send.send_request(head, false).unwrap();
        if let Some(body) = body {
            stream.send_data(body, true).unwrap();
        } else {
            self.held.push(stream);
        }
        response
    }

    /// A whole call: its gRPC status.
    async fn call(&mut self, path: &str, token: Option<&str>, body: Bytes) -> Option<String> {
        let response = self.start(path, token, Some(body)).await;
        grpc_status(response).await
    }

    /// Whether the relay closed it, waiting up to `within`.
    async fn closed_within(&mut self, within: Duration) -> bool {
        tokio::time::timeout(within, &mut self.driver).await.is_ok()
    }
}

/// The gRPC status of an answer (its headers or its trailers), within 10 s.
async fn grpc_status(response: h2::client::ResponseFuture) -> Option<String> {
    let response =
        tokio::time::timeout(Duration::from_secs(10), response).await.expect("an answer within 10 s").ok()?;
    let headers = response.headers().clone();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else { break };
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.ok().flatten().unwrap_or_default();
    headers.get("grpc-status").or_else(|| trailers.get("grpc-status")).map(|v| v.to_str().unwrap().to_owned())
}

struct Front {
    _server: Server,
    _dirs: Vec<tempfile::TempDir>,
    relay: RlsRelay,
}

/// A relay whose RLS front has `--auth-timeout-ms` [`DEADLINE_MS`] (and the
/// token when `token`), at most 20 clients.
fn front(token: bool) -> Front {
    let server = Server::start(&[]);
    let (config_dir, config) = config_file(CONFIG);
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let token_file = token_file.display().to_string();
    let deadline = DEADLINE_MS.to_string();
    let mut extra = vec!["--max-clients", "20", "--auth-timeout-ms", deadline.as_str()];
    if token {
        extra.extend(["--rls-token-file", token_file.as_str()]);
    }
    let relay = RlsRelay::start(&[server.url()], false, &config, &extra);
    let deadline = Instant::now() + Duration::from_secs(10);
    while relay.get("/healthcheck").0 != 200 {
        assert!(Instant::now() < deadline, "never ready: {}", relay.relay.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    Front { _server: server, _dirs: vec![config_dir, token_dir], relay }
}

/// Waits (10 s at most) until `metric` reads `want`, and says what it read.
async fn wait_metric(relay: &RlsRelay, metric: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = relay.metric(metric);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{metric} is {got}, want {want}: {}", relay.relay.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenless_connections_lose_their_slots_to_a_caller_with_the_token() {
    let front = front(true);
    let port = front.relay.rls_port;
    // Twenty connections, each one call without the token, then silent
    // (their drivers answer PINGs): every slot of --max-clients 20.
    let mut holders = Vec::new();
    for _ in 0..20 {
        let mut conn = Conn::open(port).await;
        assert_eq!(conn.call(DECIDE, None, decide_body()).await.as_deref(), Some("16"), "UNAUTHENTICATED");
        holders.push(conn);
    }
    // A caller with the token is served once their deadline (1.5 s) has
    // closed them: within a few seconds, not never.
    let caller = async {
        let mut client = front.relay.client().await;
        let mut r = tonic::Request::new(request("api", &[&[("wide", "t")]]));
        r.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        client.should_rate_limit(r).await.unwrap().into_inner().overall_code
    };
    let code = tokio::time::timeout(Duration::from_secs(10), caller).await;
    assert_eq!(code.ok(), Some(OK), "the caller with the token was not served: {}", front.relay.relay.log());
    for (i, conn) in holders.iter_mut().enumerate() {
        assert!(conn.closed_within(Duration::from_secs(10)).await, "holder {i} still open");
    }
    wait_metric(&front.relay, "rl_relay_rls_auth_timeouts_total", 20.0).await;
    assert!(front.relay.relay.log().contains("--auth-timeout-ms"), "{}", front.relay.relay.log());
    assert!(!front.relay.relay.log().contains(TOKEN), "no secret in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_with_the_token_keeps_its_slot_past_the_deadline() {
    let front = front(true);
    let mut conn = Conn::open(front.relay.rls_port).await;
    assert_eq!(conn.call(DECIDE, Some(TOKEN), decide_body()).await.as_deref(), Some("0"));
    // Well past the deadline: still open, still served.
    let past = Duration::from_millis(DEADLINE_MS * 2);
    assert!(!conn.closed_within(past).await, "closed with the token");
    assert_eq!(conn.call(DECIDE, Some(TOKEN), decide_body()).await.as_deref(), Some("0"));
    assert_eq!(
        conn.call(DECIDE, None, decide_body()).await.as_deref(),
        Some("16"),
        "each call still carries the token"
    );
    assert_eq!(front.relay.metric("rl_relay_rls_auth_timeouts_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preface_alone_is_closed_at_the_deadline_token_or_not() {
    for token in [false, true] {
        let front = front(token);
        let started = Instant::now();
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", front.relay.rls_port)).await.unwrap();
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
        // The relay's SETTINGS, then nothing until it closes (never
        // answered: a PING would go unanswered only after 40 s).
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            let mut buf = [0u8; 1024];
            while let Ok(n) = tcp.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "token {token}: a preface alone still open after 10 s");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(DEADLINE_MS),
            "token {token}: closed after {took:?}, before its deadline"
        );
        wait_metric(&front.relay, "rl_relay_rls_auth_timeouts_total", 1.0).await;
        // Another connection that completes a call in time stays.
        let mut conn = Conn::open(front.relay.rls_port).await;
        let token_sent = token.then_some(TOKEN);
        assert_eq!(conn.call(DECIDE, token_sent, decide_body()).await.as_deref(), Some("0"));
        let past = Duration::from_millis(DEADLINE_MS * 2);
        assert!(!conn.closed_within(past).await, "token {token}: a caller's connection closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_without_their_body_are_ended_at_the_deadline() {
    let front = front(true);
    let port = front.relay.rls_port;
    // On a connection that has the token: 200 calls' headers, no DATA.
    // Each is answered DEADLINE_EXCEEDED; the connection serves on.
    let mut conn = Conn::open(port).await;
    assert_eq!(conn.call(DECIDE, Some(TOKEN), decide_body()).await.as_deref(), Some("0"));
    let mut pending = Vec::new();
    for _ in 0..200 {
        pending.push(conn.start(DECIDE, Some(TOKEN), None).await);
    }
    for (i, response) in pending.into_iter().enumerate() {
        assert_eq!(grpc_status(response).await.as_deref(), Some("4"), "call {i}: DEADLINE_EXCEEDED");
    }
    assert_eq!(conn.call(DECIDE, Some(TOKEN), decide_body()).await.as_deref(), Some("0"));
    wait_metric(&front.relay, "rl_relay_rls_body_timeouts_total", 200.0).await;
    // A connection whose only call has headers and no body (the token in
    // them) completed no call: closed at the deadline.
    let mut headers_only = Conn::open(port).await;
    let _unanswered = headers_only.start(DECIDE, Some(TOKEN), None).await;
    assert!(headers_only.closed_within(Duration::from_secs(10)).await, "a call without its body held a slot");
    wait_metric(&front.relay, "rl_relay_rls_auth_timeouts_total", 1.0).await;
    assert!(!conn.closed_within(Duration::from_millis(100)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_without_the_token_are_answered_a_few_connections_kept() {
    let front = front(true);
    let port = front.relay.rls_port;
    // Ten token-less connections that only check health: answered; past
    // the deadline, HEALTH_CONNECTIONS of them are kept (apart from
    // --max-clients), the other two closed and counted.
    let mut conns = Vec::new();
    for _ in 0..10 {
        let mut conn = Conn::open(port).await;
        assert_eq!(conn.call(CHECK, None, check_body()).await.as_deref(), Some("0"));
        conns.push(conn);
    }
    wait_metric(&front.relay, "rl_relay_rls_auth_timeouts_total", 2.0).await;
    wait_metric(&front.relay, "rl_relay_rls_health_connections", HEALTH_CONNECTIONS as f64).await;
    wait_metric(&front.relay, "rl_relay_rls_connections", 0.0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (closed, mut kept): (Vec<Conn>, Vec<Conn>) = conns.into_iter().partition(|c| c.driver.is_finished());
    assert_eq!((closed.len(), kept.len()), (2, HEALTH_CONNECTIONS), "{}", front.relay.relay.log());
    for conn in kept.iter_mut() {
        // Kept for health checks: served those, and nothing else.
        assert_eq!(conn.call(CHECK, None, check_body()).await.as_deref(), Some("0"));
        assert_eq!(conn.call(DECIDE, Some(TOKEN), decide_body()).await.as_deref(), Some("16"));
    }
    // tonic's health client, no token, the budget full: answered.
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}")).unwrap();
    let mut client = health_pb::health_client::HealthClient::new(channel.connect().await.unwrap());
    let serving = health_pb::health_check_response::ServingStatus::Serving as i32;
    let answer = client.check(HealthCheckRequest { service: String::new() }).await.unwrap();
    assert_eq!(answer.into_inner().status, serving);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_reads_nothing_is_closed_at_the_deadline_too() {
    let front = front(true);
    // A small receive buffer, PINGs until the relay's answers back up and
    // it stops reading; nothing read from then on.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut tcp = socket.connect(([127, 0, 0, 1], front.relay.rls_port).into()).await.unwrap();
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").await.unwrap();
    let ping = [0u8, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    let batch: Vec<u8> = ping.iter().copied().cycle().take(ping.len() * 1000).collect();
    // Blocked (typically), or closed already if the deadline came first
    // (a busy machine): counted either way.
    let mut ended = false;
    for _ in 0..4000 {
        if !matches!(tokio::time::timeout(Duration::from_millis(500), tcp.write_all(&batch)).await, Ok(Ok(()))) {
            ended = true;
            break;
        }
    }
    assert!(ended, "the relay read 68 MB of PINGs without answering them");
    wait_metric(&front.relay, "rl_relay_rls_auth_timeouts_total", 1.0).await;
    // Closed: writing fails (reset) within a few tries.
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Ok(())) | Err(_) = tokio::time::timeout(Duration::from_millis(100), tcp.write_all(&ping)).await {}
    })
    .await;
    assert!(closed.is_ok(), "still open after it was counted");
}
