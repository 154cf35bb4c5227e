//! rlctl end to end: the built binary against a real server, and a gateway
//! watching what it publishes.

#[path = "../../client/tests/common/mod.rs"]
mod common;
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::config;
use rl_gateway::live::{override_id, LiveRules, MatchSpec, RedisSource, Request, RuleSetSpec};
use rl_gateway::{Backend, Limiter};
use support::{rlctl, Run};
use testkit::Server;

/// `rlctl validate file` refuses it (status 1), naming every one of `faults`.
async fn validate_refuses(file: &str, faults: &[&str]) {
    let run = rlctl(&["validate", file]).await;
    assert_eq!(run.code, 1, "{}", run.out);
    for fault in faults {
        assert!(run.err.contains(fault), "{fault} in: {}", run.err);
    }
}

fn subject_id(subject: &str) -> String {
    override_id(&MatchSpec { subject: Some(subject.to_owned()), ..MatchSpec::default() })
}

fn ip_id(net: &str) -> String {
    override_id(&MatchSpec { ip: Some(net.to_owned()), ..MatchSpec::default() })
}

/// Waits up to 10 s for `version` to be in force on `gateway`.
async fn reached(gateway: &LiveRules, version: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while gateway.snapshot().version() != version {
        assert!(Instant::now() < deadline, "version {version} did not reach the gateway: {:?}", gateway.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rules.example.toml")
}

#[tokio::test]
async fn validate_accepts_the_example_and_names_every_fault() {
    let example = example();
    let ok = rlctl(&["validate", example.to_str().unwrap()]).await;
    assert_eq!(ok.code, 0, "{}", ok.err);
    assert!(
        ok.out.contains("ok, version 0: 9 rules (1 in shadow mode, 0 overrides, 1 with in-flight limits)"),
        "{}",
        ok.out
    );
    assert!(
        ok.out.contains(
            "in flight: rule 'reports' (endpoint \"POST /reports\"): concurrent at most 5 at once, timeout 30s"
        ),
        "{}",
        ok.out
    );
    // The example has a quota and a window: the Lua backend's scripts run them too.
    let lua = rlctl(&["validate", "--lua", example.to_str().unwrap()]).await;
    assert_eq!(lua.code, 0, "{}", lua.err);
    assert!(lua.out.contains("ok, version 0: 9 rules"), "{}", lua.out);

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
    validate_refuses(
        bad.to_str().unwrap(),
        &[
            "rule set rejected: ",
            "rule 'pro': reason is required",
            "rule 'pro' limit 's': per \"soon\" is not a duration",
            "rule 'net': match.ip 10.1.2.3/8 has host bits set: the network is 10.0.0.0/8",
        ],
    )
    .await;
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
    let reaches = |version: u64| reached(&gateway, version);

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

/// `rlctl override add` with the subject or network `what` (`--subject` or
/// `--ip`), a limit, an hour, and `extra` flags.
async fn add(url: &str, flag: &str, what: &str, limit: &str, extra: &[&str]) -> Run {
    let mut args = vec!["override", "add", flag, what, "--limit", limit, "--expires", "1h", "--reason", "r"];
    args.extend(extra);
    args.extend(["--redis", url]);
    rlctl(&args).await
}

async fn hset(url: &str, field: &str, value: &str) {
    let (url, field, value) = (url.to_owned(), field.to_owned(), value.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        let version: u64 = redis::cmd("HINCRBY").arg("rl:rules").arg("version").arg(1).query(&mut con).unwrap();
        let _: () = redis::cmd("HSET").arg("rl:rules").arg(field).arg(value).query(&mut con).unwrap();
        let _: () = redis::cmd("PUBLISH").arg("rl:rules").arg(version).query(&mut con).unwrap();
    })
    .await
    .unwrap();
}

/// The client README's own example, on a fleet of Lua gateways: refused by
/// rlctl (it was published, and every Lua gateway refused that version and
/// every later one until the override expired). One written past rlctl is
/// refused by the gateway, which keeps its set and takes the next valid one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lua_fleet_is_refused_at_publish_what_its_gateways_cannot_run() {
    let s = Server::start(&[]);
    let url = s.url();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lua.toml");
    let base = "backend = \"lua\"\n[[rules]]\nid = \"default\"\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 10, per = \"1s\" }]\n";
    std::fs::write(&file, base).unwrap();
    let file = file.to_str().unwrap().to_owned();
    let run = rlctl(&["publish", &file, "--redis", &url]).await;
    assert_eq!(run.code, 0, "{}", run.err);
    let limiter = Limiter::new(config(url.clone(), Backend::Lua)).unwrap();
    let gateway = LiveRules::new(limiter, &RuleSetSpec::from_file(&file).unwrap()).unwrap();
    let _watcher = gateway.watch_redis(RedisSource::new(url.clone())).unwrap();

    // An exact window above 10,000: the script reads and writes its log whole.
    let big_log = ["--limit", "hourly=20000/1h,exact"];
    let run = add(&url, "--subject", "key_8f3", "per_second=10/1s", &big_log).await;
    assert_eq!(run.code, 1, "{}", run.out);
    assert!(run.err.starts_with("rlctl: override rejected: "), "{}", run.err);
    assert!(run.err.contains("a limit the Lua backend cannot count exactly"), "{}", run.err);
    assert!(run.err.contains("the rule set declares backend = \"lua\""), "{}", run.err);
    // burst x period in ms above 2^52: 2^40 tokens a day.
    let run = add(&url, "--subject", "key_8f3", "big=1/1d,burst=1099511627776", &[]).await;
    assert_eq!(run.code, 1, "{}", run.out);
    assert!(
        run.err
            .contains("limit 'big': limit x period_ms must be at most 2^52 on the Lua scripts: at most 52124995 per"),
        "{}",
        run.err
    );
    let windowed = dir.path().join("windowed.toml");
    std::fs::write(
        &windowed,
        base.replace(
            "{ name = \"s\", rate = 10, per = \"1s\" }",
            "{ name = \"w\", kind = \"exact\", limit = 20000, per = \"1h\" }",
        ),
    )
    .unwrap();
    let run = rlctl(&["publish", windowed.to_str().unwrap(), "--redis", &url]).await;
    assert_eq!(run.code, 1, "{}", run.out);
    assert!(
        run.err.starts_with("rlctl: rule set rejected: rule 'default': a limit the Lua backend cannot"),
        "{}",
        run.err
    );
    assert!(rlctl(&["active", "--redis", &url]).await.out.starts_with("version 1 "), "nothing refused was written");

    // Written past rlctl: the Lua gateway refuses version 2 and keeps 1.
    let quota = r#"{"id":"ovr-bad","match":{"subject":"k"},"limits":[{"name":"d","kind":"exact","limit":20000,"per":"1d"}],"expires":"2999-01-01T00:00:00Z","reason":"r"}"#;
    hset(&url, "override:ovr-bad", quota).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while gateway.status().rejected == 0 {
        assert!(Instant::now() < deadline, "version 2 was not refused: {:?}", gateway.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = gateway.status();
    assert_eq!(status.version, 1);
    assert!(status
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("version 2") && e.contains("cannot count exactly")));
    // rlctl active shows what is in force and names the override at fault.
    let active = rlctl(&["active", "--redis", &url]).await;
    assert_eq!(active.code, 1, "{}", active.out);
    assert!(active.out.contains("default: every request (default): s=10/1s"), "{}", active.out);
    assert!(
        active.out.contains("refused by every gateway") && active.out.contains("override 'ovr-bad': "),
        "{}",
        active.out
    );
    assert!(active.err.contains("1 override(s) make gateways refuse version 2"), "{}", active.err);
    // Removing it makes version 3, which the gateway takes.
    let run = rlctl(&["override", "remove", "--id", "ovr-bad", "--redis", &url]).await;
    assert_eq!(run.code, 0, "{}", run.err);
    let deadline = Instant::now() + Duration::from_secs(10);
    while gateway.snapshot().version() != 3 {
        assert!(Instant::now() < deadline, "version 3 did not arrive: {:?}", gateway.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gateway.status().last_error, None);
}

/// `key:1` and `key 1`, and two subjects sharing their first 60
/// characters, had one id: adding one replaced the other, removing one
/// removed the other. Overrides stored under the old ids are still found.
#[tokio::test]
async fn override_ids_are_exact_per_subject_and_remove_takes_only_its_own() {
    let s = Server::start(&[]);
    let url = s.url();
    assert_eq!(rlctl(&["publish", example().to_str().unwrap(), "--redis", &url]).await.code, 0);
    let list_args = ["override", "list", "--redis", &url];
    let list = || rlctl(&list_args);
    let long = "t".repeat(60);
    let (prod, staging) = (format!("{long}-prod"), format!("{long}-staging"));
    for subject in ["key:1", "key 1", &prod, &staging] {
        let run = add(&url, "--subject", subject, "s=1/1s", &[]).await;
        assert_eq!(run.code, 0, "{subject}: {}", run.err);
    }
    let out = list().await.out;
    for subject in ["key:1", "key 1", &prod, &staging] {
        assert!(out.contains(&format!("{}: subject {subject:?}", subject_id(subject))), "{subject}: {out}");
    }
    for gone in ["key 1", &staging] {
        let run = rlctl(&["override", "remove", "--subject", gone, "--redis", &url]).await;
        assert_eq!(run.code, 0, "{}", run.err);
        assert!(run.out.contains(&subject_id(gone)), "{}", run.out);
    }
    let out = list().await.out;
    assert!(out.contains("subject \"key:1\"") && out.contains(&format!("subject {prod:?}")), "{out}");
    assert!(!out.contains("subject \"key 1\"") && !out.contains(&format!("subject {staging:?}")), "{out}");

    // One network however written: added again, it replaces; removed by either spelling.
    assert_eq!(add(&url, "--ip", "10.1.2.3", "s=1/1s", &[]).await.code, 0);
    let run = add(&url, "--ip", "10.1.2.3/32", "s=2/1s", &[]).await;
    assert_eq!(run.code, 0, "{}", run.err);
    let out = list().await.out;
    assert_eq!(out.matches("ip 10.1.2.3/32").count(), 1, "{out}");
    assert!(out.contains(": s=2/1s;"), "{out}");
    assert_eq!(rlctl(&["override", "remove", "--ip", "10.1.2.3", "--redis", &url]).await.code, 0);
    assert!(!list().await.out.contains("10.1.2.3"));

    // An id given twice for two subjects is refused, not a silent replacement.
    assert_eq!(add(&url, "--subject", "a", "s=1/1s", &["--id", "mine"]).await.code, 0);
    let run = add(&url, "--subject", "b", "s=1/1s", &["--id", "mine"]).await;
    assert_eq!(run.code, 1, "{}", run.out);
    assert!(
        run.err.contains("override rejected: override 'mine': the id is already the override of subject \"a\""),
        "{}",
        run.err
    );

    // Stored by an older rlctl as ovr-legacy_k: listed, replaced by an add
    // for the same subject, removed by its subject.
    let legacy = r#"{"id":"ovr-legacy_k","match":{"subject":"legacy k"},"limits":[{"name":"s","rate":1,"per":"1s"}],"expires":"2999-01-01T00:00:00Z","reason":"old"}"#;
    hset(&url, "override:ovr-legacy_k", legacy).await;
    assert!(list().await.out.contains("ovr-legacy_k: subject \"legacy k\""));
    assert_eq!(add(&url, "--subject", "legacy k", "s=3/1s", &[]).await.code, 0);
    let out = list().await.out;
    assert!(
        !out.contains("ovr-legacy_k:") && out.contains(&format!("{}: subject \"legacy k\"", subject_id("legacy k"))),
        "{out}"
    );
    hset(&url, "override:ovr-legacy_k", &legacy.replace("legacy k", "legacy 2")).await;
    let run = rlctl(&["override", "remove", "--subject", "legacy 2", "--redis", &url]).await;
    assert_eq!(
        (run.code, run.out.trim().starts_with("override 'ovr-legacy_k' removed")),
        (0, true),
        "{} {}",
        run.out,
        run.err
    );
    let run = rlctl(&["override", "remove", "--subject", "legacy 2", "--redis", &url]).await;
    assert_eq!(run.code, 1);
    assert_eq!(run.err.trim(), "rlctl: no override for subject \"legacy 2\"", "not 'rule set rejected'");
}

#[tokio::test]
async fn expired_rules_are_named_not_silently_ok() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    let base = "[[rules]]\nid = \"default\"\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 10, per = \"1s\" }]\n";
    let old = "[[rules]]\nid = \"old\"\nmatch = { plan = \"pro\" }\nexpires = \"2020-01-01T00:00:00Z\"\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 1, per = \"1s\" }]\n";
    std::fs::write(&file, format!("{base}{old}")).unwrap();
    let run = rlctl(&["validate", file.to_str().unwrap()]).await;
    assert_eq!(run.code, 0, "{}", run.err);
    assert!(
        run.out.contains("warning: rule 'old': expired at 2020-01-01T00:00:00Z: it never applies; remove it"),
        "{}",
        run.out
    );
    let new = old.replace("id = \"old\"", "id = \"new\"").replace("expires = \"2020-01-01T00:00:00Z\"\n", "");
    std::fs::write(&file, format!("{base}{old}{new}")).unwrap();
    let run = rlctl(&["validate", file.to_str().unwrap()]).await;
    assert_eq!(run.code, 1, "{}", run.out);
    assert!(run.err.contains("rules 'old' and 'new' both match plan \"pro\" in enforce mode: one rule of each mode per match; 'old' expired at 2020-01-01T00:00:00Z: remove it"), "{}", run.err);
}

#[tokio::test]
async fn sizes_versions_and_broken_overrides_have_stated_bounds() {
    let s = Server::start(&[]);
    let url = s.url();
    let dir = tempfile::tempdir().unwrap();
    // A 5 MB file: refused with its size and the bound, before parsing.
    let big = dir.path().join("big.toml");
    let base = std::fs::read_to_string(example()).unwrap();
    std::fs::write(&big, format!("{base}\n{}", "# padding\n".repeat(500_000))).unwrap();
    let size = std::fs::metadata(&big).unwrap().len();
    for command in [&["validate"][..], &["publish", "--redis", &url][..]] {
        let run = rlctl(&[command, &[big.to_str().unwrap()][..]].concat()).await;
        assert_eq!(run.code, 1, "{command:?}: {}", run.err);
        assert!(
            run.err.contains(&format!("big.toml is {size} bytes: a rule file is at most 1048576 bytes (1 MiB)")),
            "{}",
            run.err
        );
    }
    // A version that would leave no room for later changes.
    let max = dir.path().join("max.toml");
    std::fs::write(&max, format!("version = 9007199254740991\n{base}")).unwrap();
    let run = rlctl(&["publish", max.to_str().unwrap(), "--redis", &url]).await;
    assert_eq!(run.code, 1);
    assert!(run.err.contains("version 9007199254740991 leaves no room for later changes"), "{}", run.err);
    // One override field that does not parse: listed apart, the rest shown.
    assert_eq!(rlctl(&["publish", example().to_str().unwrap(), "--redis", &url]).await.code, 0);
    assert_eq!(add(&url, "--subject", "good", "s=1/1s", &[]).await.code, 0);
    hset(&url, "override:broken", "{not json").await;
    for command in [&["active"][..], &["override", "list"][..]] {
        let run = rlctl(&[command, &["--redis", &url][..]].concat()).await;
        assert_eq!(run.code, 1, "{command:?}");
        assert!(run.out.contains(&format!("{}: subject \"good\"", subject_id("good"))), "{}", run.out);
        assert!(run.out.contains("invalid: field 'override:broken': "), "{}", run.out);
        assert!(run.err.contains("1 stored override(s) are invalid"), "{}", run.err);
    }
    let run = rlctl(&["publish", example().to_str().unwrap(), "--redis", &url]).await;
    assert_eq!(run.code, 1);
    assert!(run.err.starts_with("rlctl: stored overrides rejected: field 'override:broken'"), "{}", run.err);
    assert_eq!(rlctl(&["override", "remove", "--id", "broken", "--redis", &url]).await.code, 0);
    assert_eq!(rlctl(&["active", "--redis", &url]).await.code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_limits_are_validated_published_and_overridden() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, limit: &str| {
        let path = dir.path().join(name);
        let text = format!(
            "backend = \"lua\"\n[[rules]]\nid = \"default\"\nreason = \"r\"\nlimits = [{{ name = \"s\", rate = 100, per = \"1s\" }}, {limit}]\n"
        );
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    // The Lua backend has in-flight limits too (inflight.lua): accepted.
    let good = write("good.toml", r#"{ name = "concurrent", kind = "inflight", limit = 20, timeout = "30s" }"#);
    let run = rlctl(&["validate", "--lua", &good]).await;
    assert_eq!(run.code, 0, "{}", run.err);
    assert!(run.out.contains("concurrent at most 20 at once, timeout 30s"), "{}", run.out);
    // A bad timeout is named in the module's words (rl_core's ParamError).
    let bad = write("bad.toml", r#"{ name = "concurrent", kind = "inflight", limit = 0, timeout = "800d" }"#);
    validate_refuses(
        &bad,
        &[
            "rule set rejected: rule 'default' limit 'concurrent': limit must be from 1 to 100000, got 0",
            "rule 'default' limit 'concurrent': timeout \"800d\": timeout_ms must be from 1 to 63072000000, got 69120000000",
        ],
    )
    .await;

    // An override with an in-flight limit reaches a watching gateway.
    let s = Server::start(&[]);
    let url = s.url();
    let limiter = Limiter::new(config(url.clone(), Backend::Module)).unwrap();
    let gateway = LiveRules::new(limiter, &RuleSetSpec::from_file(example()).unwrap()).unwrap();
    let _watcher = gateway.watch_redis(RedisSource::new(url.clone())).unwrap();
    assert_eq!(rlctl(&["publish", example().to_str().unwrap(), "--redis", &url]).await.code, 0);
    let add = [
        "override",
        "add",
        "--subject",
        "key_8f3",
        "--limit",
        "s=100/1s",
        "--limit",
        "concurrent=2/30s,inflight",
        "--expires",
        "15m",
        "--reason",
        "INC-4413: report storm",
        "--redis",
        &url,
    ];
    let run = rlctl(&add).await;
    assert_eq!(run.code, 0, "{}", run.err);
    reached(&gateway, 2).await;
    let active = rlctl(&["active", "--redis", &url]).await;
    assert!(
        active
            .out
            .contains("reports: endpoint \"POST /reports\": per_minute=60/1m,burst=20, concurrent=5/30s,inflight"),
        "{}",
        active.out
    );
    assert!(active.out.contains("s=100/1s, concurrent=2/30s,inflight; reason: INC-4413"), "{}", active.out);
    let req = Request::new().subject("key_8f3").endpoint("POST /reports");
    let first = gateway.acquire(&req).await.unwrap();
    assert_eq!(first.rule.id(), subject_id("key_8f3"), "the override outranks the reports rule");
    let second = gateway.acquire(&req).await.unwrap();
    let third = gateway.acquire(&req).await.unwrap().permit.unwrap_err();
    assert_eq!((third.limit, third.in_flight), (2, 2));
    assert!(first.permit.unwrap().unwrap().release().await);
    drop(second);
    assert!(gateway.acquire(&req).await.unwrap().permit.unwrap().is_some(), "a released slot is free again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_rules_are_validated_and_shown_with_their_split() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, global: &str| {
        let path = dir.path().join(name);
        let text = format!(
            "[[rules]]\nid = \"api\"\nreason = \"one limit across regions\"\nlimits = [{{ name = \"s\", rate = 100, per = \"1s\" }}]\nglobal = {global}\n"
        );
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let good = write("good.toml", r#"{ regions = ["eu", "us", "ap"], floor = 0.1, weights = [5, 3, 2] }"#);
    let run = rlctl(&["validate", &good]).await;
    assert_eq!(run.code, 0, "{}", run.err);
    assert!(
        run.out
            .contains("global: rule 'api' (every request (default)): eu 50%, us 30%, ap 20% (fixed split), floor 10%"),
        "{}",
        run.out
    );
    let bad = write("bad.toml", r#"{ regions = ["eu", "us"], floor = 0.6, weights = [1] }"#);
    validate_refuses(
        &bad,
        &[
            "rule 'api': global.floor: the fraction each region always keeps is 0 to 1/2 (0.5000) for 2 regions, got 0.6",
            "rule 'api': global.weights: one weight per region: 1 weights for 2 regions",
        ],
    )
    .await;
    let s = Server::start(&[]);
    let url = s.url();
    assert_eq!(rlctl(&["publish", &good, "--redis", &url]).await.code, 0);
    let active = rlctl(&["active", "--redis", &url]).await;
    assert!(
        active.out.contains(
            "api: every request (default): s=100/1s [global: eu 50%, us 30%, ap 20% (fixed split), floor 10%]"
        ),
        "{}",
        active.out
    );
}
