//! The gateway side of global limits against real servers with the module:
//! the share table read once per interval, a global rule enforced at the
//! region's share, the stale fallback, the ramp, the usage report, a
//! region's Redis down, and a daily quota fed in batches.

#[path = "../../client/tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::calls;
use rl_balancer::store::{self, DEFAULT_KEY};
use rl_gateway::global::{feed_fixed_windows, RuleShares, Share, ShareTable};
use rl_gateway::global::{GatewayConfig, RegionShares};
use rl_gateway::global::{GlobalLimit, RegionalShares};
use rl_gateway::live::{LiveRules, Request, RuleSetSpec};
use rl_gateway::{Backend, Clock, Config, Limiter, LimiterConfig, ManualClock, Source};
use testkit::{PlainServer, Server};

/// A global rule over three regions split 5/3/2, and a fail-closed one
/// split evenly. 100 an hour: nothing refills during a test.
const RULES: &str = r#"
    [[rules]]
    id = "api"
    reason = "one limit across regions"
    limits = [{ name = "h", rate = 100, per = "1h" }]
    global = { regions = ["eu", "us", "ap"], weights = [5, 3, 2] }

    [[rules]]
    id = "login"
    match = { endpoint = "POST /login" }
    fail = "closed"
    reason = "a security control: refused while Redis is down"
    limits = [{ name = "h", rate = 100, per = "1h" }]
    global = { regions = ["eu", "us", "ap"] }
"#;

fn rules() -> RuleSetSpec {
    RuleSetSpec::from_toml(RULES).unwrap()
}

fn limiter(server: &Server) -> Limiter {
    limiter_with(server.url(), Backend::Module)
}

/// The same gateway's limiter on `url` with `backend`.
fn limiter_with(url: String, backend: Backend) -> Limiter {
    let config = LimiterConfig {
        // One gateway, no slack: the outage fallback admits exactly its share.
        gateways: 1,
        fallback_slack: 1.0,
        ..LimiterConfig::new(Config {
            backend,
            timeout: Duration::from_millis(300),
            connect_timeout: Duration::from_millis(300),
            ..Config::standalone(url)
        })
    };
    Limiter::new(config).unwrap()
}

fn shares(server: &Server, region: &str, clock: Clock) -> Arc<RegionShares> {
    let config = GatewayConfig { clock, ..GatewayConfig::new(region, server.url()) };
    Arc::new(RegionShares::new(config).unwrap())
}

/// A gateway of `region` on `server`: live rules enforcing its shares.
fn gateway(server: &Server, region: &str) -> (LiveRules, Arc<RegionShares>) {
    let rules_in_force = LiveRules::new(limiter(server), &rules()).unwrap();
    let shares = shares(server, region, Clock::System);
    rules_in_force.set_region_shares(shares.clone()).unwrap();
    (rules_in_force, shares)
}

/// A table giving the `api` rule's subject `acme` `share` (raised from
/// `from`), every other subject `default`.
fn table(default: u32, share: u32, from: u32) -> ShareTable {
    let mut rs = RuleShares { default, ..Default::default() };
    rs.subjects.insert("acme".into(), Share { share, from, ramped_ms: 0 });
    let mut t = ShareTable::default();
    t.rules.insert("api".into(), rs);
    t
}

async fn publish(server: &Server, t: &ShareTable) {
    publish_at(&server.url(), t).await
}

async fn publish_at(url: &str, t: &ShareTable) {
    let mut con = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let epoch = 1;
    store::claim(&mut con, DEFAULT_KEY, epoch).await.unwrap();
    store::write(&mut con, DEFAULT_KEY, epoch, t).await.unwrap();
}

