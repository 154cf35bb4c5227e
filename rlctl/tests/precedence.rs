//! Precedence that could quietly drop a fail-closed limit, against real
//! servers: a network rule outranks an endpoint rule, so `rlctl validate`
//! and `rlctl publish` name the traffic it takes off a fail-closed or
//! stricter rule; a rule for the network and the endpoint keeps that
//! traffic fail-closed through an outage.

#[path = "../../client/tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::process::Command;

use common::config;
use http::{Request, StatusCode};
use rl_gateway::http::{MissingKey, PeerAddr, RateLimitLayer};
use rl_gateway::live::{LiveDecide, LiveRules, RuleSetSpec};
use rl_gateway::{Backend, Limiter};
use testkit::Server;
use tower::{service_fn, Layer, ServiceExt};

/// Everyone, a fail-closed login, and an office that gets more.
const OFFICE: &str = r#"
[[rules]]
id = "default"
reason = "everyone"
limits = [{ name = "s", rate = 100, per = "1s" }]

[[rules]]
id = "login"
match = { endpoint = "POST /login" }
fail = "closed"
reason = "credential stuffing"
limits = [{ name = "m", rate = 5, per = "1m" }]

[[rules]]
id = "office"
match = { ip = "203.0.113.0/24" }
reason = "the office gets more"
limits = [{ name = "s", rate = 500, per = "1s" }]
"#;

/// The office's logins kept fail-closed, as strict as everyone's.
const OFFICE_LOGIN: &str = r#"
[[rules]]
id = "office-login"
match = { ip = "203.0.113.0/24", endpoint = "POST /login" }
fail = "closed"
reason = "the office logs in as everyone does"
limits = [{ name = "m", rate = 5, per = "1m" }]
"#;

fn rlctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rlctl")).args(args).env_remove("RL_REDIS_URL").output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

const WARNING: &str = "warning: rule 'office' (ip 203.0.113.0/24) takes requests to \"POST /login\" from 203.0.113.0/24 off rule 'login' (endpoint \"POST /login\"): 'login' is fail-closed and 'office' fails open";

#[test]
fn validate_and_publish_name_the_traffic_a_rule_takes_off_a_fail_closed_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    std::fs::write(&file, OFFICE).unwrap();
    let file = file.to_str().unwrap();
    let (code, out, err) = rlctl(&["validate", file]);
    assert_eq!(code, 0, "a warning, not a refusal: {err}");
    assert!(out.contains(WARNING), "{out}");
    assert!(out.contains("match = { ip = \"203.0.113.0/24\", endpoint = \"POST /login\" }"), "the remedy: {out}");

    let s = Server::start(&[]);
    let (code, out, err) = rlctl(&["publish", file, "--redis", &s.url()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("published") && out.contains(WARNING), "{out}");

    // With the combined rule the office's logins stay fail-closed: no warning.
    std::fs::write(dir.path().join("fixed.toml"), format!("{OFFICE}{OFFICE_LOGIN}")).unwrap();
    let (code, out, _) = rlctl(&["validate", dir.path().join("fixed.toml").to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(!out.contains("warning"), "{out}");
}

/// Keyless logins from the office during an outage: taken off the
/// fail-closed rule by the office's network rule they are let through by
/// the local fallback; under a rule for the network and the endpoint they
/// are refused (503), as everyone's are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_and_endpoint_rule_keeps_an_offices_logins_fail_closed_through_an_outage() {
    let mut s = Server::start(&[]);
    let outcomes = |toml: String| {
        let limiter = Limiter::new(config(s.url(), Backend::Module)).unwrap();
        let rules = LiveRules::new(limiter, &RuleSetSpec::from_toml(&toml).unwrap()).unwrap();
        let ok = service_fn(|_req: Request<String>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        });
        RateLimitLayer::new(LiveDecide::new(rules)).key_header("x-api-key").missing_key(MissingKey::UseIp).layer(ok)
    };
    let only_office = outcomes(OFFICE.to_owned());
    let with_login = outcomes(format!("{OFFICE}{OFFICE_LOGIN}"));
    let login = || {
        let mut req = Request::builder().method("POST").uri("/login").body(String::new()).unwrap();
        req.extensions_mut().insert(PeerAddr(SocketAddr::new("203.0.113.9".parse().unwrap(), 4000)));
        req
    };
    // Both answer while Redis is up.
    assert_eq!(only_office.clone().oneshot(login()).await.unwrap().status(), StatusCode::OK);
    assert_eq!(with_login.clone().oneshot(login()).await.unwrap().status(), StatusCode::OK);
    s.kill();
    let mut open = 0;
    for _ in 0..3 {
        open += usize::from(only_office.clone().oneshot(login()).await.unwrap().status() == StatusCode::OK);
        let r = with_login.clone().oneshot(login()).await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "fail-closed for the office's logins too");
    }
    assert_eq!(open, 3, "the network rule fails open: what the warning says");
}
