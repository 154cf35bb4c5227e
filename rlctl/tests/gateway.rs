//! The example gateway (examples/gateway.rs), run as a reader would run
//! it, against a real server, with a real HTTP client: its bootstrap rules,
//! a set published in Redis replacing them, the keyless IP tier, the
//! in-flight limit on the slow route, and the fail-closed login through an
//! outage; and on a managed-like Redis (TLS only, no module, ACL users).

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use testkit::managed::Managed;
use testkit::{example_gateway, free_port, PlainServer, SentinelSet, Server, MASTER};

struct Gateway {
    child: Child,
    port: u16,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The reports take this long: the in-flight slots are held as long.
const SLOW_MS: u64 = 2000;

async fn start(server: &Server) -> Gateway {
    start_with(&[("REDIS_URL", server.url())]).await
}

/// The example with `redis` naming its Redis (REDIS_URL, or REDIS_SENTINELS
/// and REDIS_MASTER).
async fn start_with(redis: &[(&str, String)]) -> Gateway {
    start_logging(redis, Stdio::inherit()).await
}

/// [`start_with`], its log lines (stderr) going to `log`.
async fn start_logging(redis: &[(&str, String)], log: impl Into<Stdio>) -> Gateway {
    let (port, backend) = (free_port(), free_port());
    let child = Command::new(example_gateway())
        .envs(redis.iter().map(|(k, v)| (k, v)))
        .env_remove(if redis.iter().any(|(k, _)| *k == "REDIS_URL") { "REDIS_SENTINELS" } else { "REDIS_URL" })
        .env("GATEWAY_PORT", port.to_string())
        .env("BACKEND_PORT", backend.to_string())
        .env("SLOW_MS", SLOW_MS.to_string())
        .env_remove("RULES_FILE")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the gateway did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Gateway { child, port }
}

/// The example's bootstrap rules with the per-second rate raised from 100
/// to 300, written to `dir`/rules.toml: a set to publish over them.
fn raised_rules(dir: &std::path::Path) -> PathBuf {
    let file = dir.join("rules.toml");
    let bootstrap =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../gateway/examples/gateway.toml")).unwrap();
    let raised =
        bootstrap.replacen("rate = 100, per = \"1s\", burst = 200", "rate = 300, per = \"1s\", burst = 600", 1);
    assert_ne!(raised, bootstrap, "the example's per-second rule moved: raise it here too");
    std::fs::write(&file, raised).unwrap();
    file
}

struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

impl Reply {
    fn all(&self, name: &str) -> String {
        self.headers.get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect::<Vec<_>>().join(", ")
    }
}

async fn call(port: u16, method: Method, path: &str, key: Option<&str>) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut req = Request::builder().method(method).uri(format!("http://127.0.0.1:{port}{path}"));
    if let Some(key) = key {
        req = req.header("x-api-key", key);
    }
    let response = client.request(req.body(Empty::new()).unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = String::from_utf8_lossy(&body.collect().await.unwrap().to_bytes()).into_owned();
    Reply { status: parts.status, headers: parts.headers, body }
}

async fn get(port: u16, path: &str, key: Option<&str>) -> Reply {
    call(port, Method::GET, path, key).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_gateway_runs_live_rules_behind_the_layer() {
    let mut server = Server::start(&[]);
    let gw = start(&server).await;

    // A key: its own buckets in the default rule, and no IP view.
    let r = get(gw.port, "/hello", Some("alice")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.starts_with("hello from the backend: GET /hello"), "{}", r.body);
    assert_eq!(
        r.all("ratelimit-policy"),
        r#""key.default.per_second";q=200;w=2, "key.default.per_minute";q=5000;w=60"#
    );
    // A second key behind the same address starts full: no shared IP bucket.
    let r = get(gw.port, "/hello", Some("bob")).await;
    assert!(r.all("ratelimit").starts_with(r#""key.default.per_second";r=199"#), "{}", r.all("ratelimit"));
    // No key: the keyless tier, by address.
    let r = get(gw.port, "/hello", None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.all("ratelimit-policy"), r#""ip.keyless-v4.per_second";q=40;w=2"#);

    // The slow route, matched by its template: one report seen to take
    // SLOW_MS, then 21 at once for one key: 20 slots, one refusal that
    // says when a slot is likely free (not the 30 s slot timeout).
    let r = get(gw.port, "/reports/1", Some("carol")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.all("ratelimit-policy").contains(r#""key.reports.in_flight";q=20"#), "{}", r.all("ratelimit-policy"));
    let port = gw.port;
    let tasks: Vec<_> = (0..21)
        .map(|i| tokio::spawn(async move { get(port, &format!("/reports/{i}"), Some("carol")).await }))
        .collect();
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.unwrap());
    }
    let ok = replies.iter().filter(|r| r.status == StatusCode::OK).count();
    let refused: Vec<&Reply> = replies.iter().filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS).collect();
    assert_eq!((ok, refused.len()), (20, 1), "20 in flight at most");
    let refusal = refused[0];
    let retry: u64 = refusal.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry <= SLOW_MS.div_ceil(1000), "from the holds seen, not the 30 s timeout: {retry}");
    assert!(
        refusal.all("ratelimit").contains(&format!(r#""key.reports.in_flight";r=0;t={retry}"#)),
        "{}",
        refusal.all("ratelimit")
    );
    assert!(refusal.body.contains("\"violated-policies\":[\"key.reports.in_flight\"]"), "{}", refusal.body);

    // A set published in Redis replaces the bootstrap file.
    let dir = tempfile::tempdir().unwrap();
    let file = raised_rules(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_rlctl"))
        .args(["publish", file.to_str().unwrap(), "--redis", &server.url()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = get(gw.port, "/hello", Some("dave")).await;
        if r.all("ratelimit-policy").contains("q=600") {
            break;
        }
        assert!(Instant::now() < deadline, "the published rules never applied: {}", r.all("ratelimit-policy"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Redis gone: logins refused (fail-closed), with a key or without;
    // the rest limited locally.
    server.kill();
    for key in [Some("alice"), None] {
        let r = call(gw.port, Method::POST, "/login", key).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{key:?}: {}", r.body);
    }
    let r = get(gw.port, "/hello", Some("alice")).await;
    assert_eq!(r.status, StatusCode::OK, "fail-open: limited locally");
}

/// `REDIS_SENTINELS` and `REDIS_MASTER` instead of `REDIS_URL` (issue 26):
/// after `SENTINEL FAILOVER` the gateway's calls reach the new primary and
/// a fail-closed login is decided by Redis again, not refused with 503.
/// A managed Redis cannot load the module: the example gateway on the Lua
/// backend runs its own rules file unchanged, the per-minute window
/// included (counted by the window script), against a server without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_gateway_runs_its_rules_on_a_redis_without_the_module() {
    let server = PlainServer::start();
    let gw = start_with(&[("REDIS_URL", server.url()), ("RL_BACKEND", "lua".into())]).await;
    for left in [199, 198] {
        let r = get(gw.port, "/hello", Some("dave")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(
            r.all("ratelimit-policy"),
            r#""key.default.per_second";q=200;w=2, "key.default.per_minute";q=5000;w=60"#
        );
        assert!(
            r.all("ratelimit").starts_with(&format!(r#""key.default.per_second";r={left}"#)),
            "{}",
            r.all("ratelimit")
        );
    }
    // The minute's window is the script's string, counting both requests.
    let mut con = server.con();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*per_minute*").query(&mut con).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let state: String = redis::cmd("GET").arg(&keys[0]).query(&mut con).unwrap();
    assert!(state.starts_with("w ") && state.ends_with(" 2"), "{state}");
    // Logins: 5 a minute, fail-closed, decided by the bucket script.
    for _ in 0..5 {
        assert_eq!(call(gw.port, Method::POST, "/login", Some("erin")).await.status, StatusCode::OK);
    }
    assert_eq!(call(gw.port, Method::POST, "/login", Some("erin")).await.status, StatusCode::TOO_MANY_REQUESTS);
}

/// The example on the module's backend (its default) against a Redis
/// without the module: every rule follows its failure mode, and the log
/// says why in words an operator can act on (it blamed a limit's size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_without_the_module_is_named_as_such() {
    let server = PlainServer::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("gateway.log");
    let gw = start_logging(&[("REDIS_URL", server.url())], std::fs::File::create(&log).unwrap()).await;
    // Fail-open: answered by the local fallback.
    assert_eq!(get(gw.port, "/hello", Some("dave")).await.status, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let said = std::fs::read_to_string(&log).unwrap();
        if said.contains("the module is not loaded there") && said.contains("RL_BACKEND=lua") {
            break;
        }
        assert!(Instant::now() < deadline, "the log never names the missing module:\n{said}");
        let _ = get(gw.port, "/hello", Some("dave")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A managed Redis as the services run one (testkit::managed): TLS only,
/// no module, `default` off, CONFIG, KEYS, MODULE, FLUSHALL... renamed
/// away. The example gateway on the Lua backend, with its own rules file
/// (a window, logins, the in-flight route), and `rlctl publish` work on
/// it as the users docs/security.md gives for it, and `ACL LOG` records no
/// refusal: those users are enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_gateway_and_rlctl_publish_work_on_a_managed_redis() {
    const PASSWORD: &str = "managed-pw";
    let server = Managed::start(&[
        &testkit::managed::documented_user("rl-gateway-lua", PASSWORD),
        &testkit::managed::documented_user("rl-ctl-lua", PASSWORD),
    ]);
    let ca = server.tls().ca.display().to_string();
    let gw = start_with(&[
        ("REDIS_URL", server.url_as("rl-gateway-lua", PASSWORD)),
        ("RL_BACKEND", "lua".into()),
        ("RL_TLS_CA_FILE", ca.clone()),
    ])
    .await;
    // SCAN, as KEYS is withheld.
    let mut operator = server.operator();
    let mut scan = |pattern: &str| -> Vec<String> {
        let (_, keys): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(0).arg("MATCH").arg(pattern).arg("COUNT").arg(1000).query(&mut operator).unwrap();
        keys
    };
    // The first calls connect (a TLS handshake, slow in a debug build on
    // a busy machine: past the 50 ms timeout the fallback decides): warm
    // up on another key until Redis has counted one.
    let deadline = Instant::now() + Duration::from_secs(20);
    while scan("*warm*").is_empty() {
        assert!(Instant::now() < deadline, "no call reached the managed server");
        assert_eq!(get(gw.port, "/hello", Some("warm")).await.status, StatusCode::OK);
    }
    for left in [199, 198] {
        let r = get(gw.port, "/hello", Some("dave")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert!(
            r.all("ratelimit").starts_with(&format!(r#""key.default.per_second";r={left}"#)),
            "decided by Redis, not the fallback: {}",
            r.all("ratelimit")
        );
    }
    // The minute's window is the script's string, counting both requests.
    let keys = scan("*dave*per_minute*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let state: String = redis::cmd("GET").arg(&keys[0]).query(&mut server.operator()).unwrap();
    assert!(state.starts_with("w ") && state.ends_with(" 2"), "{state}");
    let r = get(gw.port, "/hello", None).await;
    assert_eq!(r.status, StatusCode::OK, "the keyless tier: {}", r.body);
    let r = get(gw.port, "/reports/1", Some("erin")).await;
    assert_eq!(r.status, StatusCode::OK, "the in-flight route: {}", r.body);
    for _ in 0..5 {
        assert_eq!(call(gw.port, Method::POST, "/login", Some("erin")).await.status, StatusCode::OK);
    }
    assert_eq!(call(gw.port, Method::POST, "/login", Some("erin")).await.status, StatusCode::TOO_MANY_REQUESTS);

    // rlctl publish, as its own user over TLS: the gateway takes the set.
    let dir = tempfile::tempdir().unwrap();
    let file = raised_rules(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_rlctl"))
        .args(["publish", file.to_str().unwrap(), "--redis", &server.url_as("rl-ctl-lua", PASSWORD)])
        .args(["--tls-ca-file", &ca])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The module's bound checks cannot run there: the set is held to the
    // Lua backend's instead, and that is said.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("has no redis-rl module: the set was checked as gateways on the Lua backend check it"),
        "{stdout}{stderr}"
    );
    assert!(!stderr.contains("warning"), "{stderr}");
    // A set the scripts cannot count (an EXACT window above 10,000) is
    // refused there, before any gateway sees it.
    let beyond = dir.path().join("beyond.toml");
    let text = std::fs::read_to_string(&file).unwrap().replacen(
        "rate = 300, per = \"1s\", burst = 600",
        "rate = 300, per = \"1s\", burst = 600 },\n  { name = \"log\", kind = \"exact\", limit = 20000, per = \"1m\"",
        1,
    );
    std::fs::write(&beyond, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rlctl"))
        .args(["publish", beyond.to_str().unwrap(), "--redis", &server.url_as("rl-ctl-lua", PASSWORD)])
        .args(["--tls-ca-file", &ca])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("has no redis-rl module, so its gateways run the Lua backend, which refuses it"),
        "{stderr}"
    );
    assert!(stderr.contains("'log'"), "names the limit: {stderr}");
    // `validate --redis` says the same of both sets.
    let validate = |file: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_rlctl"))
            .args(["validate", file.to_str().unwrap(), "--redis", &server.url_as("rl-ctl-lua", PASSWORD)])
            .args(["--tls-ca-file", &ca])
            .output()
            .unwrap()
    };
    let out = validate(&beyond);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("has no redis-rl module, so its gateways run the Lua backend, which refuses it"),
        "{stderr}"
    );
    let out = validate(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("the set was checked as gateways on the Lua backend check it"), "{stdout}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = get(gw.port, "/hello", Some("frank")).await;
        if r.all("ratelimit-policy").contains("q=600") {
            break;
        }
        assert!(Instant::now() < deadline, "the published rules never applied: {}", r.all("ratelimit-policy"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(server.acl_log(), Vec::<String>::new(), "every call allowed to the documented users");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_gateway_follows_a_sentinel_failover() {
    let set = SentinelSet::start(1);
    let sentinels = set.addresses().join(",");
    let gw = start_with(&[("REDIS_SENTINELS", sentinels), ("REDIS_MASTER", MASTER.to_string())]).await;
    let r = call(gw.port, Method::POST, "/login", Some("before")).await;
    assert_eq!(r.status, StatusCode::OK, "a fail-closed login through Sentinel: {}", r.body);
    let new = set.failover();
    let mut con = new.con();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    loop {
        n += 1;
        // A new key each time: its login is a call to Redis.
        let r = call(gw.port, Method::POST, "/login", Some(&format!("after-{n}"))).await;
        let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut con).unwrap();
        // The module replicates effects (RL.SET): a call the gateway made
        // shows as RL.TAKE or RL.LEASE on the server it reached.
        let reached = stats.contains("cmdstat_rl.take:") || stats.contains("cmdstat_rl.lease:");
        if r.status == StatusCode::OK && reached {
            break;
        }
        assert!(Instant::now() < deadline, "not on the new primary within 15 s ({}):\n{stats}", r.status);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A rules file whose EXACT limit the server refuses (100,000 per 15
/// minutes, above the module's default max-log-limit of 10,000): the
/// gateway does not start, and says which rule, which limit and which
/// module option, as `rlctl publish` refuses such a set. Before (issue 34),
/// it started, every request of that rule errored at Redis, fail-closed
/// logins answered 503 forever, and the log blamed an outage.
#[test]
fn a_rules_file_the_server_refuses_stops_the_gateway_at_start() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    let rules = "[[rules]]\nid = \"default\"\nreason = \"every key\"\n\
                 limits = [{ name = \"s\", rate = 100, per = \"1s\" }]\n\
                 [[rules]]\nid = \"login\"\nmatch = { endpoint = \"POST /login\" }\nfail = \"closed\"\n\
                 reason = \"credential stuffing\"\n\
                 limits = [{ name = \"per_15m\", kind = \"exact\", limit = 100000, per = \"15m\" }]\n";
    std::fs::write(&file, rules).unwrap();
    let mut child = Command::new(example_gateway())
        .env("REDIS_URL", server.url())
        .env_remove("REDIS_SENTINELS")
        .env("RULES_FILE", &file)
        .env("GATEWAY_PORT", free_port().to_string())
        .env("BACKEND_PORT", free_port().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the gateway started on a rules file its server refuses");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("rule 'login' limit 'per_15m'") && err.contains("max-log-limit") && err.contains("refuses"),
        "names the rule, the limit and the option: {err}"
    );
}
