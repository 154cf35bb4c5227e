//! What an operator relies on: readiness apart from liveness, upstream
//! failures in the log without secrets and rate limited, Prometheus text a
//! real parser reads, subject labels that do not expose API keys, and the
//! ACL recipe of docs/security.md for the relay's Redis user, end to end.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{call, relay_acl_recipe, Relay, Resp};
use testkit::{free_port, Server};

/// `GET path` on `port`: the status code and the body.
fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: relay\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The user the readiness test's relay logs in as.
fn make_user(s: &Server) {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("rl")
        .arg("on")
        .arg(">hunter2-secret")
        .arg("~*")
        .arg("+@all")
        .query(&mut s.con())
        .unwrap();
}

#[test]
fn readiness_follows_redis_and_liveness_does_not() {
    let mut s = Server::start(&[]);
    let metrics = free_port();
    let url = format!("redis://rl:hunter2-secret@127.0.0.1:{}/", s.port);
    // The server has no such user: AUTH fails, so the relay is not ready.
    let relay = Relay::start(&url, &["--metrics", &format!("127.0.0.1:{metrics}"), "--timeout-ms", "200"]);
    wait_for("not ready (bad credentials)", || http_get(metrics, "/ready").0 == 503);
    make_user(&s);
    wait_for("ready", || http_get(metrics, "/ready").0 == 200);
    let (_, body) = http_get(metrics, "/metrics");
    assert_eq!(metric(&body, "rl_relay_ready"), Some(1.0), "{body}");
    s.kill();
    wait_for("not ready once Redis is down", || http_get(metrics, "/ready").0 == 503);
    let (status, body) = http_get(metrics, "/metrics");
    assert_eq!((status, metric(&body, "rl_relay_ready")), (200, Some(0.0)), "{body}");
    assert_eq!(http_get(metrics, "/live").0, 200, "alive while Redis is down");
    assert_eq!(http_get(metrics, "/nope").0, 404);
    let mut c = relay.raw();
    assert_eq!(call(&mut c, "PING"), Resp::Simple("PONG".into()), "PING is liveness");
    assert!(call(&mut c, "INFO relay").text().contains("ready:0\r\n"));
    // Failing calls are logged, rate limited, without the password.
    for _ in 0..200 {
        assert!(call(&mut c, "RL.TAKE 1 rl:{a}:s 10 1 1000").error().starts_with("TRYAGAIN"));
    }
    s.restart();
    // The server keeps nothing: its user is made again.
    make_user(&s);
    wait_for("ready again", || http_get(metrics, "/ready").0 == 200);
    let log = relay.log();
    assert!(!log.contains("hunter2"), "a secret in the log:\n{log}");
    assert!(log.contains("rl:***@127.0.0.1"), "the URL is logged redacted:\n{log}");
    let failures = log.lines().filter(|l| l.contains("upstream")).count();
    assert!((1..=6).contains(&failures), "{failures} upstream lines for 200 failures:\n{log}");
    assert!(log.contains("Redis is reachable"), "{log}");
}

