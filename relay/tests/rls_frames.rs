//! gRPC frames a client may craft and tonic's client never sends, on the
//! RLS front over raw HTTP/2: each is answered with a gRPC error status
//! (never a crash, a hang or a decision), the service counts none of them,
//! and the relay keeps serving.

mod common;

use bytes::Bytes;
use common::rls::*;
use prost::Message;
use testkit::Server;

const CONFIG: &str = "\
domain: api
descriptors:
  - key: wide
    rate_limit: { unit: hour, requests_per_unit: 1000 }
";

const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// One gRPC message frame: the compressed flag, the length it declares,
/// then `payload` (which may be shorter or longer than declared).
fn frame(compressed: u8, declared: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![compressed];
    out.extend(declared.to_be_bytes());
    out.extend(payload);
    out
}

/// A valid request, encoded.
fn valid() -> Vec<u8> {
    request("api", &[&[("wide", "f")]]).encode_to_vec()
}

/// What the front answered a POST of `body` to `path` with `content_type`:
/// the HTTP status and the gRPC status and message (from the headers of a
/// trailers-only answer, or from the trailers).
async fn post(port: u16, path: &str, content_type: &str, body: Vec<u8>) -> (u16, Option<String>, String) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut send = send.ready().await.unwrap();
    let request = http::Request::post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut stream) = send.send_request(request, false).unwrap();
    stream.send_data(Bytes::from(body), true).unwrap();
    let response = tokio::time::timeout(std::time::Duration::from_secs(10), response)
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    let get = |name: &str| headers.get(name).or_else(|| trailers.get(name)).map(|v| v.to_str().unwrap().to_owned());
    (status, get("grpc-status"), get("grpc-message").unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crafted_frames_get_grpc_errors_and_the_front_keeps_serving() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let port = relay.rls_port;
    let grpc = "application/grpc";
    let message = valid();
    let len = message.len() as u32;
    // The baseline: a valid frame, sent raw, is served (grpc-status 0).
    let (http, status, _) = post(port, METHOD, grpc, frame(0, len, &message)).await;
    assert_eq!((http, status.as_deref()), (200, Some("0")));
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("the compressed flag without grpc-encoding", frame(1, len, &message), "13"),
        ("a flag that is neither 0 nor 1", frame(7, len, &message), "13"),
        ("a declared length of 4 GiB", frame(0, u32::MAX, &message), "11"),
        ("a message cut short", frame(0, len + 100, &message), "13"),
        ("five bytes of a frame header", frame(0, len, &[])[..5].to_vec(), "13"),
        ("bytes that are not protobuf", frame(0, 5, &[0xff; 5]), "13"),
    ];
    for (what, body, want) in cases {
        let (http, status, text) = post(port, METHOD, grpc, body).await;
        assert_eq!((http, status.as_deref()), (200, Some(want)), "{what}: {text}");
    }
    // Two messages on a unary call: tonic's unary server reads them all
    // before the service runs, and decides the first, once; a second that
    // is not protobuf fails the call, nothing decided.
    let two = [frame(0, len, &message), frame(0, len, &message)].concat();
    assert_eq!(post(port, METHOD, grpc, two).await.1.as_deref(), Some("0"));
    let then_bad = [frame(0, len, &message), frame(0, 5, &[0xff; 5])].concat();
    let bad = post(port, METHOD, grpc, then_bad).await;
    assert_eq!(bad.1.as_deref(), Some("13"), "{bad:?}");
    let (_, status, _) =
        post(port, "/envoy.service.ratelimit.v3.RateLimitService/Nope", grpc, frame(0, len, &message)).await;
    assert_eq!(status.as_deref(), Some("12"), "an unknown method: UNIMPLEMENTED");
    // tonic does not look at the content type: a valid frame under another
    // is decided as a call (the token, if set, is still checked).
    let plain = post(port, METHOD, "text/plain", frame(0, len, &message)).await;
    assert_eq!((plain.0, plain.1.as_deref()), (200, Some("0")));
    // Still serving, and only the valid frames were decided: 3, then this one.
    let mut client = relay.client().await;
    assert_eq!(ask(&mut client, request("api", &[&[("wide", "f")]])).await.statuses[0].limit_remaining, 996);
    let requests = relay.metric("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}");
    assert_eq!(requests, 4.0, "{}", relay.relay.log());
}
