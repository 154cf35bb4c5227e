//! Live rules against real servers: precedence, atomic swaps under load,
//! override expiry, refused rule sets, publication through Redis to several
//! gateways, shadow rules, refresh failures, file reloads.

mod common;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::config;
use rl_gateway::live::{
    Installed, LiveRules, MatchSpec, RedisSource, Request, RuleSetSpec, RuleSpec, RulesStore, DEFAULT_KEY,
    MAX_WRITTEN_VERSION,
};
use rl_gateway::{Backend, Event, Limiter, Source};
use testkit::Server;

fn spec(toml: &str) -> RuleSetSpec {
    RuleSetSpec::from_toml(toml).unwrap()
}

fn limiter(s: &Server) -> Limiter {
    Limiter::new(config(s.url(), Backend::Module)).unwrap()
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Polls `done` every 20 ms until it holds; fails after `within`.
async fn eventually(within: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// Each rule's burst is distinct, so a decision's `limit` says which rule's
/// buckets Redis counted.
const PRECEDENCE: &str = r#"
    [[rules]]
    id = "default"
    reason = "everyone"
    limits = [{ name = "s", rate = 1, per = "1h", burst = 10 }]

    [[rules]]
    id = "pro"
    match = { plan = "pro" }
    reason = "plan"
    limits = [{ name = "s", rate = 1, per = "1h", burst = 20 }]

    [[rules]]
    id = "search"
    match = { endpoint = "GET /search" }
    reason = "endpoint"
    limits = [{ name = "s", rate = 1, per = "1h", burst = 30 }]

    [[rules]]
    id = "upload"
    match = { endpoint = "POST /upload" }
    reason = "an endpoint beats a plan"
    limits = [{ name = "s", rate = 1, per = "1h", burst = 35 }]

    [[rules]]
    id = "pro-search"
    match = { plan = "pro", endpoint = "GET /search" }
    reason = "plan and endpoint"
    limits = [{ name = "s", rate = 1, per = "1h", burst = 40 }]

    [[rules]]
    id = "net48"
    match = { ip = "2001:db8:aa::/48" }
    reason = "a network"
    limits = [{ name = "s", rate = 1, per = "1h", burst = 50 }]

    [[rules]]
    id = "net56"
    match = { ip = "2001:db8:aa:bb00::/56" }
    reason = "a narrower network"
    limits = [{ name = "s", rate = 1, per = "1h", burst = 60 }]

    [[rules]]
    id = "acme"
    match = { subject = "acme" }
    reason = "a subject's own"
    limits = [{ name = "s", rate = 1, per = "1h", burst = 70 }]

    [[rules]]
    id = "gone"
    match = { plan = "legacy" }
    reason = "expired: never applies"
    expires = "2020-01-01T00:00:00Z"
    limits = [{ name = "s", rate = 1, per = "1h", burst = 99 }]
"#;

fn clamp(id: &str, subject: &str, burst: u64, expires: SystemTime) -> RuleSpec {
    RuleSpec {
        id: id.to_owned(),
        scope: MatchSpec { subject: Some(subject.to_owned()), ..MatchSpec::default() },
        limits: vec![rl_gateway::live::LimitSpec::parse_short(&format!("s=1/1h,burst={burst}")).unwrap()],
        expires: Some(humantime::format_rfc3339_millis(expires).to_string()),
        reason: "INC-1: retry storm".to_owned(),
        ..RuleSpec::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_most_specific_rule_wins() {
    let s = Server::start(&[]);
    let rules = LiveRules::new(limiter(&s), &spec(PRECEDENCE)).unwrap();
    let hour = SystemTime::now() + Duration::from_secs(3600);
    let overrides = [clamp("ovr-acme", "acme", 80, hour)];
    assert_eq!(rules.install(&spec(PRECEDENCE), &overrides, 1, "test").unwrap(), Installed::Now(1));
    let in_net56 = ip("2001:db8:aa:bb12::1");
    let in_net48 = ip("2001:db8:aa:cc00::1");
    let cases: &[(Request, &str, u64)] = &[
        (Request::new().subject("k"), "default", 10),
        (Request::new().subject("k").plan("free"), "default", 10),
        (Request::new().subject("k").plan("legacy"), "default", 10),
        (Request::new().subject("k").plan("pro"), "pro", 20),
        (Request::new().subject("k").endpoint("GET /search"), "search", 30),
        (Request::new().subject("k").plan("pro").endpoint("GET /other"), "pro", 20),
        (Request::new().subject("k").plan("pro").endpoint("POST /upload"), "upload", 35),
        (Request::new().subject("k").plan("pro").endpoint("GET /search"), "pro-search", 40),
        (Request::new().ip(in_net48).plan("pro").endpoint("GET /search"), "net48", 50),
        (Request::new().ip(in_net56).plan("pro"), "net56", 60),
        (Request::new().subject("acme2").ip(in_net56), "net56", 60),
        (Request::new().subject("acme").ip(in_net56).plan("pro").endpoint("GET /search"), "ovr-acme", 80),
    ];
    for (request, rule, limit) in cases {
        let v = rules.check(request).await.unwrap();
        assert_eq!((v.rule.id(), v.decision.limit, v.version), (*rule, *limit, 1), "{request:?}");
        assert_eq!(v.decision.source, Source::Redis);
    }
    // Without its override, acme's own rule applies.
    rules.install(&spec(PRECEDENCE), &[], 2, "test").unwrap();
    let v = rules.check(&Request::new().subject("acme").plan("pro")).await.unwrap();
    assert_eq!((v.rule.id(), v.decision.limit), ("acme", 70));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_client_is_its_64_and_a_shared_rule_is_one_bucket() {
    let s = Server::start(&[]);
    let set = spec(
        r#"
        [[rules]]
        id = "default"
        reason = "one request an hour"
        limits = [{ name = "s", rate = 1, per = "1h" }]

        [[rules]]
        id = "office"
        match = { ip = "198.51.100.0/24" }
        shared = true
        reason = "the whole office shares"
        limits = [{ name = "s", rate = 1, per = "1h", burst = 2 }]
    "#,
    );
    let rules = LiveRules::new(limiter(&s), &set).unwrap();
    let check = |addr: &str| {
        let rules = rules.clone();
        let addr = ip(addr);
        async move { rules.check(&Request::new().ip(addr)).await.unwrap() }
    };
    let first = check("2001:db8:1:2::1").await;
    assert_eq!((first.decision.allowed, first.subject.as_str()), (true, "ip:2001:db8:1:2::/64"));
    // Another address of the same /64 is the same client: refused.
    assert!(!check("2001:db8:1:2:ffff::9").await.decision.allowed);
    // The next /64 is another client.
    assert!(check("2001:db8:1:3::1").await.decision.allowed);
    // IPv4 through a dual-stack socket is IPv4.
    let v4 = check("::ffff:203.0.113.7").await;
    assert_eq!((v4.decision.allowed, v4.subject.as_str()), (true, "ip:203.0.113.7/32"));
    assert!(!check("203.0.113.7").await.decision.allowed);
    // A shared rule: two addresses of the office share its 2 tokens.
    let a = check("198.51.100.1").await;
    assert_eq!((a.rule.id(), a.subject.as_str(), a.decision.allowed), ("office", "*:office", true));
    // Its buckets have a hash tag of their own: shared rules spread over a
    // cluster's shards instead of all landing on the slot of "{*}".
    assert_eq!(a.rule.policy().keys(&a.subject).unwrap(), ["rl:office:{*:office}:s"]);
    assert!(check("198.51.100.2").await.decision.allowed);
    assert!(!check("198.51.100.3").await.decision.allowed);
    // No subject and no address: the caller's mistake, not a decision.
    let e = rules.check(&Request::new().plan("pro")).await.unwrap_err().to_string();
    assert!(e.contains("needs a subject or an IP address"), "{e}");
}

/// Version `v`: its default rule, its limit and its shadow rule all carry
/// `v`. The shadow rule allows one request per subject, then reports.
fn versioned(v: u64) -> RuleSetSpec {
    spec(&format!(
        r#"
        [[rules]]
        id = "d{v}"
        reason = "version {v}"
        limits = [{{ name = "s", rate = 1000000, per = "1s", burst = {burst} }}]

        [[rules]]
        id = "s{v}"
        mode = "shadow"
        reason = "version {v}"
        limits = [{{ name = "s", rate = 1, per = "1h" }}]
    "#,
        burst = 1_000_000 + v
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_never_sees_half_a_rule_set() {
    let s = Server::start(&[]);
    let rules = LiveRules::new(limiter(&s), &versioned(1)).unwrap();
    rules.install(&versioned(1), &[], 1, "test").unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The newest version any request has used: each install waits for it,
    // so requests run across every version whatever the machine's load.
    let used = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (rules, stop, used) = (rules.clone(), stop.clone(), used.clone());
        tasks.push(tokio::spawn(async move {
            let subject = format!("u{t}");
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let v = rules.check(&Request::new().subject(&subject)).await.unwrap();
                let n = v.version;
                assert_eq!(v.rule.id(), format!("d{n}"), "the rule is of the version the request used");
                // Under load a call may time out to the local fallback, which
                // counts the version's burst times the slack (2, one gateway).
                let burst = 1_000_000 + n;
                let limit = if v.decision.source == Source::Fallback { burst * 2 } else { burst };
                assert_eq!(v.decision.limit, limit, "the buckets counted are that version's");
                if let Some(shadow) = &v.shadow {
                    assert_eq!(shadow.rule.id(), format!("s{n}"), "the shadow rule is of the same version");
                }
                assert!(seen.last().is_none_or(|&last| last <= n), "versions only move forward: {seen:?} then {n}");
                used.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
                seen.push(n);
                // A lease spend completes without awaiting anything; let the
                // installer run (a gateway yields on its request I/O).
                tokio::task::yield_now().await;
            }
            seen
        }));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for v in 2..=60 {
        assert_eq!(rules.install(&versioned(v), &[], v, "test").unwrap(), Installed::Now(v));
        while used.load(std::sync::atomic::Ordering::Relaxed) < v && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut versions = std::collections::BTreeSet::new();
    for t in tasks {
        versions.extend(t.await.unwrap());
    }
    assert!(versions.len() >= 30, "requests ran across many versions: {versions:?}");
    // An older version is never installed over a newer one.
    assert_eq!(rules.install(&versioned(5), &[], 5, "test").unwrap(), Installed::NotNewer);
    assert_eq!(rules.snapshot().version(), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_override_stops_applying_by_itself() {
    let s = Server::start(&[]);
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    store.publish(&spec(PRECEDENCE)).await.unwrap();
    let rules = LiveRules::new(limiter(&s), &spec(PRECEDENCE)).unwrap();
    let _watcher = rules.watch_redis(RedisSource::new(s.url())).unwrap();
    // Clamped to one request, for four seconds.
    let until = SystemTime::now() + Duration::from_secs(4);
    let version = store.set_override(&clamp("ovr-k", "k", 1, until)).await.unwrap();
    eventually(Duration::from_secs(10), "the override arrives", || rules.snapshot().version() == version).await;
    let req = Request::new().subject("k");
    let v = rules.check(&req).await.unwrap();
    assert_eq!((v.rule.id(), v.decision.allowed), ("ovr-k", true));
    let v = rules.check(&req).await.unwrap();
    assert_eq!((v.rule.id(), v.decision.allowed), ("ovr-k", false));
    // Nothing is republished: the clock alone ends it.
    while SystemTime::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v = rules.check(&req).await.unwrap();
    assert_eq!((v.rule.id(), v.decision.allowed, v.version), ("default", true, version));
    // An override without an expiry or a reason is refused.
    let mut forever = clamp("ovr-x", "x", 1, until);
    forever.expires = None;
    let e = store.set_override(&forever).await.unwrap_err().to_string();
    assert!(e.contains("override 'ovr-x': an override needs expires"), "{e}");
    let mut unexplained = clamp("ovr-x", "x", 1, SystemTime::now() + Duration::from_secs(60));
    unexplained.reason = " ".to_owned();
    let e = store.set_override(&unexplained).await.unwrap_err().to_string();
    assert!(e.contains("override 'ovr-x': reason is required"), "{e}");
    let too_long = clamp("ovr-x", "x", 1, SystemTime::now() + Duration::from_secs(31 * 86_400));
    assert!(store.set_override(&too_long).await.unwrap_err().to_string().contains("within 30 days"));
    assert_eq!(store.version().await.unwrap(), version, "nothing refused was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_stop_at_2_pow_53_minus_1_without_wrapping_or_rounding() {
    const MAX: u64 = (1 << 53) - 1;
    let s = Server::start(&[]);
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    let at = |v: u64| RuleSetSpec { version: Some(v), ..spec(PRECEDENCE) };
    // Above 2^53 - 1 a version would be rounded by the store's script
    // (2^53 + 1 read as 2^53) and could wrap: refused, nothing written.
    for v in [MAX + 2, u64::MAX] {
        let e = store.publish(&at(v)).await.unwrap_err().to_string();
        assert!(e.contains("largest"), "{v}: {e}");
    }
    assert_eq!(store.version().await.unwrap(), 0);
    // A file naming the largest would freeze every later change: a written
    // version stops at 2^52, and the store counts on from there.
    let e = store.publish(&at(MAX)).await.unwrap_err().to_string();
    assert!(e.contains("leaves no room for later changes"), "{e}");
    assert_eq!(store.publish(&at(MAX_WRITTEN_VERSION)).await.unwrap(), MAX_WRITTEN_VERSION);
    assert_eq!(store.publish(&spec(PRECEDENCE)).await.unwrap(), MAX_WRITTEN_VERSION + 1, "room after it");
    // A store already at the largest (an older rlctl allowed it) is exact.
    let _: () = redis::cmd("HSET").arg(DEFAULT_KEY).arg("version").arg(MAX).query(&mut s.con()).unwrap();
    assert_eq!(store.version().await.unwrap(), MAX);
    // Nothing comes after it: an error, not a panic or a wrap to 0.
    let e = store.publish(&spec(PRECEDENCE)).await.unwrap_err().to_string();
    assert!(e.contains("largest"), "{e}");
    let e = store.set_override(&clamp("ovr-k", "k", 1, SystemTime::now() + Duration::from_secs(60))).await.unwrap_err();
    assert!(e.to_string().contains("largest"), "{e}");
    assert_eq!(store.version().await.unwrap(), MAX, "the store never goes backward");
    // A version written past rlctl is named, not misread.
    let _: () = redis::cmd("HSET").arg(DEFAULT_KEY).arg("version").arg(u64::MAX).query(&mut s.con()).unwrap();
    let e = store.publish(&spec(PRECEDENCE)).await.unwrap_err().to_string();
    assert!(e.contains("field 'version'"), "{e}");
    // A gateway takes the largest version and refuses what is above it.
    let rules = LiveRules::new(limiter(&s), &spec(PRECEDENCE)).unwrap();
    assert!(rules.install(&spec(PRECEDENCE), &[], MAX + 1, "test").is_err());
    assert!(LiveRules::new(limiter(&s), &at(u64::MAX)).is_err());
    assert_eq!(rules.install(&spec(PRECEDENCE), &[], MAX, "test").unwrap(), Installed::Now(MAX));
}

/// A version field that is not a whole number up to 2^53 - 1 (written past
/// rlctl) is named; 2^53 + 1 was read as 2^53 and the next change published
/// as 2^53 + 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_refuses_a_version_field_it_cannot_read_exactly() {
    let s = Server::start(&[]);
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    store.publish(&spec(PRECEDENCE)).await.unwrap();
    for bad in ["9007199254740993", "-1", "1.5", "7x"] {
        let _: () = redis::cmd("HSET").arg(DEFAULT_KEY).arg("version").arg(bad).query(&mut s.con()).unwrap();
        let e = store.publish(&spec(PRECEDENCE)).await.unwrap_err().to_string();
        assert!(e.contains("field 'version'"), "{bad}: {e}");
    }
}

const BAD: &str = r#"
    [[rules]]
    id = "default"
    reason = "everyone"
    limits = [{ name = "s", rate = 0, per = "1s" }]

    [[rules]]
    id = "pro"
    match = { plan = "pro" }
    reason = "plan"
    limits = [{ name = "daily", kind = "quota", rate = 5, per = "1 fortnight" }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rule_set_is_refused_whole_and_the_old_one_stays() {
    let s = Server::start(&[]);
    let rules = LiveRules::new(limiter(&s), &spec(PRECEDENCE)).unwrap();
    let e = rules.install(&spec(BAD), &[], 5, "test").unwrap_err().to_string();
    for fault in [
        "rule 'default' limit 's': rate must be from 1 to 100000000000000, got 0",
        "rule 'pro' limit 'daily': per \"1 fortnight\" is not a duration",
        "rule 'pro' limit 'daily': a quota needs limit",
    ] {
        assert!(e.contains(fault), "{fault} in: {e}");
    }
    let status = rules.status();
    assert_eq!((status.version, status.rejected), (0, 1));
    assert!(status.last_error.as_deref().is_some_and(|t| t.contains("version 5")), "{status:?}");
    assert_eq!(rules.check(&Request::new().subject("k").plan("pro")).await.unwrap().rule.id(), "pro");

    // From Redis: a broken snapshot written past rlctl is refused by every
    // gateway, and the next good one is taken.
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    let good = store.publish(&spec(PRECEDENCE)).await.unwrap();
    let _watcher = rules.watch_redis(RedisSource::new(s.url())).unwrap();
    eventually(Duration::from_secs(10), "the good version", || rules.snapshot().version() == good).await;
    let mut con = s.con();
    let _: () = redis::cmd("HSET")
        .arg(DEFAULT_KEY)
        .arg("rules")
        .arg(spec(BAD).to_json())
        .arg("version")
        .arg(good + 1)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("PUBLISH").arg(DEFAULT_KEY).arg(good + 1).query(&mut con).unwrap();
    eventually(Duration::from_secs(10), "the bad version is refused", || rules.status().rejected == 2).await;
    let status = rules.status();
    assert_eq!(status.version, good);
    assert!(status.last_error.as_deref().is_some_and(|t| t.contains("rule 'default' limit 's': rate")), "{status:?}");
    assert_eq!(rules.check(&Request::new().subject("k")).await.unwrap().version, good);
    let fixed = store.publish(&spec(PRECEDENCE)).await.unwrap();
    assert_eq!(fixed, good + 2);
    eventually(Duration::from_secs(10), "the fixed version", || rules.snapshot().version() == fixed).await;
    assert_eq!(rules.status().last_error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_reaches_every_gateway_within_ten_seconds() {
    let s = Server::start(&[]);
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    let gateways: Vec<LiveRules> = (0..3).map(|_| LiveRules::new(limiter(&s), &versioned(0)).unwrap()).collect();
    let _watchers: Vec<_> = gateways.iter().map(|g| g.watch_redis(RedisSource::new(s.url())).unwrap()).collect();
    // Let the watchers subscribe, so the announcement is what delivers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for round in 1..=3 {
        let version = store.publish(&versioned(round)).await.unwrap();
        assert_eq!(version, round);
        let took = eventually(Duration::from_secs(10), "every gateway has the new version", || {
            gateways.iter().all(|g| g.snapshot().version() == version)
        })
        .await;
        assert!(took < Duration::from_secs(10), "{took:?}");
        for g in &gateways {
            let v = g.check(&Request::new().subject("u")).await.unwrap();
            assert_eq!(v.rule.id(), format!("d{version}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_catches_a_missed_announcement() {
    let s = Server::start(&[]);
    let rules = LiveRules::new(limiter(&s), &versioned(0)).unwrap();
    let source = RedisSource { poll_every: Duration::from_millis(300), ..RedisSource::new(s.url()) };
    let _watcher = rules.watch_redis(source).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Written without PUBLISH: no message will come.
    let _: () = redis::cmd("HSET")
        .arg(DEFAULT_KEY)
        .arg("rules")
        .arg(versioned(7).to_json())
        .arg("version")
        .arg(7)
        .query(&mut s.con())
        .unwrap();
    eventually(Duration::from_secs(5), "the poll finds version 7", || rules.snapshot().version() == 7).await;
    assert!(rules.status().source.contains(&s.url()), "{:?}", rules.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_rules_are_reported_and_never_refuse() {
    let mut s = Server::start(&[]);
    let set = spec(
        r#"
        [[rules]]
        id = "default"
        reason = "everyone"
        limits = [{ name = "s", rate = 100, per = "1h" }]

        [[rules]]
        id = "tight"
        match = { plan = "free" }
        mode = "shadow"
        fail = "closed"
        reason = "proposed: one an hour"
        limits = [{ name = "hourly", rate = 1, per = "1h" }, { name = "daily", kind = "quota", limit = 1, per = "1d" }]
    "#,
    );
    let rules = LiveRules::new(limiter(&s), &set).unwrap();
    let req = Request::new().subject("cheap").plan("free");
    let mut shadowed = 0;
    for i in 0..10 {
        let v = rules.check(&req).await.unwrap();
        assert!(v.decision.allowed, "request {i}: {v:?}");
        assert_eq!(v.rule.id(), "default");
        if let Some(refusal) = &v.shadow {
            assert_eq!((refusal.rule.id(), refusal.limit), ("tight", 0));
            shadowed += 1;
        }
    }
    assert_eq!(shadowed, 9);
    let report = rules.shadow_report();
    assert_eq!(report.len(), 1);
    assert_eq!((report[0].rule.as_str(), report[0].subject.as_str(), report[0].refusals), ("tight", "cheap", 9));
    assert_eq!(rules.limiter().counters().get(Event::ShadowRefused), 9);
    // Another plan is not the shadow rule's.
    assert!(rules.check(&Request::new().subject("p").plan("pro")).await.unwrap().shadow.is_none());
    // Redis down: the shadow rule is fail-closed, and still refuses nothing.
    s.kill();
    for _ in 0..5 {
        let v = rules.check(&req).await.unwrap();
        assert!(v.decision.allowed, "{v:?}");
        assert_eq!(v.decision.source, Source::Fallback);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_cannot_refresh_keeps_its_rules_and_reports_their_age() {
    let limits = Server::start(&[]);
    // Persistent: back from a crash with its rules (one that lost them is
    // reported as such, tests/lineage.rs).
    let mut rules_server = Server::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let store = RulesStore::new(&rules_server.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    let version = store.publish(&versioned(3)).await.unwrap();
    let rules = LiveRules::new(limiter(&limits), &versioned(0)).unwrap();
    let source = RedisSource { poll_every: Duration::from_millis(200), ..RedisSource::new(rules_server.url()) };
    let _watcher = rules.watch_redis(source).unwrap();
    eventually(Duration::from_secs(10), "loaded", || rules.snapshot().version() == version).await;
    eventually(Duration::from_secs(5), "confirmed by a poll", || rules.status().age < Duration::from_millis(400)).await;
    rules_server.kill();
    eventually(Duration::from_secs(10), "the failure is reported", || {
        let s = rules.status();
        s.refresh_failures > 0 && s.last_error.is_some() && s.age > Duration::from_millis(800)
    })
    .await;
    let status = rules.status();
    assert!(status.last_error.as_deref().is_some_and(|e| e.contains("cannot refresh rules")), "{status:?}");
    let v = rules.check(&Request::new().subject("u")).await.unwrap();
    assert_eq!((v.rule.id(), v.version, v.decision.source), ("d3", version, Source::Redis));
    rules_server.restart();
    eventually(Duration::from_secs(10), "fresh again", || {
        let s = rules.status();
        s.age < Duration::from_millis(400) && s.last_error.is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_file_is_reloaded_when_it_changes() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.toml");
    let write = |set: &RuleSetSpec| std::fs::write(&path, toml::to_string(set).unwrap()).unwrap();
    let unversioned = |v| RuleSetSpec { version: None, ..versioned(v) };
    write(&unversioned(1));
    let (size, stamp) = {
        let meta = std::fs::metadata(&path).unwrap();
        (meta.len(), meta.modified().unwrap())
    };
    let rules = LiveRules::new(limiter(&s), &RuleSetSpec::from_file(&path).unwrap()).unwrap();
    let _watcher = rules.watch_file(&path, Duration::from_millis(50)).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The same size, and the modification time put back (a copy that keeps
    // times, a coarse filesystem clock): the contents changed all the same.
    write(&unversioned(2));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(stamp).unwrap();
    eventually(Duration::from_secs(5), "reloaded as the next version", || rules.snapshot().version() == 1).await;
    assert_eq!(rules.check(&Request::new().subject("u")).await.unwrap().rule.id(), "d2");
    std::fs::write(&path, BAD).unwrap();
    eventually(Duration::from_secs(5), "the bad file is refused", || rules.status().rejected == 1).await;
    assert_eq!(rules.check(&Request::new().subject("u")).await.unwrap().rule.id(), "d2");
    // A file without a version names none, so its refusal marks none: the
    // next version from Redis still comes (it was marked, and then skipped).
    // One source at a time: the file's watcher goes first.
    drop(_watcher);
    let _redis = rules.watch_redis(RedisSource::new(s.url())).unwrap();
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    assert_eq!(store.publish(&RuleSetSpec { version: Some(2), ..versioned(3) }).await.unwrap(), 2);
    eventually(Duration::from_secs(10), "version 2 from Redis", || rules.snapshot().version() == 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_with_a_huge_poll_interval_still_follows_the_channel() {
    let s = Server::start(&[]);
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    store.publish(&versioned(1)).await.unwrap();
    let rules = LiveRules::new(limiter(&s), &versioned(0)).unwrap();
    let source = RedisSource { poll_every: Duration::MAX, ..RedisSource::new(s.url()) };
    let _watcher = rules.watch_redis(source).unwrap();
    eventually(Duration::from_secs(10), "the first read", || rules.snapshot().version() == 1).await;
    store.publish(&versioned(2)).await.unwrap();
    eventually(Duration::from_secs(10), "the announced version", || rules.snapshot().version() == 2).await;
}

/// A rule with an in-flight limit on one endpoint; every other request
/// falls to the default rule, which has none.
const INFLIGHT: &str = r#"
    [[rules]]
    id = "default"
    reason = "everyone"
    limits = [{ name = "s", rate = 1000, per = "1s" }]

    [[rules]]
    id = "reports"
    match = { endpoint = "POST /reports" }
    reason = "slow endpoint"
    limits = [
      { name = "s", rate = 1000, per = "1s" },
      { name = "concurrent", kind = "inflight", limit = 5, timeout = "30s" },
    ]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_never_exceed_a_rules_in_flight_limit_together() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let s = Server::start(&[]);
    let gateways: Vec<LiveRules> = (0..3).map(|_| LiveRules::new(limiter(&s), &spec(INFLIGHT)).unwrap()).collect();
    let report = Request::new().subject("acme").endpoint("POST /reports");

    // Another endpoint: its rule has no in-flight limits, nothing to hold.
    let other = gateways[0].acquire(&Request::new().subject("acme").endpoint("GET /")).await.unwrap();
    assert_eq!(other.rule.id(), "default");
    assert!(matches!(other.permit, Ok(None)), "{other:?}");

    // Each holder counts itself in while it holds its permit; the count
    // is kept outside Redis, so it shows what really ran at once.
    let holding = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for worker in 0..24 {
        let rules = gateways[worker % 3].clone();
        let (holding, most, refused) = (holding.clone(), most.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                let admission = rules.acquire(&report).await.unwrap();
                assert_eq!((admission.rule.id(), admission.subject.as_str()), ("reports", "acme"));
                match admission.permit {
                    Ok(Some(permit)) => {
                        assert_eq!((permit.source(), permit.limit()), (Source::Redis, 5));
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        holding.fetch_sub(1, Ordering::SeqCst);
                        assert!(permit.release().await, "the slot was held until released");
                    }
                    Ok(None) => panic!("the reports rule has an in-flight limit"),
                    Err(no) => {
                        assert_eq!((no.source, no.limit, no.in_flight), (Source::Redis, 5, 5));
                        refused.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (most, refused) = (most.load(Ordering::SeqCst), refused.load(Ordering::SeqCst));
    assert!(most <= 5, "{most} in flight at once across three gateways, limit 5");
    assert_eq!(most, 5, "24 workers reach the limit");
    assert!(refused > 0, "24 workers on 5 slots are refused sometimes");
    // Everything was released: all 5 slots are free again.
    let mut held = Vec::new();
    for rules in gateways.iter().cycle().take(5) {
        held.push(rules.acquire(&report).await.unwrap().permit.unwrap().unwrap());
    }
    assert!(gateways[1].acquire(&report).await.unwrap().permit.is_err());
    // Another subject has slots of its own.
    let other = Request::new().subject("globex").endpoint("POST /reports");
    assert!(matches!(gateways[2].acquire(&other).await.unwrap().permit, Ok(Some(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_rule_keeps_its_fallback_slots_across_versions() {
    // Nothing listens: every acquire falls back to this gateway's share,
    // limit x slack (2) / gateways (2) = the limit.
    let url = format!("redis://127.0.0.1:{}/", testkit::free_port());
    let limiter = Limiter::new(rl_gateway::LimiterConfig {
        gateways: 2,
        ..rl_gateway::LimiterConfig::new(config(url, Backend::Module))
    })
    .unwrap();
    let rules = LiveRules::new(limiter, &spec(INFLIGHT)).unwrap();
    let report = Request::new().subject("acme").endpoint("POST /reports");
    let mut held = Vec::new();
    for _ in 0..5 {
        let permit = rules.acquire(&report).await.unwrap().permit.unwrap().unwrap();
        assert_eq!(permit.source(), Source::Fallback);
        held.push(permit);
    }
    let no = rules.acquire(&report).await.unwrap().permit.unwrap_err();
    assert_eq!((no.source, no.limit), (Source::Fallback, 5));
    // The same rule in a new version: the same local slots.
    rules.install(&spec(INFLIGHT), &[], 2, "test").unwrap();
    assert!(rules.acquire(&report).await.unwrap().permit.is_err(), "unchanged: still full");
    // A changed in-flight limit starts on fresh slots.
    rules.install(&spec(&INFLIGHT.replace("limit = 5", "limit = 6")), &[], 3, "test").unwrap();
    let permit = rules.acquire(&report).await.unwrap().permit.unwrap().unwrap();
    assert_eq!((permit.source(), permit.limit()), (Source::Fallback, 6));
    drop(held);
}

/// A global rule over three regions split 5/3/2: 100 an hour worldwide.
const GLOBAL: &str = r#"
    [[rules]]
    id = "api"
    reason = "one limit across regions"
    limits = [{ name = "h", rate = 100, per = "1h" }]
    global = { regions = ["eu", "us", "ap"], weights = [5, 3, 2] }
"#;

/// A region whose share of every global rule is a fixed part, counting
/// what it admitted.
struct FixedShare {
    ppm: u64,
    checked: std::sync::Mutex<Vec<(String, String, u64)>>,
}

impl rl_gateway::global::RegionalShares for FixedShare {
    fn region(&self) -> &str {
        "eu"
    }

    fn regional(
        &self,
        _rule: &str,
        _global: &rl_gateway::global::GlobalSpec,
        _subject: &str,
        limits: &[rl_gateway::global::GlobalLimit],
    ) -> Option<Vec<(u64, u64)>> {
        Some(limits.iter().map(|l| (l.capacity * self.ppm / 1_000_000, l.refill * self.ppm / 1_000_000)).collect())
    }

    fn demanded(&self, rule: &str, subject: &str, cost: u64) {
        self.checked.lock().unwrap().push((rule.to_owned(), subject.to_owned(), cost));
    }
}

async fn allowed(rules: &LiveRules, subject: &str, n: usize) -> usize {
    let mut count = 0;
    for _ in 0..n {
        count += usize::from(rules.check(&Request::new().subject(subject)).await.unwrap().decision.allowed);
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_rule_is_enforced_at_the_regions_share() {
    let s = Server::start(&[]);
    // No region set: the smallest region's fixed split (ap: 20 of 100).
    let unset = LiveRules::new(limiter(&s), &spec(GLOBAL)).unwrap();
    assert_eq!(allowed(&unset, "a", 40).await, 20);
    let rules = LiveRules::new(limiter(&s), &spec(GLOBAL)).unwrap();
    let share = Arc::new(FixedShare { ppm: 700_000, checked: Default::default() });
    rules.set_region_shares(share.clone()).unwrap();
    let e = rules.set_region_shares(share.clone()).unwrap_err().to_string();
    assert!(e.contains("set once"), "{e}");
    assert_eq!(allowed(&rules, "b", 100).await, 70);
    let admitted = share.checked.lock().unwrap().clone();
    assert_eq!(admitted.len(), 100, "every checked request is demand, refused ones too");
    assert!(admitted.iter().all(|(r, s, n)| (r.as_str(), s.as_str(), *n) == ("api", "b", 1)));
    // Same Redis keys as the whole rule: the module took the scaled parameters.
    let key = rules.snapshot().rule("api").unwrap().policy().keys("b").unwrap().remove(0);
    let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut s.con()).unwrap();
    assert!(exists, "{key}");
    let v = rules.check(&Request::new().subject("b")).await.unwrap();
    let policy = v.headers(SystemTime::now())["ratelimit-policy"].to_str().unwrap().to_owned();
    assert!(policy.contains("q=70"), "the headers announce the region's share: {policy}");
    // A share worth less than a token refuses.
    let tiny = LiveRules::new(limiter(&s), &spec(GLOBAL)).unwrap();
    tiny.set_region_shares(Arc::new(FixedShare { ppm: 1_000, checked: Default::default() })).unwrap();
    let v = tiny.check(&Request::new().subject("c")).await.unwrap();
    assert!(!v.decision.allowed && v.decision.retry_after == Some(Duration::from_secs(3600)), "{:?}", v.decision);
}

/// The tower layer's path (`LiveDecide`) enforces a global rule at the
/// region's share, counts what it admitted, and announces the share.
#[cfg(feature = "tower")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_decider_enforces_a_global_rule_at_the_regions_share() {
    use rl_gateway::http::{Decide, Facts};
    let s = Server::start(&[]);
    let rules = LiveRules::new(limiter(&s), &spec(GLOBAL)).unwrap();
    let share = Arc::new(FixedShare { ppm: 700_000, checked: Default::default() });
    rules.set_region_shares(share.clone()).unwrap();
    let decide = rl_gateway::live::LiveDecide::new(rules);
    let facts = Facts { ip: None, key: Some("k".into()), route: "GET /".into(), cost: 1 };
    let mut allowed = 0;
    let mut last = None;
    for _ in 0..100 {
        let checked = decide.decide(facts.clone()).await.unwrap().checked;
        assert_eq!(checked.len(), 1);
        allowed += usize::from(checked[0].decision.unwrap().allowed);
        last = Some(checked[0].clone());
    }
    assert_eq!(allowed, 70, "the region's 70% of 100 an hour");
    assert_eq!(share.checked.lock().unwrap().len(), 100, "checked requests are counted for the balancer");
    let last = last.unwrap();
    let policy: &rl_gateway::Policy = last.policy.policy();
    assert_eq!(policy.rules()[0].capacity(), 70, "headers announce what this region enforces");
    // A share worth less than a token refuses without charging anything.
    let tiny = LiveRules::new(limiter(&s), &spec(GLOBAL)).unwrap();
    tiny.set_region_shares(Arc::new(FixedShare { ppm: 1_000, checked: Default::default() })).unwrap();
    let checked = rl_gateway::live::LiveDecide::new(tiny).decide(facts).await.unwrap().checked;
    assert!(!checked[0].decision.unwrap().allowed, "{:?}", checked[0].decision);
}

/// The tower layer's path (`LiveDecide`) asks a shadow rule in the
/// background: every request is allowed and answered without waiting for
/// it, and its refusals are reported once those calls land.
#[cfg(feature = "tower")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_decider_reports_shadow_refusals_without_refusing() {
    use rl_gateway::http::{Decide, Facts};
    let s = Server::start(&[]);
    // Everyone at `rate`, and a shadow rule of one an hour on the search.
    let shadowed = |rate: &str| {
        spec(&format!(
            r#"
            [[rules]]
            id = "default"
            reason = "everyone"
            limits = [{{ name = "s", rate = {rate}, per = "1s" }}]

            [[rules]]
            id = "tight"
            match = {{ endpoint = "GET /search" }}
            mode = "shadow"
            reason = "proposed: one an hour"
            limits = [{{ name = "hourly", rate = 1, per = "1h" }}]
        "#
        ))
    };
    let rules = LiveRules::new(limiter(&s), &shadowed("100")).unwrap();
    let decide = rl_gateway::live::LiveDecide::new(rules.clone());
    let facts = Facts { ip: None, key: Some("cheap".into()), route: "GET /search".into(), cost: 1 };
    for i in 0..10 {
        let checked = decide.decide(facts.clone()).await.unwrap().checked;
        assert_eq!(checked.len(), 1);
        assert!(checked[0].decision.unwrap().allowed, "request {i}: {:?}", checked[0].decision);
    }
    eventually(Duration::from_secs(5), "nine shadow refusals reported", || {
        rules.shadow_report().first().is_some_and(|e| e.refusals == 9)
    })
    .await;
    let report = rules.shadow_report();
    assert_eq!(report.len(), 1);
    assert_eq!((report[0].rule.as_str(), report[0].subject.as_str()), ("tight", "cheap"));
    assert_eq!(rules.limiter().counters().get(Event::ShadowRefused), 9);
    // Another route is not the shadow rule's: nothing more is reported.
    let other = Facts { route: "GET /other".into(), ..facts.clone() };
    assert!(decide.decide(other).await.unwrap().checked[0].decision.unwrap().allowed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rules.shadow_report()[0].refusals, 9);

    // A busy subject is decided from its lease; with Redis' writes paused,
    // its shadow calls wait out the 1 s timeout, and the answers do not.
    let busy = rl_gateway::live::LiveDecide::new(LiveRules::new(limiter(&s), &shadowed("1000000")).unwrap());
    let hot = Facts { key: Some("hot".into()), ..facts };
    assert!(busy.decide(hot.clone()).await.unwrap().checked[0].decision.unwrap().allowed, "the lease taken");
    let mut con = s.con();
    redis::cmd("CLIENT").arg("PAUSE").arg(3000).arg("WRITE").query::<()>(&mut con).unwrap();
    for i in 0..3 {
        let started = Instant::now();
        let checked = busy.decide(hot.clone()).await.unwrap().checked;
        assert_eq!(checked[0].decision.unwrap().source, rl_gateway::Source::Lease, "request {i}");
        // The old code waited out the 1 s timeout here.
        assert!(started.elapsed() < Duration::from_millis(900), "request {i} waited {:?}", started.elapsed());
    }
    redis::cmd("CLIENT").arg("UNPAUSE").query::<()>(&mut con).unwrap();

    // Room for one shadow check in the background: while it waits on the
    // paused server, the next request asks its own and waits with it.
    let spec = shadowed("1000000");
    let narrow = rl_gateway::live::LiveDecide::new(LiveRules::new(limiter(&s), &spec).unwrap()).shadow_in_flight(1);
    // A subject of its own: its shadow bucket is asked, not remembered full.
    let hot = Facts { key: Some("narrow".into()), ..hot };
    assert!(narrow.decide(hot.clone()).await.unwrap().checked[0].decision.unwrap().allowed, "the lease taken");
    tokio::time::sleep(Duration::from_millis(200)).await;
    redis::cmd("CLIENT").arg("PAUSE").arg(3000).arg("WRITE").query::<()>(&mut con).unwrap();
    let started = Instant::now();
    narrow.decide(hot.clone()).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(900), "the first shadow check went to the background");
    let started = Instant::now();
    narrow.decide(hot.clone()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900), "the second waited: {:?}", started.elapsed());
    redis::cmd("CLIENT").arg("UNPAUSE").query::<()>(&mut con).unwrap();
}

/// A limit that keeps its name but changes what its keys hold (a bucket
/// becoming a window) is refused at publish: the keys in Redis would
/// answer WRONGTYPE to the subject's every request until they expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_a_limit_that_changes_kind_under_its_name_is_refused() {
    let s = Server::start(&[]);
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    let set = |limit: &str| spec(&format!("[[rules]]\nid = \"default\"\nreason = \"everyone\"\nlimits = [{limit}]\n"));
    let v1 = store.publish(&set(r#"{ name = "s", rate = 10, per = "1s" }"#)).await.unwrap();
    let e = store.publish(&set(r#"{ name = "s", kind = "window", limit = 10, per = "1s" }"#)).await.unwrap_err();
    let e = e.to_string();
    assert!(e.contains("rule 'default' limit 's' changes from bucket to window"), "{e}");
    assert!(e.contains("give the limit a new name"), "{e}");
    assert_eq!(store.version().await.unwrap(), v1, "nothing refused was written");
    // A new name, or a window mode that keeps the same count, is fine.
    store.publish(&set(r#"{ name = "s_window", kind = "window", limit = 10, per = "1s" }"#)).await.unwrap();
    store.publish(&set(r#"{ name = "s_window", kind = "quota", limit = 10, per = "1s" }"#)).await.unwrap();
    // Another key prefix means other keys.
    let mut moved = set(r#"{ name = "s_window", kind = "exact", limit = 10, per = "1s" }"#);
    moved.key_prefix = Some("rl2".into());
    store.publish(&moved).await.unwrap();
}