/// Prometheus text: one family at a time, HELP and TYPE first, read by a
/// real parser (the prometheus-parse crate; promtool's linter too where it
/// is installed).
#[test]
fn metrics_are_prometheus_text_grouped_by_family() {
    let s = Server::start(&[]);
    let metrics = free_port();
    let relay = Relay::start(&s.url(), &["--metrics", &format!("127.0.0.1:{metrics}")]);
    let mut c = relay.raw();
    for subject in ["alpha-api-key-123", "beta-api-key-456"] {
        for _ in 0..3 {
            call(&mut c, &format!("RL.TAKE 1 rl:{{{subject}}}:per_second 100 100 1000"));
        }
    }
    call(&mut c, "FLUSHALL");
    let (status, body) = http_get(metrics, "/metrics");
    assert_eq!(status, 200);
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    let mut seen: Vec<String> = Vec::new();
    for sample in &scrape.samples {
        let family = sample.metric.clone();
        if seen.last() != Some(&family) {
            assert!(!seen.contains(&family), "family {family} is interleaved:\n{body}");
            seen.push(family.clone());
        }
        assert!(scrape.docs.contains_key(&family), "{family} has no HELP");
    }
    // Every family's TYPE line comes right after its HELP, before its samples.
    let mut current = None;
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            current = rest.split(' ').next().map(str::to_string);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            assert_eq!(rest.split(' ').next().map(str::to_string), current, "{line}");
        } else if !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap();
            assert_eq!(Some(name.to_string()), current, "a sample outside its family: {line}");
        }
    }
    for (name, kind) in [
        ("rl_relay_requests_total", prometheus_parse::Value::Counter(0.0)),
        ("rl_relay_ready", prometheus_parse::Value::Gauge(0.0)),
        ("rl_relay_refused_commands_total", prometheus_parse::Value::Counter(0.0)),
        ("rl_relay_connected_clients", prometheus_parse::Value::Gauge(0.0)),
        ("rl_relay_subject_batch", prometheus_parse::Value::Gauge(0.0)),
    ] {
        let sample = scrape.samples.iter().find(|s| s.metric == name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(std::mem::discriminant(&sample.value), std::mem::discriminant(&kind), "{name}");
    }
    let refused = scrape.samples.iter().find(|s| s.metric == "rl_relay_refused_commands_total").unwrap();
    assert!(matches!(refused.value, prometheus_parse::Value::Counter(n) if n >= 1.0));
    // The API keys are not in the labels (nor in INFO relay): the hash tag is hashed.
    assert!(!body.contains("api-key"), "{body}");
    assert!(!relay.info().contains("api-key"), "{}", relay.info());
    let batch = scrape.samples.iter().find(|s| s.metric == "rl_relay_subject_batch").unwrap();
    let subject = batch.labels.get("subject").unwrap();
    assert!(subject.starts_with("rl:#") && subject.ends_with(":per_second"), "{subject}");
    if let Ok(mut promtool) =
        Command::new("promtool").args(["check", "metrics"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()
    {
        promtool.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let out = promtool.wait_with_output().unwrap();
        assert!(out.status.success(), "promtool: {}", String::from_utf8_lossy(&out.stdout));
    }
}

#[test]
fn subject_names_are_shown_only_when_asked() {
    let s = Server::start(&[]);
    let relay = Relay::start(&s.url(), &["--show-subjects"]);
    let mut c = relay.raw();
    call(&mut c, "RL.TAKE 1 rl:{visible-key}:s 100 100 1000");
    assert!(relay.info().contains("name=rl:{visible-key}:s"), "{}", relay.info());
}

/// An operator's first question in an incident: which subjects are refused
/// most. INFO relay lists them (`refused_N:`), /metrics counts them
/// (`rl_relay_subject_refused_total`), most refused first; a subject never
/// refused is not listed.
#[test]
fn the_most_refused_subjects_are_listed() {
    let s = Server::start(&[]);
    let metrics = free_port();
    let relay = Relay::start(&s.url(), &["--metrics", &format!("127.0.0.1:{metrics}"), "--show-subjects"]);
    let mut c = relay.raw();
    // 2 a minute: the third call on is refused (from Redis, then memory).
    for (subject, calls) in [("heavy", 12), ("light", 4), ("calm", 2)] {
        for _ in 0..calls {
            call(&mut c, &format!("RL.TAKE 1 rl:{{{subject}}}:m 2 2 60000"));
        }
    }
    let info = relay.info();
    let listed: Vec<&str> = info
        .lines()
        .filter(|l| l.strip_prefix("refused_").is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit())))
        .collect();
    assert_eq!(listed, ["refused_0:name=rl:{heavy}:m,refused=10", "refused_1:name=rl:{light}:m,refused=2"], "{info}");
    let body = http_get(metrics, "/metrics").1;
    assert!(body.contains("rl_relay_subject_refused_total{subject=\"rl:{heavy}:m\"} 10\n"), "{body}");
    assert!(!body.contains("rl_relay_subject_refused_total{subject=\"rl:{calm}:m\"}"), "{body}");
}

/// docs/security.md's recipe for the relay's Redis user: the module's public
/// commands and what the relay sends itself, nothing else.
#[test]
fn the_readmes_acl_recipe_runs_the_relay() {
    let s = Server::start(&[]);
    let mut admin = s.con();
    let _: () = relay_acl_recipe(&mut admin, "relay-pass").query(&mut admin).unwrap();
    let metrics = free_port();
    let url = format!("redis://rl-relay:relay-pass@127.0.0.1:{}/", s.port);
    let relay = Relay::start(&url, &["--metrics", &format!("127.0.0.1:{metrics}")]);
    wait_for("ready as the restricted user", || http_get(metrics, "/ready").0 == 200);
    let mut c = relay.raw();
    // Served from a lease, forwarded, every public command.
    for line in [
        "RL.TAKE 1 rl:{acl}:s 100 100 1000",
        "RL.LEASE 1 rl:{acl}:s 100 100 1000 WANT 5",
        "RL.TAKE 1 rl:{acl}:s 100 100 1000 FORCE",
        "RL.PEEK 1 rl:{acl}:s 100 100 1000",
        "RL.REFUND 1 rl:{acl}:s 100 100 1000 TOKENS 1",
        "RL.WINDOW 1 rl:{acl}:w 5 1000",
        "RL.WINDOWPEEK 1 rl:{acl}:w 5 1000",
        "CL.THROTTLE rl:{acl}:cell 5 10 60 1",
        "RL.ACQUIRE 1 rl:{acl}:f 3 30000 ID one",
        "RL.INFLIGHT 1 rl:{acl}:f 3 30000",
        "RL.RELEASE 1 rl:{acl}:f ID one",
    ] {
        let reply = call(&mut c, line);
        assert!(matches!(reply, Resp::Array(_) | Resp::Int(_)), "{line}: {reply:?}");
    }
    // A key outside the pattern is Redis's refusal, word for word.
    let outside = call(&mut c, "RL.TAKE 1 other:{x}:s 10 1 1000 FORCE");
    assert!(outside.error().starts_with("NOPERM"), "{outside:?}");
    // The user itself cannot do more than the recipe says (except RESET,
    // which no ACL refuses: the relay never forwards it).
    let direct = redis::Client::open(url.as_str()).unwrap().get_connection();
    let mut direct = direct.unwrap();
    for forbidden in ["FLUSHALL", "KEYS *", "CONFIG GET maxmemory", "EVAL return 0", "GET rl:x"] {
        let mut cmd = redis::Cmd::new();
        for word in forbidden.split(' ') {
            cmd.arg(word);
        }
        let e = cmd.query::<redis::Value>(&mut direct).unwrap_err();
        assert!(testkit::server_error(&e).starts_with("NOPERM"), "{forbidden}: {e}");
    }
    let log = relay.log();
    assert!(!log.contains("relay-pass"), "{log}");
    assert!(!log.to_lowercase().contains("noperm"), "the relay's own calls were refused:\n{log}");
}