/// Requests admitted out of `n` for `subject` at `endpoint` (and how the last was decided).
async fn admitted(rules: &LiveRules, subject: &str, endpoint: &str, n: usize) -> (usize, Source) {
    let mut count = 0;
    let mut source = Source::Redis;
    for _ in 0..n {
        let v = rules.check(&Request::new().subject(subject).endpoint(endpoint)).await.unwrap();
        count += usize::from(v.decision.allowed);
        source = v.decision.source;
    }
    (count, source)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_region_admits_its_share_of_the_global_limit() {
    let (eu_server, us_server) = (Server::start(&[]), Server::start(&[]));
    publish(&eu_server, &table(150_000, 700_000, 700_000)).await;
    publish(&us_server, &table(300_000, 300_000, 300_000)).await;
    let (eu, eu_shares) = gateway(&eu_server, "eu");
    let (us, us_shares) = gateway(&us_server, "us");
    // Before the first read: the fixed split (eu 50 of 100).
    assert_eq!(admitted(&eu, "before", "GET /", 120).await.0, 50);
    eu_shares.refresh_now().await.unwrap();
    us_shares.refresh_now().await.unwrap();
    let (eu_acme, us_acme) = (admitted(&eu, "acme", "GET /", 150).await.0, admitted(&us, "acme", "GET /", 150).await.0);
    assert_eq!((eu_acme, us_acme), (70, 30), "share x limit in each region: 100 worldwide, never more");
    // A subject the balancer does not follow: the table's default.
    assert_eq!(admitted(&eu, "quiet", "GET /", 50).await.0, 15);
    // A rule the table does not know yet: the fixed split (login: a third).
    assert_eq!(admitted(&eu, "acme", "POST /login", 50).await.0, 33);
}

/// Global limits on a Redis without the module: a gateway on rl-client's
/// Lua scripts enforces its region's share as one on the module does
/// (the balancer takes such a region with `--redis-backend lua`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_the_lua_scripts_admits_its_share_without_the_module() {
    let plain = PlainServer::start();
    publish_at(&plain.url(), &table(150_000, 700_000, 700_000)).await;
    let rules_in_force = LiveRules::new(limiter_with(plain.url(), Backend::Lua), &rules()).unwrap();
    let shares = Arc::new(RegionShares::new(GatewayConfig::new("eu", plain.url())).unwrap());
    rules_in_force.set_region_shares(shares.clone()).unwrap();
    assert_eq!(admitted(&rules_in_force, "before", "GET /", 120).await.0, 50, "the fixed split");
    shares.refresh_now().await.unwrap();
    assert_eq!(admitted(&rules_in_force, "acme", "GET /", 150).await.0, 70, "the region's share of 100");
    assert_eq!(admitted(&rules_in_force, "quiet", "GET /", 50).await.0, 15, "the table's default");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_is_read_once_per_interval_never_per_request() {
    let server = Server::start(&[]);
    publish(&server, &table(150_000, 700_000, 700_000)).await;
    let config = GatewayConfig { refresh: Duration::from_millis(200), ..GatewayConfig::new("eu", server.url()) };
    let shares = RegionShares::start(config).unwrap();
    let rules_in_force = LiveRules::new(limiter(&server), &rules()).unwrap();
    rules_in_force.set_region_shares(shares.clone()).unwrap();
    let started = Instant::now();
    let before = calls(&server, "hmget");
    let mut checks = 0;
    while started.elapsed() < Duration::from_millis(1200) {
        rules_in_force.check(&Request::new().subject(&format!("s{}", checks % 50))).await.unwrap();
        checks += 1;
    }
    let elapsed = started.elapsed();
    let reads = calls(&server, "hmget") - before;
    let intervals = (elapsed.as_millis() / 200) as u64;
    assert!(reads >= 2 && reads <= intervals + 1, "{reads} reads in {elapsed:?} for {checks} checks");
    assert!(checks as u64 > 10 * reads, "{checks} checks, {reads} reads");
    assert_eq!(shares.status().version, 1);
    drop(rules_in_force);
    drop(shares);
    // The refresh task stops with the last handle: no more reads.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = calls(&server, "hmget");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(calls(&server, "hmget"), after, "the task stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_balancer_the_last_shares_age_into_the_fixed_split() {
    let server = Server::start(&[]);
    publish(&server, &table(150_000, 900_000, 900_000)).await;
    let clock = ManualClock::new();
    let shares = shares(&server, "eu", Clock::Manual(clock.clone()));
    let api = rules().rules[0].global.clone().unwrap();
    assert!(shares.status().stale && shares.status().age.is_none(), "nothing read yet");
    assert_eq!(shares.share("api", &api, "acme").0.share, 500_000, "never read: the fixed split");
    let elsewhere = self::shares(&server, "sa", Clock::System);
    assert_eq!(
        elsewhere.share("api", &api, "acme").0.share,
        200_000,
        "a region the rule does not name: the smallest part"
    );
    shares.refresh_now().await.unwrap();
    assert_eq!(shares.share("api", &api, "acme").0.share, 900_000);
    // The balancer stops writing; the region's Redis stays up.
    clock.advance(Duration::from_secs(299));
    assert_eq!(shares.share("api", &api, "acme").0.share, 900_000, "kept for 5 minutes");
    assert!(!shares.status().stale);
    clock.advance(Duration::from_secs(1));
    let status = shares.status();
    assert!(status.stale && status.age.unwrap() >= Duration::from_secs(300), "{status:?}");
    assert_eq!(shares.share("api", &api, "acme").0.share, 500_000, "lowered first: min(last, fixed)");
    assert_eq!(shares.share("api", &api, "quiet").0.share, 150_000, "a raise waits for settle");
    clock.advance(Duration::from_secs(10));
    let (quiet, ramp_from) = shares.share("api", &api, "quiet");
    assert_eq!((quiet.share, quiet.from), (500_000, 150_000), "then the fixed split, ramping up");
    assert!(ramp_from < Duration::from_secs(1), "the ramp starts when the fixed split applies: {ramp_from:?}");
    // The balancer writes again: its shares apply at once.
    publish(&server, &table(150_000, 800_000, 800_000)).await;
    shares.refresh_now().await.unwrap();
    assert_eq!(shares.share("api", &api, "acme").0.share, 800_000);
    assert!(!shares.status().stale);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_table_is_warned_about_once_a_minute() {
    let server = Server::start(&[]);
    publish(&server, &table(150_000, 900_000, 900_000)).await;
    // The balancer last wrote two minutes ago (on the region's clock).
    let mut con = server.con();
    let (secs, _): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let _: () = redis::cmd("HSET").arg(DEFAULT_KEY).arg("written_at").arg((secs - 120) * 1000).query(&mut con).unwrap();
    let clock = ManualClock::new();
    let shares = shares(&server, "eu", Clock::Manual(clock.clone()));
    shares.refresh_now().await.unwrap();
    let status = shares.status();
    assert!(status.age.unwrap() >= Duration::from_secs(119) && !status.stale, "{status:?}");
    assert_eq!(status.age_warnings, 1);
    shares.refresh_now().await.unwrap();
    clock.advance(Duration::from_secs(59));
    shares.refresh_now().await.unwrap();
    assert_eq!(shares.status().age_warnings, 1, "at most once a minute");
    clock.advance(Duration::from_secs(1));
    shares.refresh_now().await.unwrap();
    assert_eq!(shares.status().age_warnings, 2);
    // The balancer writes again: no more warnings.
    publish(&server, &table(150_000, 900_000, 900_000)).await;
    clock.advance(Duration::from_secs(61));
    shares.refresh_now().await.unwrap();
    assert!(shares.status().age.unwrap() < Duration::from_secs(5));
    assert_eq!(shares.status().age_warnings, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_share_ramps_instead_of_arriving_full() {
    let server = Server::start(&[]);
    // acme raised from 10% to 90% just now.
    publish(&server, &table(50_000, 900_000, 100_000)).await;
    let clock = ManualClock::new();
    // Kept over the hour the ramp takes here (no balancer writes meanwhile).
    let config = GatewayConfig {
        clock: Clock::Manual(clock.clone()),
        stale_after: Duration::from_secs(7200),
        ..GatewayConfig::new("eu", server.url())
    };
    let shares = Arc::new(RegionShares::new(config).unwrap());
    let rules_in_force = LiveRules::new(limiter(&server), &rules()).unwrap();
    rules_in_force.set_region_shares(shares.clone()).unwrap();
    shares.refresh_now().await.unwrap();
    let api = rules().rules[0].global.clone().unwrap();
    let hour = GlobalLimit { capacity: 100, refill: 100, period_ms: 3_600_000 };
    assert_eq!(shares.regional("api", &api, "acme", &[hour]), Some(vec![(10, 90)]));
    // A fresh key is a full bucket at the capacity named: 10, not 90.
    assert_eq!(admitted(&rules_in_force, "acme", "GET /", 40).await.0, 10);
    // The capacity grows at the region's new refill (90 an hour).
    clock.advance(Duration::from_secs(20 * 60));
    assert_eq!(shares.regional("api", &api, "acme", &[hour]), Some(vec![(40, 90)]));
    clock.advance(Duration::from_secs(40 * 60));
    assert_eq!(shares.regional("api", &api, "acme", &[hour]), Some(vec![(90, 90)]));
    // A raise from nothing refuses until the ramp reaches a token.
    publish(&server, &table(50_000, 900_000, 0)).await;
    shares.refresh_now().await.unwrap();
    assert_eq!(shares.regional("api", &api, "acme", &[hour]), None);
    let v = rules_in_force.check(&Request::new().subject("acme")).await.unwrap();
    assert!(!v.decision.allowed, "a share worth no token yet refuses");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_written_in_the_sync_and_read_back_by_the_balancer() {
    let server = Server::start(&[]);
    publish(&server, &table(150_000, 700_000, 700_000)).await;
    let (eu, shares) = gateway(&server, "eu");
    shares.refresh_now().await.unwrap();
    // The balancer's write moved the table's version with one HINCRBY.
    let written = calls(&server, "hincrby");
    assert_eq!(admitted(&eu, "acme", "GET /", 80).await.0, 70);
    assert_eq!(admitted(&eu, "quiet", "GET /", 3).await.0, 3);
    assert_eq!(admitted(&eu, "acme", "POST /login", 2).await.0, 2);
    assert_eq!(calls(&server, "hincrby"), written, "nothing written per request");
    let (syncs, increments) = (calls(&server, "hmget"), calls(&server, "hincrby"));
    shares.refresh_now().await.unwrap();
    assert_eq!((calls(&server, "hmget") - syncs, calls(&server, "hincrby") - increments), (1, 3));
    let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let mut usage = store::take_usage(&mut con, DEFAULT_KEY).await.unwrap();
    usage.sort();
    let expected = [("api", "acme", 80), ("api", "quiet", 3), ("login", "acme", 2)];
    assert_eq!(usage, expected.map(|(r, s, n)| (r.to_string(), s.to_string(), n)), "demand: refusals count too");
    // Only the busiest are reported.
    let config = GatewayConfig { busiest: 1, ..GatewayConfig::new("eu", server.url()) };
    let one = RegionShares::new(config).unwrap();
    for (subject, n) in [("a", 5), ("b", 9), ("c", 1)] {
        one.demanded("api", subject, n);
    }
    one.refresh_now().await.unwrap();
    assert_eq!(store::take_usage(&mut con, DEFAULT_KEY).await.unwrap(), vec![("api".into(), "b".into(), 9)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regions_redis_down_keeps_the_share_as_the_budget() {
    let mut server = Server::start(&[]);
    publish(&server, &table(150_000, 700_000, 700_000)).await;
    let (eu, shares) = gateway(&server, "eu");
    shares.refresh_now().await.unwrap();
    server.kill();
    assert!(shares.refresh_now().await.is_err());
    let status = shares.status();
    assert_eq!((status.version, status.refresh_failures, status.stale), (1, 1, false), "{status:?}");
    assert!(status.last_error.is_some());
    // Fail-open: the outage fallback, at the region's share (70 of 100).
    let (open, source) = admitted(&eu, "acme", "GET /", 120).await;
    assert_eq!((open, source), (70, Source::Fallback));
    // Fail-closed: refused.
    let (closed, source) = admitted(&eu, "acme", "POST /login", 5).await;
    assert_eq!((closed, source), (0, Source::FailClosed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_quota_is_fed_in_batches() {
    let server = Server::start(&[]);
    let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let counts = rl_gateway::global::UsageCounts::default();
    // Gateways admit locally and count; every few seconds one round trip.
    for _ in 0..600 {
        counts.add("daily", "acme", 1);
    }
    counts.add("daily", "quiet", 3);
    let day = 86_400_000;
    let batch = |rows: Vec<(String, String, u64)>| -> Vec<(String, u64)> {
        rows.into_iter().map(|(_, s, n)| (format!("rl:daily:{{{s}}}:day"), n)).collect()
    };
    let fed = feed_fixed_windows(&mut con, 1000, day, &batch(counts.take_busiest(usize::MAX))).await.unwrap();
    assert_eq!(fed.iter().map(|q| (q.counted, q.remaining)).collect::<Vec<_>>(), vec![(true, 400), (true, 997)]);
    assert!(fed[0].reset_after <= Duration::from_millis(day) && !fed[0].spent());
    assert_eq!(calls(&server, "rl.window"), 2);
    // A batch that would pass the limit is not counted: the quota is spent.
    counts.add("daily", "acme", 500);
    let fed = feed_fixed_windows(&mut con, 1000, day, &batch(counts.take_busiest(usize::MAX))).await.unwrap();
    assert!(!fed[0].counted && fed[0].remaining == 400 && fed[0].spent(), "{fed:?}");
    assert!(feed_fixed_windows(&mut con, 1000, day, &[]).await.unwrap().is_empty());
}

/// A gateway confirms the version it enforces beside each read (and at
/// once on a new one); one whose ACL user may not write the confirmations
/// still reads its table: the refusal is counted, never a failed read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_confirms_its_version_and_a_refused_confirmation_never_fails_the_read() {
    let server = Server::start(&[]);
    publish(&server, &table(150_000, 700_000, 700_000)).await;
    let shares = shares(&server, "eu", Clock::System);
    assert_eq!(shares.refresh_now().await.unwrap(), 1);
    let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let seen = store::confirmations(&mut con, DEFAULT_KEY, Duration::from_secs(60)).await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!((seen[0].gateway.as_str(), seen[0].version), (shares.id(), 1), "version 1 confirmed once read");
    shares.leave().await.unwrap();
    assert!(store::confirmations(&mut con, DEFAULT_KEY, Duration::from_secs(60)).await.unwrap().is_empty());
    // A user with the old recipe: reads the table, cannot confirm.
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "old-gw", "on", ">pw", "resetkeys", "-@all", "+time", "+ping", "+role"])
        .arg("(%R~rl:shares +hmget)")
        .arg("(~rl:shares:usage +hincrby)")
        .query_async(&mut con)
        .await
        .unwrap();
    let url = server.url().replace("redis://", "redis://old-gw:pw@");
    let old = Arc::new(RegionShares::new(GatewayConfig::new("eu", url)).unwrap());
    assert_eq!(old.refresh_now().await.unwrap(), 1, "the read goes on");
    assert_eq!(old.refresh_now().await.unwrap(), 1);
    let status = old.status();
    assert!(status.confirm_failures >= 2 && status.refresh_failures == 0, "{status:?}");
    assert!(store::confirmations(&mut con, DEFAULT_KEY, Duration::from_secs(60)).await.unwrap().is_empty());
}
