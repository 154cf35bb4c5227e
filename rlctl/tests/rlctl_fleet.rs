//! rlctl for the fleet and its history, against a real server with real
//! gateways watching: `status` (the fleet's spread, a gateway behind),
//! `unlock` (a locked-out subject freed on every gateway), `history`,
//! `diff` and `rollback`, and the override mistakes refused.

#[path = "../../client/tests/common/mod.rs"]
mod common;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use common::config;
use rl_gateway::live::{LiveRules, RedisSource, Request, RuleSetSpec};
use rl_gateway::{Backend, Limiter, Source};
use support::rlctl;
use testkit::Server;

/// `rlctl args... --redis url`, which must succeed; its stdout.
async fn ok(url: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--redis", url]);
    let run = rlctl(&all).await;
    assert_eq!(run.code, 0, "rlctl {args:?}: {}{}", run.out, run.err);
    run.out
}

fn write(dir: &Path, name: &str, toml: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    path.to_str().unwrap().to_owned()
}

fn bucket(rate: u64) -> String {
    format!("[[rules]]\nid = \"default\"\nreason = \"everyone\"\nlimits = [{{ name = \"s\", rate = {rate}, per = \"1s\" }}]\n")
}

fn gateway(s: &Server, backend: Backend, name: &str) -> (LiveRules, rl_gateway::live::Watcher) {
    let limiter = Limiter::new(config(s.url(), backend)).unwrap();
    let rules = LiveRules::new(limiter, &RuleSetSpec::from_toml(&bucket(1)).unwrap()).unwrap();
    let source = RedisSource {
        poll_every: Duration::from_millis(200),
        gateway: Some(name.to_owned()),
        ..RedisSource::new(s.url())
    };
    let watcher = rules.watch_redis(source).unwrap();
    (rules, watcher)
}

