//! The example gateway (examples/gateway.rs), run as a reader would
//! run it, on a rules file, against a real server, with a real HTTP client.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use testkit::{free_port, Server};

const RULES: &str = r#"
key_prefix = "gwt"
[[rules]]
id = "default"
reason = "test"
limits = [{ name = "per_hour", rate = 3, per = "1h" }]
[[rules]]
id = "vip"
match = { subject = "vip" }
reason = "test"
limits = [{ name = "per_hour", rate = 100, per = "1h" }]
"#;

/// The example binary, built if this test run did not build it.
fn example() -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let binary = deps.parent().unwrap().join("examples").join("gateway");
    if !binary.exists() {
        let built = Command::new(env!("CARGO")).args(["build", "-p", "rl-rules", "--example", "gateway"]).status();
        assert!(built.unwrap().success(), "cargo build --example gateway");
    }
    binary
}

struct Gateway {
    child: Child,
    port: u16,
    rules: PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.rules);
    }
}

async fn start(server: &Server) -> Gateway {
    let (port, backend) = (free_port(), free_port());
    let rules = std::env::temp_dir().join(format!("rl-gateway-{}-{port}.toml", std::process::id()));
    std::fs::write(&rules, RULES).unwrap();
    let child = Command::new(example())
        .env("REDIS_URL", server.url())
        .env("GATEWAY_PORT", port.to_string())
        .env("BACKEND_PORT", backend.to_string())
        .env("RULES_FILE", &rules)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the gateway did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Gateway { child, port, rules }
}

struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

async fn get(port: u16, headers: &[(&str, &[u8])]) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut req = Request::builder().uri(format!("http://127.0.0.1:{port}/hello"));
    for (name, value) in headers {
        req = req.header(*name, http::HeaderValue::from_bytes(value).unwrap());
    }
    let response = client.request(req.body(Empty::new()).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = String::from_utf8_lossy(&body.collect().await.unwrap().to_bytes()).into_owned();
    Reply { status: parts.status, headers: parts.headers, body }
}

fn all(r: &Reply, name: &str) -> Vec<String> {
    r.headers.get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn the_example_limits_by_key_and_by_ip_from_its_rules_file() {
    let server = Server::start(&[]);
    let gw = start(&server).await;

    // A key the rules name: its own rule, and the client IP's default rule.
    let r = get(gw.port, &[("x-api-key", b"vip")]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.starts_with("hello from the backend: GET /hello"), "{}", r.body);
    // Members name the view and the rule: key.<rule id>.<limit>, ip.<rule id>.<limit>.
    let policies = [r#""key.vip.per_hour";q=100;w=3600"#, r#""ip.default.per_hour";q=3;w=3600"#];
    assert_eq!(all(&r, "ratelimit-policy"), policies);
    assert_eq!(all(&r, "ratelimit"), [r#""key.vip.per_hour";r=99;t=36"#, r#""ip.default.per_hour";r=2;t=1200"#]);
    assert_eq!(r.headers["x-ratelimit-remaining"], "2", "the tightest: the IP's");

    // A spoofed X-Forwarded-For from an untrusted peer is no new client.
    let r = get(gw.port, &[("x-forwarded-for", b"203.0.113.9")]).await;
    assert_eq!(all(&r, "ratelimit"), [r#""ip.default.per_hour";r=1;t=1200"#], "no key: the IP only");
    // A 5000-byte key and a non-ASCII one are limited, never refused for their form.
    let long = vec![b'k'; 5000];
    let r = get(gw.port, &[("x-api-key", &long)]).await;
    assert_eq!(r.status, StatusCode::OK);
    // Its key and its address both land on the default rule, with their own
    // buckets: two members with two names, never one name twice.
    let both = [r#""key.default.per_hour";r=2;t=1200"#, r#""ip.default.per_hour";r=0;t=1200"#];
    assert_eq!(all(&r, "ratelimit"), both);
    // The IP's third and last token went to the long key's request.
    let r = get(gw.port, &[("x-api-key", b"cl\xe9")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert!(r.body.contains("\"violated-policies\":[\"ip.default.per_hour\"]"), "{}", r.body);
    let policies = [r#""ip.default.per_hour";q=3;w=3600"#, r#""key.default.per_hour";q=3;w=3600"#];
    assert_eq!(all(&r, "ratelimit-policy"), policies, "the refusal first, the refunded key after");
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    let refused = all(&r, "ratelimit").into_iter().find(|i| i.contains("r=0")).unwrap();
    assert_eq!(refused, format!("\"ip.default.per_hour\";r=0;t={retry}"), "Retry-After is the same moment as t");
    assert!((1190..=1200).contains(&retry), "a token every 20 minutes: {retry}");

    // The rules file changes: read again within a second or two.
    std::fs::write(&gw.rules, RULES.replace("rate = 3,", "rate = 1000,")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get(gw.port, &[]).await;
        if r.status == StatusCode::OK {
            assert!(all(&r, "ratelimit-policy")[0].contains("q=1000"));
            break;
        }
        assert!(Instant::now() < deadline, "the new rules never applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
