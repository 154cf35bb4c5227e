//! The ACL recipes of docs/security.md, one per component, end to end: each
//! user is created on a real server from the page's own line, the component's
//! real calls run as it, and `ACL LOG` must show no refusal.

mod support;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use rl_gateway::global::SHARES_KEY;
use rl_gateway::live::{LiveRules, RedisSource, Request, RuleSetSpec, DEFAULT_KEY};
use rl_gateway::{Config, InflightPolicy, InflightRule, Limiter, Policy, Rule, Source, WindowMode};
use support::{repo_file, Exporter};
use testkit::{Cluster, Server};

const PASSWORD: &str = "acl-test-pw";

/// docs/security.md's `ACL SETUSER` lines, by user: the arguments after the name,
/// a `(selector)` kept as one argument.
fn recipes() -> HashMap<String, Vec<String>> {
    let readme = repo_file("docs/security.md");
    let mut out = HashMap::new();
    for line in readme.lines().filter_map(|l| l.strip_prefix("ACL SETUSER ")) {
        let mut args = Vec::new();
        let mut rest = line.trim();
        while !rest.is_empty() {
            let end = if rest.starts_with('(') {
                rest.find(')').map_or(rest.len(), |i| i + 1)
            } else {
                rest.find(' ').unwrap_or(rest.len())
            };
            args.push(rest[..end].to_owned());
            rest = rest[end..].trim_start();
        }
        let user = args.remove(0);
        out.insert(user, args);
    }
    out
}

fn recipe(user: &str) -> Vec<String> {
    recipes().remove(user).unwrap_or_else(|| panic!("no ACL SETUSER {user} line in docs/security.md"))
}

/// `user`'s recipe for `con`'s server: on Redis 7.0 without
/// `+client|setinfo`, as docs/security.md says.
fn recipe_on(con: &mut redis::Connection, user: &str) -> Vec<String> {
    let info: String = redis::cmd("INFO").arg("server").query(con).unwrap();
    let seven_oh = info.lines().any(|l| l.starts_with("redis_version:7.0."));
    recipe(user).into_iter().filter(|a| !(seven_oh && a == "+client|setinfo")).collect()
}

/// Creates `user` on `con`'s server from `args` (the password replaced).
fn create(con: &mut redis::Connection, user: &str, args: &[String]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(user);
    for a in args {
        cmd.arg(if a.starts_with('>') { format!(">{PASSWORD}") } else { a.clone() });
    }
    let _: () = cmd.query(con).unwrap_or_else(|e| panic!("ACL SETUSER {user} {args:?}: {e}"));
}

fn user_url(s: &Server, user: &str) -> String {
    format!("redis://{user}:{PASSWORD}@127.0.0.1:{}/", s.port)
}

/// What `ACL LOG` holds: one line per refusal.
fn acl_log(con: &mut redis::Connection) -> Vec<String> {
    let entries: Vec<HashMap<String, redis::Value>> = redis::cmd("ACL").arg("LOG").query(con).unwrap();
    let text = |v: Option<&redis::Value>| match v {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(v) => format!("{v:?}"),
        None => String::new(),
    };
    entries
        .iter()
        .map(|e| format!("{} refused {} ({})", text(e.get("username")), text(e.get("object")), text(e.get("reason"))))
        .collect()
}

fn assert_no_refusal(con: &mut redis::Connection, what: &str) {
    let log = acl_log(con);
    assert!(log.is_empty(), "{what}: ACL LOG recorded refusals:\n{}", log.join("\n"));
}

/// The error a user gets for `args`, which must be a refusal.
fn refused(url: &str, args: &[&str]) -> String {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let e = cmd.query::<redis::Value>(&mut con).expect_err(&format!("{args:?} must be refused"));
    assert_eq!(e.code(), Some("NOPERM"), "{args:?}: {e}");
    e.to_string()
}

fn policies() -> (Policy, Policy, InflightPolicy) {
    let bucket = Policy::builder("rl:api").rule(Rule::per_second("per_second", 10)).build().unwrap();
    let windows = Policy::builder("rl:quota")
        .rule(Rule::window("daily", 100, Duration::from_secs(86_400), WindowMode::Fixed))
        .rule(Rule::window("hourly", 20, Duration::from_secs(3_600), WindowMode::Sliding))
        .build()
        .unwrap();
    let inflight = InflightPolicy::builder("rl:reports")
        .rule(InflightRule::new("concurrent", 2, Duration::from_secs(30)))
        .build()
        .unwrap();
    (bucket, windows, inflight)
}