async fn reached(gateway: &LiveRules, version: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while gateway.snapshot().version() != version {
        assert!(Instant::now() < deadline, "version {version} did not reach the gateway: {:?}", gateway.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_fleets_spread_and_warns_on_a_gateway_behind() {
    let s = Server::start(&[]);
    let url = s.url();
    let dir = tempfile::tempdir().unwrap();
    let empty = rlctl(&["status", "--redis", &url]).await;
    assert_eq!(empty.code, 0, "{}", empty.err);
    assert!(empty.out.contains("the store holds no rules") && empty.out.contains("gateways: none reporting"));

    ok(&url, &["publish", &write(dir.path(), "a.toml", &bucket(10))]).await;
    let (module, _w1) = gateway(&s, Backend::Module, "gw-module");
    let (lua, _w2) = gateway(&s, Backend::Lua, "gw-lua");
    reached(&module, 1).await;
    reached(&lua, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lineage = module.status().lineage.unwrap();
    let out = ok(&url, &["status"]).await;
    assert!(out.contains(&format!("the store: version 1 of lineage {lineage}")), "{out}");
    assert!(out.contains(&format!("gateways: 2 reporting; version 1 of lineage {lineage}: 2")), "{out}");
    assert!(out.contains("  gw-lua: version 1 of lineage") && out.contains("  gw-module: version 1"), "{out}");

    // A window the Lua gateway cannot count (a billion a day: limit x ms
    // above the 2^52 its script counts exactly in doubles; the module takes
    // it, and the set does not declare the Lua backend): it refuses version
    // 2 and stays on version 1.
    let window = "[[rules]]\nid = \"default\"\nreason = \"everyone\"\n\
                  limits = [{ name = \"m\", kind = \"window\", limit = 1000000000, per = \"1d\" }]\n";
    ok(&url, &["publish", &write(dir.path(), "w.toml", window)]).await;
    reached(&module, 2).await;
    // Past two polls and 2 s: no longer catching up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let run = rlctl(&["status", "--redis", &url]).await;
    assert_eq!(run.code, 1, "{}{}", run.out, run.err);
    assert!(
        run.out.contains(&format!(
            "gateways: 2 reporting; version 2 of lineage {lineage}: 1, version 1 of lineage {lineage}: 1"
        )),
        "{}",
        run.out
    );
    assert!(run.out.contains("  gw-lua: version 1 of lineage") && run.out.contains("[BEHIND]"), "{}", run.out);
    let warning = run.out.lines().find(|l| l.starts_with("warning: gateway gw-lua is behind")).unwrap_or_default();
    assert!(
        warning
            .contains(&format!("it runs version 1 of lineage {lineage}, the store has version 2 of lineage {lineage}"))
            && warning.contains("limit 'm': limit x period_ms must be at most 2^52 on the Lua scripts"),
        "the warning names the versions and the refusal: {}",
        run.out
    );
    assert!(!run.out.contains("gateway gw-module is behind"), "{}", run.out);
    assert!(run.err.contains("1 warning(s) about the fleet"), "{}", run.err);
    assert_eq!(lua.snapshot().version(), 1);
}

/// Waits until `gateway` admits `req` (it forgot the subject's refusal):
/// by Redis, not from memory.
async fn admitted_by_redis(gateway: &LiveRules, req: &Request<'_>, deadline: Instant) {
    loop {
        let v = gateway.check(req).await.unwrap();
        if v.decision.allowed {
            assert_eq!(v.decision.source, Source::Redis, "{v:?}");
            return;
        }
        assert!(Instant::now() < deadline, "still refused after unlock: {v:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 3 a day, as the SRE's check found: past the three, the next token is
/// 8 h away; and a login rule, so that a subject has two keys.
const DAILY: &str = "[[rules]]\nid = \"default\"\nreason = \"everyone\"\n\
                     limits = [{ name = \"daily\", rate = 3, per = \"1d\", burst = 3 }]\n\
                     [[rules]]\nid = \"login\"\nmatch = { endpoint = \"POST /login\" }\nreason = \"logins\"\n\
                     limits = [{ name = \"m\", rate = 5, per = \"1m\" }]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_frees_a_locked_out_subject_on_every_gateway() {
    let s = Server::start(&[]);
    let url = s.url();
    let dir = tempfile::tempdir().unwrap();
    ok(&url, &["publish", &write(dir.path(), "daily.toml", DAILY)]).await;
    let gateways: Vec<_> = ["gw-1", "gw-2"].iter().map(|n| gateway(&s, Backend::Module, n)).collect();
    for (g, _) in &gateways {
        reached(g, 1).await;
    }
    let req = Request::new().subject("key_locked");
    let mut allowed = 0;
    for (g, _) in &gateways {
        for _ in 0..3 {
            allowed += usize::from(g.check(&req).await.unwrap().decision.allowed);
        }
    }
    assert_eq!(allowed, 3, "three a day across the fleet");
    for (g, _) in &gateways {
        // Refused, and remembered: the next refusal needs no Redis call.
        for _ in 0..2 {
            let v = g.check(&req).await.unwrap();
            assert!(!v.decision.allowed, "{v:?}");
        }
    }
    // Another subject's count is not touched.
    assert!(gateways[0].0.check(&Request::new().subject("other")).await.unwrap().decision.allowed);
    let out = ok(&url, &["unlock", "key_locked"]).await;
    assert!(out.starts_with("unlocked \"key_locked\": 1 of its 2 keys held counts and were deleted"), "{out}");
    assert!(out.contains("2 gateway watcher(s) told"), "{out}");
    let mut con = s.con();
    let left: i64 = redis::cmd("EXISTS").arg("rl:default:{key_locked}:daily").query(&mut con).unwrap();
    assert_eq!(left, 0);
    let other: i64 = redis::cmd("EXISTS").arg("rl:default:{other}:daily").query(&mut con).unwrap();
    assert_eq!(other, 1, "only the subject's keys go");
    // Every gateway forgets its refusal: the next request asks Redis and is admitted.
    for (g, _) in &gateways {
        admitted_by_redis(g, &req, Instant::now() + Duration::from_secs(5)).await;
    }
    let nothing = rlctl(&["unlock", "key{x}", "--redis", &url]).await;
    assert_eq!(nothing.code, 1);
    assert!(nothing.err.contains("key{x}"), "a subject no key can hold is named: {}", nothing.err);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_diff_and_rollback_of_rule_sets() {
    let s = Server::start(&[]);
    let url = s.url();
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), "a.toml", &bucket(10));
    let b = write(dir.path(), "b.toml", &format!("{}[[rules]]\nid = \"pro\"\nmatch = {{ plan = \"pro\" }}\nreason = \"pro\"\nlimits = [{{ name = \"s\", rate = 50, per = \"1s\" }}]\n", bucket(20)));
    assert_eq!(ok(&url, &["history"]).await.trim(), "no rule sets in the history");
    ok(&url, &["publish", &a]).await;
    ok(&url, &["publish", &b]).await;
    ok(&url, &["override", "add", "--subject", "k", "--limit", "s=1/1s", "--expires", "1h", "--reason", "INC-1"]).await;
    let (gw, _w) = gateway(&s, Backend::Module, "gw");
    reached(&gw, 3).await;

    let history = ok(&url, &["history"]).await;
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines.len(), 2, "{history}");
    assert!(
        lines[0].starts_with("version 2 of lineage ") && lines[0].ends_with("2 rules (the set in force)"),
        "{history}"
    );
    assert!(lines[1].starts_with("version 1 of lineage ") && lines[1].ends_with(": 1 rules"), "{history}");

    let diff = ok(&url, &["diff", "--from", "1"]).await;
    assert!(diff.starts_with("from version 1 to the set in force:\n"), "{diff}");
    assert!(diff.contains("~ rule 'default': s=10/1s") && diff.contains("s=20/1s"), "{diff}");
    assert!(diff.contains("+ rule 'pro': s=50/1s"), "{diff}");
    let back = ok(&url, &["diff", &a]).await;
    assert!(back.contains(&format!("from the set in force to {a}:")) && back.contains("- rule 'pro'"), "{back}");
    assert_eq!(ok(&url, &["diff", &b]).await.trim(), format!("no change from the set in force to {b}"));

    let out = ok(&url, &["rollback", "1"]).await;
    assert_eq!(out.trim(), "version 1 published again as version 4");
    reached(&gw, 4).await;
    let v = gw.check(&Request::new().subject("u").plan("pro")).await.unwrap();
    assert_eq!((v.rule.id(), v.decision.limit), ("default", 10), "version 1's set is in force again");
    assert!(gw.check(&Request::new().subject("k")).await.unwrap().rule.is_override(), "the override stays");
    assert!(ok(&url, &["history"]).await.starts_with("version 4 of lineage "));
    let missing = rlctl(&["rollback", "3", "--redis", &url]).await;
    assert_eq!(missing.code, 1);
    assert!(missing.err.contains("version 3 is not in the history (kept: 4, 2, 1)"), "{}", missing.err);
    // Bounded: the last ten sets.
    for rate in 30..40 {
        ok(&url, &["publish", &write(dir.path(), "n.toml", &bucket(rate))]).await;
    }
    let history = ok(&url, &["history"]).await;
    assert_eq!(history.lines().count(), 10, "{history}");
    assert!(history.lines().last().unwrap().starts_with("version 5 of"), "{history}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_mistakes_are_refused_and_reasons_cannot_forge_lines() {
    let s = Server::start(&[]);
    let url = s.url();
    let dir = tempfile::tempdir().unwrap();
    ok(&url, &["publish", &write(dir.path(), "a.toml", &bucket(10))]).await;
    let add = |limit: &'static str| {
        let url = url.clone();
        async move {
            rlctl(&[
                "override",
                "add",
                "--subject",
                "k",
                "--limit",
                limit,
                "--expires",
                "1h",
                "--reason",
                "INC-2",
                "--redis",
                &url,
            ])
            .await
        }
    };
    for (limit, fault) in [
        ("s=5/1s,burst=5,burst=7", "burst is given 2 times (5, 7): give it once"),
        ("s=5/1m,window,exact", "2 kinds given (window, exact): a limit has one"),
        ("s=5/1m,window,burst=5", "burst is for a bucket, not window"),
    ] {
        let run = add(limit).await;
        assert_eq!(run.code, 1, "{limit}: {}", run.out);
        assert!(run.err.contains(&format!("--limit {limit:?}: {fault}")), "{limit}: {}", run.err);
    }
    // A bucket, then the same limit name as an exact log on the same keys:
    // its count would answer WRONGTYPE. Then exact to window likewise.
    assert_eq!(add("s=5/1s").await.code, 0);
    let run = add("s=5/1s,exact").await;
    assert_eq!(run.code, 1, "{}", run.out);
    assert!(
        run.err.contains("override rejected") && run.err.contains("changes from bucket to exact on the same keys"),
        "{}",
        run.err
    );
    assert_eq!(add("e=5/1s,exact").await.code, 0, "another name is other keys");
    let run = add("e=5/1s,window").await;
    assert!(run.err.contains("changes from exact to window on the same keys"), "{}", run.err);
    assert_eq!(add("e=5/1s,quota").await.code, 1, "a quota is a window's count, not a log's");

    let forged = "INC-3\n  ovr-admin-0000000000000000: subject \"admin\" (expires in 29days): s=1000000/1s; reason: ok";
    let run = rlctl(&[
        "override",
        "add",
        "--ip",
        "203.0.113.0/24",
        "--limit",
        "s=1/1s",
        "--expires",
        "1h",
        "--reason",
        forged,
        "--redis",
        &url,
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.err);
    let list = ok(&url, &["override", "list"]).await;
    assert!(!list.lines().any(|l| l.starts_with("  ovr-admin")), "a forged line: {list}");
    assert!(list.contains(r#"reason: INC-3\n  ovr-admin-0000000000000000"#), "{list}");
    assert!(ok(&url, &["active"]).await.contains(r"reason: INC-3\n  ovr-admin"), "active shows it escaped too");
}

/// An EXACT window of 20,000: above the module's default max-log-limit (10,000).
const BIG_EXACT: &str = "[[rules]]\nid = \"default\"\nreason = \"everyone\"\n\
                         limits = [{ name = \"e\", kind = \"exact\", limit = 20000, per = \"1m\" }]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_the_server_refuses_are_caught_before_any_request() {
    let s = Server::start(&[]);
    let url = s.url();
    let dir = tempfile::tempdir().unwrap();
    let big = write(dir.path(), "big.toml", BIG_EXACT);
    // The rule format alone accepts it...
    assert_eq!(rlctl(&["validate", &big]).await.code, 0);
    // ...the server does not.
    let run = rlctl(&["validate", &big, "--redis", &url]).await;
    assert_eq!(run.code, 1, "{}", run.out);
    assert!(
        run.err.contains("rule set rejected: the server at redis://127.0.0.1:")
            && run.err.contains("refuses rule 'default' limit 'e': the server refuses it: ")
            && run.err.contains("is 20000, above the EXACT maximum of 10000"),
        "{}",
        run.err
    );
    let inflight = write(
        dir.path(),
        "inflight.toml",
        "[[rules]]\nid = \"default\"\nreason = \"everyone\"\n\
         limits = [{ name = \"s\", rate = 10, per = \"1s\" }, { name = \"c\", kind = \"inflight\", limit = 20000, timeout = \"30s\" }]\n",
    );
    let run = rlctl(&["validate", &inflight, "--redis", &url]).await;
    assert_eq!(run.code, 1, "{}", run.out);
    assert!(run.err.contains("limit 'c'") && run.err.contains("max-inflight-limit"), "{}", run.err);
    let run = rlctl(&["publish", &big, "--redis", &url]).await;
    assert_eq!(run.code, 1, "{}", run.out);
    assert!(run.err.contains("above the EXACT maximum of 10000"), "{}", run.err);
    assert!(ok(&url, &["active"]).await.contains("nothing published"), "nothing was published");
    let unreachable = rlctl(&["validate", &big, "--redis", "redis://127.0.0.1:1/"]).await;
    assert_eq!(unreachable.code, 1);
    assert!(unreachable.err.contains("cannot ask redis://127.0.0.1:1/"), "{}", unreachable.err);

    // Rules on a server that allows it, the limiter on one that does not:
    // the gateway asks its own server and refuses the set, saying why.
    let rules_server = Server::start(&[]);
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("rl.max-log-limit").arg(50000).query(&mut rules_server.con()).unwrap();
    let rules_url = rules_server.url();
    assert_eq!(rlctl(&["validate", &big, "--redis", &rules_url]).await.code, 0, "50,000 allowed there");
    ok(&rules_url, &["publish", &write(dir.path(), "a.toml", &bucket(10))]).await;
    let limiter = Limiter::new(config(url.clone(), Backend::Module)).unwrap();
    let gw = LiveRules::new(limiter, &RuleSetSpec::from_toml(&bucket(1)).unwrap()).unwrap();
    let _w = gw
        .watch_redis(RedisSource { poll_every: Duration::from_millis(200), ..RedisSource::new(rules_url.clone()) })
        .unwrap();
    reached(&gw, 1).await;
    ok(&rules_url, &["publish", &big]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.status().rejected == 0 {
        assert!(Instant::now() < deadline, "version 2 was not refused: {:?}", gw.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let st = gw.status();
    assert_eq!(st.version, 1, "the set in force stays");
    assert!(
        st.last_error.as_deref().is_some_and(|e| e.contains("version 2")
            && e.contains("the limiter's server refuses rule 'default' limit 'e'")
            && e.contains("above the EXACT maximum of 10000")),
        "{st:?}"
    );
    let v = gw.check(&Request::new().subject("u")).await.unwrap();
    assert_eq!((v.version, v.decision.source), (1, Source::Redis), "requests still decided by Redis: {v:?}");
}

/// A gateway started from the store (LiveRules::start) asks its own server
/// about the stored set as the watcher does: a set it refuses is not
/// installed (its requests would all error at Redis and fall back), the
/// bootstrap file is, and the status says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_starting_from_a_set_its_server_refuses_starts_from_its_file() {
    let limiter_server = Server::start(&[]);
    let rules_server = Server::start(&[]);
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("rl.max-log-limit").arg(50000).query(&mut rules_server.con()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    ok(&rules_server.url(), &["publish", &write(dir.path(), "big.toml", BIG_EXACT)]).await;
    let bootstrap = write(dir.path(), "bootstrap.toml", &bucket(1));
    let limiter = Limiter::new(config(limiter_server.url(), Backend::Module)).unwrap();
    let source = RedisSource { poll_every: Duration::from_millis(100), ..RedisSource::new(rules_server.url()) };
    let (gw, _watcher) = LiveRules::start(limiter, &bootstrap, source).await.unwrap();
    let st = gw.status();
    assert_ne!(st.version, 1, "the refused set is not in force: {st:?}");
    assert_eq!(st.rejected, 1, "{st:?}");
    assert!(
        st.last_error.as_deref().is_some_and(|e| e.contains("version 1")
            && e.contains("the limiter's server refuses rule 'default' limit 'e'")
            && e.contains("above the EXACT maximum of 10000")),
        "{st:?}"
    );
    let first = gw.check(&Request::new().subject("u")).await.unwrap();
    assert_eq!(first.decision.source, Source::Redis, "decided by Redis, not by the fallback: {first:?}");
    assert!(first.decision.allowed, "{first:?}");
    let second = gw.check(&Request::new().subject("u")).await.unwrap();
    assert!(!second.decision.allowed, "the file's rate of 1 a second applies: {second:?}");
    // The watcher does not install it later either.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_ne!(gw.status().version, 1, "{:?}", gw.status());
    assert_eq!(gw.status().rejected, 1, "refused once, not again at every poll: {:?}", gw.status());
    // No file to start from: the refused set starts all the same (its other
    // rules apply), and the status says the server refuses it.
    let limiter = Limiter::new(config(limiter_server.url(), Backend::Module)).unwrap();
    let source = RedisSource { poll_every: Duration::from_millis(100), ..RedisSource::new(rules_server.url()) };
    let missing = dir.path().join("missing.toml");
    let (gw, _watcher) = LiveRules::start(limiter, &missing, source).await.unwrap();
    let st = gw.status();
    assert_eq!((st.version, st.rejected), (1, 2), "the file's fault and the refusal: {st:?}");
    assert!(
        st.last_error.as_deref().is_some_and(|e| e.contains("the limiter's server refuses rule 'default' limit 'e'")
            && e.contains("in force all the same")),
        "{st:?}"
    );
}

/// A fleet whose gateways run a rules file and that has published nothing:
/// `rlctl unlock --rules FILE` finds the subject's keys in that file; without
/// it, the error says so. Before (issue 34), unlock failed there with
/// "nothing is published yet: there are no keys to find", and the runbook
/// "A subject is locked out" did not work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_works_on_a_fleet_that_runs_a_rules_file() {
    let s = Server::start(&[]);
    let url = s.url();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "gateway.toml", DAILY);
    let limiter = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let gateway = LiveRules::new(limiter, &RuleSetSpec::from_file(&file).unwrap()).unwrap();
    let source = RedisSource { poll_every: Duration::from_millis(200), ..RedisSource::new(s.url()) };
    let _watcher = gateway.watch_redis(source).unwrap();
    let req = Request::new().subject("key_locked");
    for _ in 0..3 {
        assert!(gateway.check(&req).await.unwrap().decision.allowed);
    }
    assert!(!gateway.check(&req).await.unwrap().decision.allowed, "locked out for the day");

    let run = rlctl(&["unlock", "key_locked", "--redis", &url]).await;
    assert_ne!(run.code, 0, "{}", run.out);
    assert!(run.err.contains("nothing is published") && run.err.contains("--rules FILE"), "{}", run.err);
    let out = ok(&url, &["unlock", "key_locked", "--rules", &file]).await;
    assert!(out.starts_with("unlocked \"key_locked\": 1 of its 2 keys held counts and were deleted"), "{out}");
    let mut con = s.con();
    let left: i64 = redis::cmd("EXISTS").arg("rl:default:{key_locked}:daily").query(&mut con).unwrap();
    assert_eq!(left, 0);
    // The gateway forgets its refusal once its watcher heard (run again
    // while it had not subscribed yet, as the runbook says).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut heard = out.contains("1 gateway watcher(s) told");
    while !heard {
        assert!(Instant::now() < deadline, "no watcher heard the unlock");
        tokio::time::sleep(Duration::from_millis(100)).await;
        heard = ok(&url, &["unlock", "key_locked", "--rules", &file]).await.contains("1 gateway watcher(s) told");
    }
    admitted_by_redis(&gateway, &req, deadline).await;
}

/// docs/security.md's `ACL SETUSER rl-unlock ...` recipe, password replaced.
fn unlock_recipe(password: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md")).unwrap();
    let line = readme.lines().find(|l| l.starts_with("ACL SETUSER rl-unlock ")).expect("the rl-unlock recipe");
    let args = line.split_whitespace().skip(3);
    args.map(|a| if a.starts_with('>') { format!(">{password}") } else { a.to_owned() }).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_runs_as_the_readmes_rl_unlock_user() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    ok(&s.url(), &["publish", &write(dir.path(), "a.toml", &bucket(10))]).await;
    let mut admin = s.con();
    let _: () = redis::cmd("SET").arg("rl:default:{k1}:s").arg("x").query(&mut admin).unwrap();
    // Redis 7.0 has no CLIENT SETINFO (docs/security.md says to leave it out there).
    let info: String = redis::cmd("INFO").arg("server").query(&mut admin).unwrap();
    let seven_oh = info.lines().any(|l| l.starts_with("redis_version:7.0."));
    let recipe: Vec<String> =
        unlock_recipe("pw-unlock").into_iter().filter(|a| !(seven_oh && a == "+client|setinfo")).collect();
    let _: () = redis::cmd("ACL").arg("SETUSER").arg("rl-unlock").arg(recipe).query(&mut admin).unwrap();
    let _: () = redis::cmd("ACL").arg("LOG").arg("RESET").query(&mut admin).unwrap();
    let url = format!("redis://rl-unlock:pw-unlock@127.0.0.1:{}/", s.port);
    let out = ok(&url, &["unlock", "k1"]).await;
    assert!(out.contains("1 of its 1 keys held counts"), "{out}");
    assert!(!out.contains("pw-unlock"), "{out}");
    let log: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query(&mut admin).unwrap();
    assert!(log.is_empty(), "ACL LOG: {log:?}");
    // What it may not do: write the rules.
    let mut user = redis::Client::open(url).unwrap().get_connection().unwrap();
    let e = redis::cmd("HSET").arg("rl:rules").arg("version").arg(9).query::<()>(&mut user).unwrap_err();
    assert!(e.to_string().to_lowercase().contains("noperm"), "{e}");
}
