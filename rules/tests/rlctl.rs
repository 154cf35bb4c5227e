//! rlctl end to end: the built binary against a real server, and a gateway
//! watching what it publishes.

#[path = "../../client/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::config;
use rl_client::{Backend, Limiter};
use rl_rules::{override_id, LiveRules, MatchSpec, RedisSource, Request, RuleSetSpec};
use testkit::Server;

struct Run {
    code: i32,
    out: String,
    err: String,
}

async fn rlctl(args: &[&str]) -> Run {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_rlctl")).args(&args).env_remove("RL_REDIS_URL").output().unwrap()
    })
    .await
    .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&output.stdout).into_owned(),
        err: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn subject_id(subject: &str) -> String {
    override_id(&MatchSpec { subject: Some(subject.to_owned()), ..MatchSpec::default() })
}

fn ip_id(net: &str) -> String {
    override_id(&MatchSpec { ip: Some(net.to_owned()), ..MatchSpec::default() })
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rules.example.toml")
}

#[tokio::test]
async fn validate_accepts_the_example_and_names_every_fault() {
    let example = example();
    let ok = rlctl(&["validate", example.to_str().unwrap()]).await;
    assert_eq!(ok.code, 0, "{}", ok.err);
    assert!(ok.out.contains("ok, version 0: 8 rules (1 in shadow mode, 0 overrides)"), "{}", ok.out);
    // The example has a quota and a window: not for the Lua backend.
    let lua = rlctl(&["validate", "--lua", example.to_str().unwrap()]).await;
    assert_eq!(lua.code, 1);
    assert!(lua.err.contains("rule 'default': window and quota limits need the module"), "{}", lua.err);

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"rules": [
            {"id": "default", "reason": "r", "limits": [{"name": "s", "rate": 10, "per": "1s"}]},
            {"id": "pro", "match": {"plan": "pro"}, "reason": "", "limits": [{"name": "s", "rate": 10, "per": "soon"}]},
            {"id": "net", "match": {"ip": "10.1.2.3/8"}, "reason": "r", "limits": [{"name": "s", "rate": 1, "per": "1s"}]}
        ]}"#,
    )
    .unwrap();
    let run = rlctl(&["validate", bad.to_str().unwrap()]).await;
    assert_eq!(run.code, 1);
    for fault in [
        "rule set rejected: ",
        "rule 'pro': reason is required",
        "rule 'pro' limit 's': per \"soon\" is not a duration",
        "rule 'net': match.ip 10.1.2.3/8 has host bits set: the network is 10.0.0.0/8",
    ] {
        assert!(run.err.contains(fault), "{fault} in: {}", run.err);
    }
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "[[rules]]\nid = \"default\"\nreason = \"r\"\nlimit = []\n").unwrap();
    let run = rlctl(&["validate", typo.to_str().unwrap()]).await;
    assert_eq!(run.code, 1);
    assert!(run.err.contains("typo.toml") && run.err.contains("unknown field `limit`"), "{}", run.err);
    let missing = rlctl(&["validate", "/nonexistent/rules.toml"]).await;
    assert_eq!(missing.code, 1);
    assert!(missing.err.contains("cannot read /nonexistent/rules.toml"), "{}", missing.err);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_override_and_remove_reach_a_gateway() {
    let s = Server::start(&[]);
    let url = s.url();
    let example = example();
    let file = example.to_str().unwrap();
    let limiter = Limiter::new(config(url.clone(), Backend::Module)).unwrap();
    let gateway = LiveRules::new(limiter, &RuleSetSpec::from_file(&example).unwrap()).unwrap();
    let _watcher = gateway.watch_redis(RedisSource::new(url.clone())).unwrap();
    let reaches = |version: u64| {
        let gateway = gateway.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while gateway.snapshot().version() != version {
                assert!(
                    Instant::now() < deadline,
                    "version {version} did not reach the gateway: {:?}",
                    gateway.status()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    let active = rlctl(&["active", "--redis", &url]).await;
    assert_eq!((active.code, active.out.trim()), (0, "version 0: nothing published"));
    let run = rlctl(&[
        "override",
        "add",
        "--subject",
        "k",
        "--limit",
        "s=1/1h",
        "--expires",
        "15m",
        "--reason",
        "x",
        "--redis",
        &url,
    ])
    .await;
    assert_eq!(run.code, 1);
    assert!(run.err.contains("publish a rule file first"), "{}", run.err);

    let run = rlctl(&["publish", file, "--redis", &url]).await;
    assert_eq!(run.code, 0, "{}", run.err);
    assert!(run.out.contains("as version 1"), "{}", run.out);
    reaches(1).await;

    let add = [
        "override",
        "add",
        "--subject",
        "key_8f3",
        "--limit",
        "per_second=1/1h",
        "--limit",
        "daily=5/1d,quota",
        "--expires",
        "15m",
        "--reason",
        "INC-4411: retry storm",
        "--redis",
        &url,
    ];
    let run = rlctl(&add).await;
    assert_eq!(run.code, 0, "{}", run.err);
    let key_id = subject_id("key_8f3");
    assert!(run.out.contains(&format!("override '{key_id}' in force from version 2")), "{}", run.out);
    reaches(2).await;
    let req = Request::new().subject("key_8f3").plan("pro");
    let v = gateway.check(&req).await.unwrap();
    assert_eq!((v.rule.id(), v.decision.allowed), (key_id.as_str(), true));
    assert!(!gateway.check(&req).await.unwrap().decision.allowed, "clamped to one an hour");

    let list = rlctl(&["override", "list", "--redis", &url]).await;
    assert_eq!(list.code, 0, "{}", list.err);
    assert!(list.out.contains(&format!("{key_id}: subject \"key_8f3\" (expires in 14m")), "{}", list.out);
    assert!(list.out.contains("reason: INC-4411: retry storm"), "{}", list.out);
    let active = rlctl(&["active", "--redis", &url]).await;
    assert!(active.out.starts_with("version 2 (changed "), "{}", active.out);
    assert!(active.out.contains("pro-v2: plan \"pro\" [shadow]: per_second"), "{}", active.out);

    // Publishing the file again keeps the override.
    let run = rlctl(&["publish", file, "--redis", &url]).await;
    assert!(run.out.contains("as version 3"), "{}", run.out);
    reaches(3).await;
    assert_eq!(gateway.check(&req).await.unwrap().rule.id(), key_id);

    let run = rlctl(&["override", "remove", "--subject", "key_8f3", "--redis", &url]).await;
    assert_eq!(run.code, 0, "{}", run.err);
    assert!(run.out.contains("removed in version 4"), "{}", run.out);
    reaches(4).await;
    assert_eq!(gateway.check(&req).await.unwrap().rule.id(), "pro");
    let again = rlctl(&["override", "remove", "--subject", "key_8f3", "--redis", &url]).await;
    assert_eq!(again.code, 1);
    assert!(again.err.contains("rlctl: no override for subject \"key_8f3\""), "{}", again.err);

    // A network override with --shared: the whole /48 shares its buckets
    // (without it, each /64 of the /48 would get the limit of its own).
    let net = [
        "override",
        "add",
        "--ip",
        "2001:db8:bad::/48",
        "--shared",
        "--limit",
        "s=2/1h",
        "--expires",
        "2h",
        "--reason",
        "INC-4412: scraper",
        "--redis",
        &url,
    ];
    let run = rlctl(&net).await;
    assert_eq!(run.code, 0, "{}", run.err);
    reaches(5).await;
    let list = rlctl(&["override", "list", "--redis", &url]).await;
    let net_id = ip_id("2001:db8:bad::/48");
    assert!(list.out.contains(&format!("{net_id}: ip 2001:db8:bad::/48, shared")), "{}", list.out);
    let from = |ip: &str| {
        let (gateway, ip) = (gateway.clone(), ip.parse().unwrap());
        async move { gateway.check(&Request::new().ip(ip)).await.unwrap() }
    };
    let first = from("2001:db8:bad:1::1").await;
    assert_eq!((first.rule.id(), first.decision.allowed), (net_id.as_str(), true));
    assert!(from("2001:db8:bad:2::1").await.decision.allowed);
    assert!(!from("2001:db8:bad:3::1").await.decision.allowed, "a third /64 of the /48: the shared 2 are spent");
    let run = rlctl(&[
        "override",
        "add",
        "--subject",
        "k",
        "--shared",
        "--limit",
        "s=1/1h",
        "--expires",
        "1h",
        "--reason",
        "r",
        "--redis",
        &url,
    ])
    .await;
    assert_eq!(run.code, 1, "{}", run.out);
    assert!(run.err.contains("--shared is for an --ip override"), "{}", run.err);
}

#[tokio::test]
async fn mistakes_at_3am_are_refused_with_a_reason() {
    let s = Server::start(&[]);
    let url = s.url();
    assert_eq!(rlctl(&["publish", example().to_str().unwrap(), "--redis", &url]).await.code, 0);
    let base = ["override", "add", "--subject", "k", "--redis", &url];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    // No reason, no expiry: the parser refuses (usage error, 2).
    let run = rlctl(&with(&["--limit", "s=1/1s", "--expires", "15m"])).await;
    assert_eq!(run.code, 2);
    assert!(run.err.contains("--reason"), "{}", run.err);
    let run = rlctl(&with(&["--limit", "s=1/1s", "--reason", "r"])).await;
    assert_eq!(run.code, 2);
    assert!(run.err.contains("--expires"), "{}", run.err);
    for (extra, says) in [
        (&["--limit", "s=1/1s", "--reason", "r", "--expires", "40d"][..], "within 30 days"),
        // Past the calendar's end: refused, not a panic (exit 101).
        (&["--limit", "s=1/1s", "--reason", "r", "--expires", "100000y"][..], "within 30 days"),
        (&["--limit", "s=1/1s", "--reason", "r", "--expires", "400000000000y"][..], "within 30 days"),
        (&["--limit", "s=1/1s", "--reason", "r", "--expires", "2099-01-01T00:00:00Z"][..], "within 30 days"),
        (
            &["--limit", "s=1/1s", "--reason", "r", "--expires", "soonish"][..],
            "--expires \"soonish\" is neither a duration",
        ),
        (&["--limit", "s=ten/1s", "--reason", "r", "--expires", "1h"][..], "expected NAME=COUNT/PER"),
        (&["--limit", "s=0/1s", "--reason", "r", "--expires", "1h"][..], "rlctl: override rejected: override 'ovr-k-"),
        (&["--limit", "s=0/1s", "--reason", "r", "--expires", "1h"][..], "limit 's': rate must be from 1"),
    ] {
        let run = rlctl(&with(extra)).await;
        assert_eq!(run.code, 1, "{extra:?}: {}", run.out);
        assert!(run.err.contains(says), "{extra:?}: {}", run.err);
    }
    // A network broader than /16 (IPv4) or /32 (IPv6) outranks every rule
    // for a great many clients: only with --broad.
    let net = |net: &'static str, broad: bool| {
        let url = url.clone();
        async move {
            let mut args = vec!["override", "add", "--ip", net, "--limit", "s=1/1s", "--expires", "1h"];
            args.extend(["--reason", "r", "--redis", &url]);
            if broad {
                args.push("--broad");
            }
            rlctl(&args).await
        }
    };
    for everything in ["0.0.0.0/0", "::/0", "10.0.0.0/8"] {
        let run = net(everything, false).await;
        assert_eq!(run.code, 1, "{everything}: {}", run.out);
        assert!(run.err.contains(&format!("ip {everything} is broader than /")), "{}", run.err);
        assert!(run.err.contains("(rlctl: --broad)"), "{}", run.err);
    }
    let run = net("10.0.0.0/8", true).await;
    assert_eq!(run.code, 0, "{}", run.err);
    assert!(run.out.contains(&format!("override '{}'", ip_id("10.0.0.0/8"))), "{}", run.out);
    // Nothing refused was written: versions 1 (publish) and 2 (the ip override).
    let active = rlctl(&["active", "--redis", &url]).await;
    assert!(active.out.starts_with("version 2 "), "{}", active.out);
    // An unreachable server is an error, not a hang.
    drop(s);
    let run = rlctl(&["active", "--redis", &url]).await;
    assert_eq!(run.code, 1);
    assert!(run.err.starts_with("rlctl: redis: "), "{}", run.err);
}
