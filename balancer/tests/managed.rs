//! The balancer on managed Redis (testkit::managed: TLS only, no module,
//! `default` off, `CONFIG`, `KEYS`, `MODULE`... renamed away): two regions,
//! `--redis-backend lua`, `rediss://` as the `rl-balancer` user of
//! docs/security.md, its CA file holding both regions' CAs. A gateway on
//! the Lua backend (as the page's `rl-gateway-lua-global` user) reports its
//! region's traffic; the balancer moves the shares; the other region's
//! gateway enforces its lowered share exactly. `ACL LOG` stays empty in both
//! regions, and the balancer's metrics say each region's backend.

mod binary;

use std::sync::Arc;
use std::time::{Duration, Instant};

use binary::{try_get, Running, FAST};
use rl_gateway::global::{GatewayConfig, GlobalLimit, RegionShares, RegionalShares, WHOLE};
use rl_gateway::live::{LiveRules, Request, RuleSetSpec};
use rl_gateway::{Backend, Config, Limiter, LimiterConfig, Source};
use testkit::managed::{documented_user, Managed};

const PASSWORD: &str = "managed-pw";

/// A global rule of 100 an hour over the two regions (the fixed split: 50
/// each), a floor of 5%: nothing refills within a test.
const RULES: &str = r#"
[[rules]]
id = "api"
reason = "one limit across regions"
limits = [{ name = "h", rate = 100, per = "1h" }]
global = { regions = ["eu", "us"], floor = 0.05 }
"#;

/// A gateway of `region` on `server`, on the Lua backend, as the
/// documented user over TLS: its live rules and its region's shares.
fn gateway(server: &Managed, region: &str) -> (LiveRules, Arc<RegionShares>) {
    let url = server.url_as("rl-gateway-lua-global", PASSWORD);
    let tls = rl_gateway::Tls { ca_file: Some(server.tls().ca.clone()), ..Default::default() };
    // A debug build's TLS handshake on a busy machine: never the fallback.
    let timeout = Duration::from_secs(2);
    let limiter = Limiter::new(LimiterConfig {
        gateways: 1,
        ..LimiterConfig::new(Config {
            backend: Backend::Lua,
            tls: tls.clone(),
            timeout,
            connect_timeout: timeout,
            ..Config::standalone(url.clone())
        })
    })
    .unwrap();
    let rules = LiveRules::new(limiter, &RuleSetSpec::from_toml(RULES).unwrap()).unwrap();
    let shares =
        Arc::new(RegionShares::new(GatewayConfig { tls, timeout, ..GatewayConfig::new(region, url) }).unwrap());
    rules.set_region_shares(shares.clone()).unwrap();
    (rules, shares)
}

/// Requests of `subject` admitted out of `n`, none by the outage fallback
/// (a refusal after the first may come from the deny cache).
async fn admitted(rules: &LiveRules, subject: &str, n: usize) -> usize {
    let mut count = 0;
    for _ in 0..n {
        let v = rules.check(&Request::new().subject(subject)).await.unwrap();
        assert!(!matches!(v.decision.source, Source::Fallback | Source::FailClosed), "{v:?}");
        count += usize::from(v.decision.allowed);
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balancer_moves_shares_that_lua_gateways_enforce_on_managed_redis() {
    let users = [documented_user("rl-balancer", PASSWORD), documented_user("rl-gateway-lua-global", PASSWORD)];
    let users: Vec<&str> = users.iter().map(String::as_str).collect();
    let (eu_server, us_server) = (Managed::start(&users), Managed::start(&users));
    // One CA file for both regions: each test server has its own CA.
    let dir = tempfile::tempdir().unwrap();
    let cas = dir.path().join("cas.pem");
    let pem: String = [&eu_server, &us_server].iter().map(|s| std::fs::read_to_string(&s.tls().ca).unwrap()).collect();
    std::fs::write(&cas, pem).unwrap();
    let rules_file = dir.path().join("rules.toml");
    std::fs::write(&rules_file, RULES).unwrap();

    let (eu, eu_shares) = gateway(&eu_server, "eu");
    let (us, us_shares) = gateway(&us_server, "us");
    let api = RuleSetSpec::from_toml(RULES).unwrap().rules[0].global.clone().unwrap();
    // Before any table: the fixed split, 50 of 100 in each region.
    assert_eq!(us_shares.share("api", &api, "acme").0.share, WHOLE / 2);
    // Traffic in eu only, reported with the next sync.
    assert_eq!(admitted(&eu, "acme", 30).await, 30);
    eu_shares.refresh_now().await.unwrap();

    let metrics = testkit::free_port();
    let mut args: Vec<String> = vec!["--rules".into(), rules_file.display().to_string()];
    for (name, server) in [("eu", &eu_server), ("us", &us_server)] {
        args.extend(["--region".into(), format!("{name}={}", server.url_as("rl-balancer", PASSWORD))]);
    }
    args.extend(FAST.iter().map(|s| s.to_string()));
    // A round's calls over TLS in a debug build on a busy machine: a
    // longer timeout, and the settle and staleness its relations then ask.
    for (flag, value) in [("--timeout", "900ms"), ("--settle", "3s"), ("--stale-after", "10s")] {
        let at = args.iter().position(|a| a == flag).unwrap() + 1;
        args[at] = value.into();
    }
    args.extend(["--redis-backend", "lua", "--tls-ca-file", cas.to_str().unwrap()].map(String::from));
    args.extend(["--metrics".into(), format!("127.0.0.1:{metrics}")]);
    let mut balancer = Running::start(&args);

    // The balancer lowers us's share of acme (lowerings apply at once):
    // us's gateway then admits exactly its share of the 100.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let _ = us_shares.refresh_now().await;
        if us_shares.share("api", &api, "acme").0.share < WHOLE / 2 {
            break;
        }
        assert!(balancer.is_running(), "the balancer exited:\n{}", balancer.log());
        assert!(Instant::now() < deadline, "us's share never lowered:\n{}", binary::tail(&balancer.log()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What the share is worth in requests (the gateways' own arithmetic).
    let hour = GlobalLimit { capacity: 100, refill: 100, period_ms: 3_600_000 };
    let worth = |subject: &str| us_shares.regional("api", &api, subject, &[hour]).map_or(0, |c| c[0].0 as usize);
    let acme = worth("acme");
    assert!((1..50).contains(&acme), "lowered from the fixed split's 50: {acme}");
    assert_eq!(admitted(&us, "acme", 60).await, acme, "us enforces its share of the 100");
    // A subject the balancer does not follow: the table's default.
    let quiet = worth("quiet");
    assert!(quiet >= 1, "{quiet}");
    assert_eq!(admitted(&us, "quiet", 60).await, quiet);

    // Its metrics say what each region runs.
    let page = loop {
        let (_, body) = try_get(metrics, "/metrics").unwrap_or_default();
        if body.contains("rl_balancer_redis_backend") {
            break body;
        }
        assert!(Instant::now() < deadline, "no metrics:\n{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for region in ["eu", "us"] {
        let line = format!("rl_balancer_redis_backend{{region=\"{region}\",backend=\"lua\"}} 1\n");
        assert!(page.contains(&line), "{line} missing:\n{page}");
    }
    assert!(balancer.log().contains("--redis-backend lua"), "{}", balancer.log());
    for server in [&eu_server, &us_server] {
        assert_eq!(server.acl_log(), Vec::<String>::new(), "every call allowed to the documented users");
    }
    assert!(balancer.is_running(), "{}", balancer.log());
}