/// What a gateway's limiter sends, as `limiter`'s user: every answer from Redis.
async fn gateway_calls(limiter: &Limiter) {
    let (bucket, windows, inflight) = policies();
    for subject in ["k1", "k2", "k3"] {
        let d = limiter.check(&bucket, subject).await.unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Redis), "{d:?}");
        let d = limiter.check(&windows, subject).await.unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Redis), "{d:?}");
        limiter.refund(&bucket, subject, 1).await.unwrap();
        limiter.settle(&bucket, subject, 2).await.unwrap();
        let permit = limiter.acquire(&inflight, subject).await.unwrap().expect("a permit");
        assert!(permit.release().await, "released");
    }
    let shards = limiter.shards();
    assert!(shards.iter().all(|(_, open)| !open), "no breaker opened: {shards:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_with_live_rules_and_rlctl_run_as_their_users() {
    let s = Server::start(&[]);
    let mut admin = s.con();
    for user in ["rl-gateway", "rl-rules-watcher", "rl-ctl"] {
        let args = recipe_on(&mut admin, user);
        create(&mut admin, user, &args);
    }
    let _: () = redis::cmd("ACL").arg("LOG").arg("RESET").query(&mut admin).unwrap();
    // rlctl publish, active and an override, as rl-ctl.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    std::fs::write(
        &file,
        "[[rules]]\nid = \"default\"\nmatch = {}\nreason = \"everyone\"\nlimits = [{ name = \"s\", rate = 5, per = \"1s\" }]\n",
    )
    .unwrap();
    let rlctl = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_rlctl"))
            .args(args)
            .env("RL_REDIS_URL", user_url(&s, "rl-ctl"))
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "rlctl {args:?}: {text}");
        assert!(!text.contains(PASSWORD), "rlctl {args:?} printed the password: {text}");
        text
    };
    assert!(rlctl(&["publish", file.to_str().unwrap()]).contains("as version 1"));
    // The gateway: its limiter as rl-gateway, its watcher as rl-rules-watcher.
    let limiter = Limiter::new(Config::standalone(user_url(&s, "rl-gateway"))).unwrap();
    gateway_calls(&limiter).await;
    let spec = RuleSetSpec::from_file(file.to_str().unwrap()).unwrap();
    let rules = LiveRules::new(limiter.clone(), &spec).unwrap();
    let source =
        RedisSource { poll_every: Duration::from_millis(200), ..RedisSource::new(user_url(&s, "rl-rules-watcher")) };
    let _watcher = rules.watch_redis(source).unwrap();
    let version =
        rlctl(&["override", "add", "--subject", "k9", "--limit", "s=1/1h", "--expires", "15m", "--reason", "acl test"]);
    assert!(version.contains("in force from version 2"), "{version}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rules.snapshot().version() != 2 {
        assert!(Instant::now() < deadline, "the watcher did not take version 2: {:?}", rules.status());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v = rules.check(&Request::new().subject("k9")).await.unwrap();
    assert!(v.rule.is_override() && v.decision.allowed && v.decision.source == Source::Redis, "{v:?}");
    assert!(!rules.check(&Request::new().subject("k9")).await.unwrap().decision.allowed, "the override holds");
    rlctl(&["active"]);
    rlctl(&["override", "list"]);
    rlctl(&["history"]);
    rlctl(&["override", "remove", "--subject", "k9"]);
    // A gateway of global rules reads its region's share table and adds
    // its usage (rl-balancer's gateway sync: HINCRBY, HMGET, TIME).
    let mut gateway = redis::Client::open(user_url(&s, "rl-gateway")).unwrap().get_connection().unwrap();
    let _: (Vec<Option<String>>, (u64, u64)) = redis::pipe()
        .cmd("HINCRBY")
        .arg(format!("{SHARES_KEY}:usage"))
        .arg("rule|subject")
        .arg(3)
        .ignore()
        .cmd("HMGET")
        .arg(SHARES_KEY)
        .arg(&["version", "epoch", "table", "written_at", "changed_at"])
        .cmd("TIME")
        .query(&mut gateway)
        .unwrap();
    // It confirms the share table version it enforces, and withdraws it on a clean stop.
    let applied = format!("{SHARES_KEY}:applied");
    let _: () = redis::cmd("HSET").arg(&applied).arg("eu-1").arg(3).query(&mut gateway).unwrap();
    let _: () = redis::cmd("HDEL").arg(&applied).arg("eu-1").query(&mut gateway).unwrap();
    let _: String = redis::cmd("PING").query(&mut gateway).unwrap();
    assert_no_refusal(&mut admin, "gateway, rules watcher and rlctl");
    // What each may not do.
    let gw = user_url(&s, "rl-gateway");
    refused(&gw, &["RL.SET", "rl:api:{k1}:per_second", "", "0"]);
    refused(&gw, &["HSET", DEFAULT_KEY, "version", "99"]);
    refused(&gw, &["HSET", SHARES_KEY, "table", "{}"]);
    refused(&gw, &["RL.TAKE", "1", "other:key", "1", "1", "1000"]);
    refused(&gw, &["FLUSHALL"]);
    refused(&user_url(&s, "rl-rules-watcher"), &["HSET", DEFAULT_KEY, "version", "99"]);
    refused(&user_url(&s, "rl-ctl"), &["RL.TAKE", "1", "rl:rules", "1", "1", "1000"]);
    refused(&user_url(&s, "rl-ctl"), &["HSET", SHARES_KEY, "table", "{}"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_gateway_runs_as_its_user() {
    let cluster = Cluster::start(3);
    let args = recipe_on(&mut cluster.nodes[0].con(), "rl-gateway");
    for node in &cluster.nodes {
        create(&mut node.con(), "rl-gateway", &args);
        let _: () = redis::cmd("ACL").arg("LOG").arg("RESET").query(&mut node.con()).unwrap();
    }
    let urls: Vec<String> = cluster.nodes.iter().map(|n| user_url(n, "rl-gateway")).collect();
    let limiter = Limiter::new(Config::cluster(urls)).unwrap();
    gateway_calls(&limiter).await;
    for node in &cluster.nodes {
        assert_no_refusal(&mut node.con(), &format!("cluster gateway, node {}", node.port));
    }
}

#[test]
fn the_exporter_runs_as_its_user_with_exactly_what_it_needs() {
    let s = Server::start(&[]);
    let mut admin = s.con();
    testkit::call(&mut admin, "RL.TAKE", "1 k 1 1 60000");
    let _: () =
        redis::cmd("HSET").arg(SHARES_KEY).arg("written_at").arg(1).arg("version").arg(2).query(&mut admin).unwrap();
    let args = recipe_on(&mut admin, "rl-exporter");
    create(&mut admin, "rl-exporter", &args);
    let _: () = redis::cmd("ACL").arg("LOG").arg("RESET").query(&mut admin).unwrap();
    let exporter = Exporter::start(&user_url(&s, "rl-exporter"));
    let page = exporter.scrape();
    for line in ["rl_up 1", "rl_share_table_version 2", "rl_calls_total{command=\"take\"} 1"] {
        assert!(page.lines().any(|l| l == line), "{line} missing:\n{page}");
    }
    assert!(page.contains("rl_command_latency_seconds{command=\"rl.take\",quantile=\"0.99\"}"), "{page}");
    assert_no_refusal(&mut admin, "the exporter");
    drop(exporter);
    // Each permission is needed: without it the scrape fails and says why,
    // or (CLIENT SETINFO, which redis-rs sends and lets fail) Redis logs
    // a refusal on every connection.
    let needed: Vec<&String> = args.iter().filter(|a| a.starts_with('+') || a.starts_with("%R~")).collect();
    assert!(needed.len() >= 3, "{args:?}");
    for (i, left_out) in needed.iter().enumerate() {
        let user = format!("rl-exporter-{i}");
        let fewer: Vec<String> = args.iter().filter(|a| a != left_out).cloned().collect();
        create(&mut admin, &user, &fewer);
        let exporter = Exporter::start(&user_url(&s, &user));
        let page = exporter.scrape();
        if *left_out == "+client|setinfo" {
            let log = acl_log(&mut admin);
            assert!(log.iter().any(|l| l.starts_with(&format!("{user} refused client|setinfo"))), "{log:?}");
            continue;
        }
        assert!(page.lines().any(|l| l == "rl_up 0"), "without {left_out} the scrape still answered:\n{page}");
        assert!(exporter.log().contains("permission"), "without {left_out}: {}", exporter.log());
    }
}

#[test]
fn the_relay_and_balancer_commands_run_as_their_users() {
    let s = Server::start(&[]);
    let mut admin = s.con();
    for user in ["rl-relay", "rl-balancer"] {
        let args = recipe_on(&mut admin, user);
        create(&mut admin, user, &args);
    }
    let _: () = redis::cmd("ACL").arg("LOG").arg("RESET").query(&mut admin).unwrap();
    // The relay: its own leases, then what gateways send it, forwarded.
    let mut relay = redis::Client::open(user_url(&s, "rl-relay")).unwrap().get_connection().unwrap();
    for (cmd, args) in [
        ("PING", ""),
        ("RL.LEASE", "1 rl:api:{k}:s 100 10 1000 WANT 20 MIN 1"),
        ("RL.TAKE", "1 rl:api:{k}:s 100 10 1000"),
        ("RL.PEEK", "1 rl:api:{k}:s 100 10 1000"),
        ("RL.REFUND", "1 rl:api:{k}:s 100 10 1000 TOKENS 5"),
        ("RL.WINDOW", "1 rl:quota:{k}:daily 100 86400000 FIXED"),
        ("RL.WINDOWPEEK", "1 rl:quota:{k}:daily 100 86400000 FIXED"),
        ("CL.THROTTLE", "rl:cell:{k} 15 30 60"),
        ("RL.ACQUIRE", "1 rl:jobs:{k}:n 2 30000 ID req-1"),
        ("RL.INFLIGHT", "1 rl:jobs:{k}:n 2 30000"),
        ("RL.RELEASE", "1 rl:jobs:{k}:n ID req-1"),
    ] {
        let mut c = redis::cmd(cmd);
        args.split_whitespace().for_each(|a| {
            c.arg(a);
        });
        c.query::<redis::Value>(&mut relay).unwrap_or_else(|e| panic!("{cmd} {args}: {e}"));
    }
    // CLUSTER SLOTS passes the ACL (a standalone server then says so).
    let e = redis::cmd("CLUSTER").arg("SLOTS").query::<redis::Value>(&mut relay).unwrap_err();
    assert_ne!(e.code(), Some("NOPERM"), "{e}");
    // The balancer: its scripts (claim, write, take usage) and its read.
    let mut balancer = redis::Client::open(user_url(&s, "rl-balancer")).unwrap().get_connection().unwrap();
    let claim = redis::Script::new(
        "local e = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0') \
         redis.call('HSET', KEYS[1], 'epoch', ARGV[1]) return e",
    );
    let _: u64 = claim.key(SHARES_KEY).arg(5).invoke(&mut balancer).unwrap();
    // As balancer/src/store.rs's WRITE: the version moved by HINCRBY.
    let write = redis::Script::new(
        "local t = redis.call('TIME') local v = redis.call('HINCRBY', KEYS[1], 'version', 1) \
         redis.call('HSET', KEYS[1], 'table', ARGV[1], 'changed_at', t[1]) \
         redis.call('PUBLISH', KEYS[1], v) redis.call('HSET', KEYS[1], 'written_at', t[1]) return v",
    );
    let _: u64 = write.key(SHARES_KEY).arg("{}").invoke(&mut balancer).unwrap();
    let take = redis::Script::new("local all = redis.call('HGETALL', KEYS[1]) redis.call('DEL', KEYS[1]) return all");
    let _: Vec<String> = take.key(format!("{SHARES_KEY}:usage")).invoke(&mut balancer).unwrap();
    // The gateways' confirmations: read, stamped and the old ones deleted.
    let confirmations = redis::Script::new(
        "local t = redis.call('TIME') local all = redis.call('HGETALL', KEYS[1]) \
         redis.call('HSET', KEYS[1], 'eu-1', '3 ' .. t[1]) redis.call('HDEL', KEYS[1], 'eu-1') return all",
    );
    let _: Vec<String> = confirmations.key(format!("{SHARES_KEY}:applied")).invoke(&mut balancer).unwrap();
    let _: (Vec<Option<String>>, (u64, u64)) = redis::pipe()
        .cmd("HMGET")
        .arg(SHARES_KEY)
        .arg(&["version", "epoch", "table", "written_at", "changed_at"])
        .cmd("TIME")
        .query(&mut balancer)
        .unwrap();
    assert_no_refusal(&mut admin, "relay and balancer");
    let relay_url = user_url(&s, "rl-relay");
    refused(&relay_url, &["FLUSHALL"]);
    refused(&relay_url, &["RL.SET", "rl:api:{k}:s", "", "0"]);
    refused(&relay_url, &["CONFIG", "SET", "maxmemory", "1"]);
    let balancer_url = user_url(&s, "rl-balancer");
    refused(&balancer_url, &["HSET", DEFAULT_KEY, "version", "9"]);
    refused(&balancer_url, &["RL.TAKE", "1", "rl:api:{k}:s", "1", "1", "1000"]);
}
