//! The balancer's loop against three real servers, with compressed times:
//! a stopped balancer's tables age into the fixed split, an unreachable
//! region keeps what it may hold (all of it only with --down) and returns
//! from the floor, and two balancers at once never sum above the whole.
//!
//! "In force" below is what a gateway computes from its region's table:
//! `store::sync` then `ShareTable::in_force` with the same stale times.

use std::time::{Duration, Instant};

use rl_balancer::store::{self, DEFAULT_KEY};
use rl_balancer::{Balancer, Config, GlobalRule, Stopped};
use rl_gateway::global::{SplitParams, WHOLE};
use testkit::Server;

// The shortest the relations allow with rounds every 200 ms and calls
// bounded by 400 ms (rl_balancer::Config::check).
const STALE_AFTER: Duration = Duration::from_secs(3);
const SETTLE: Duration = Duration::from_secs(1);
const FIXED: u32 = 333_333;

fn servers() -> Vec<Server> {
    (0..3).map(|_| Server::start(&[])).collect()
}

fn config(servers: &[Server]) -> Config {
    let rule = GlobalRule {
        id: "api".into(),
        split: SplitParams::new(50_000, vec![1, 1, 1]).unwrap(),
        ramp: Duration::from_secs(1),
    };
    let regions = ["eu", "us", "ap"].iter().zip(servers).map(|(n, s)| (n.to_string(), s.url())).collect();
    let mut c = Config::new(regions, vec![rule]);
    c.interval = Duration::from_millis(200);
    c.gateway_refresh = Duration::from_millis(50);
    c.gateway_timeout = Duration::from_millis(100);
    c.stale_after = STALE_AFTER;
    c.settle = SETTLE;
    c.grace = Duration::from_millis(600);
    c.timeout = Duration::from_millis(400);
    c
}

async fn con(url: &str) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    tokio::time::timeout(Duration::from_millis(300), client.get_multiplexed_async_connection()).await.ok()?.ok()
}

/// A region's gateways report `per_region[r]` admissions of `subject`.
async fn traffic(servers: &[Server], subject: &str, per_region: [u64; 3]) {
    for (s, n) in servers.iter().zip(per_region) {
        if let Some(mut c) = con(&s.url()).await {
            store::sync(&mut c, DEFAULT_KEY, &[("api", subject, n)]).await.unwrap();
        }
    }
}

/// The share of `subject` a gateway of each region enforces now (`None`:
/// the region does not answer).
async fn in_force(servers: &[Server], subject: &str) -> Vec<Option<u32>> {
    let mut out = Vec::new();
    for s in servers {
        let share = match con(&s.url()).await {
            None => None,
            Some(mut c) => match store::sync(&mut c, DEFAULT_KEY, &[]).await {
                Ok(read) => {
                    let ages = (read.age, read.since_change);
                    Some(read.table.in_force("api", subject, FIXED, ages, STALE_AFTER, SETTLE).0.share)
                }
                Err(_) => None,
            },
        };
        out.push(share);
    }
    out
}

fn sum(shares: &[Option<u32>]) -> u32 {
    shares.iter().flatten().sum()
}

async fn rounds(b: &mut Balancer, servers: &[Server], split: [u64; 3], n: usize) {
    for _ in 0..n {
        traffic(servers, "acme", split).await;
        b.round().await.expect("not fenced");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_balancer_leaves_the_last_shares_then_the_fixed_split() {
    let servers = servers();
    let mut b = Balancer::new(config(&servers)).unwrap();
    rounds(&mut b, &servers, [700, 200, 100], 3).await;
    let followed = in_force(&servers, "acme").await;
    assert!(followed[0].unwrap() > 600_000 && sum(&followed) <= WHOLE, "{followed:?}");
    assert_eq!(in_force(&servers, "quiet").await, vec![Some(FIXED); 3], "quiet subjects keep the default split");
    drop(b);
    let stopped = Instant::now();
    tokio::time::sleep(STALE_AFTER / 2).await;
    assert_eq!(in_force(&servers, "acme").await, followed, "the last shares stay in force for stale_after");
    // Through the fallback: never above the whole, then the fixed split.
    while stopped.elapsed() < STALE_AFTER + SETTLE + Duration::from_millis(300) {
        let now = in_force(&servers, "acme").await;
        assert!(sum(&now) <= WHOLE, "{now:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(in_force(&servers, "acme").await, vec![Some(FIXED); 3]);
    // A balancer again: its first lowering is bounded by the fixed split
    // the gateways fell back to, and the shares follow the traffic again.
    let mut b = Balancer::new(config(&servers)).unwrap();
    traffic(&servers, "acme", [100, 100, 800]).await;
    let first = b.round().await.unwrap();
    assert!(first.raised, "{first:?}");
    for t in first.tables.iter().flatten() {
        assert!(t.rules["api"].subjects.get("acme").is_none_or(|s| s.from <= FIXED), "{t:?}");
    }
    rounds(&mut b, &servers, [100, 100, 800], 1).await;
    let back = in_force(&servers, "acme").await;
    assert!(back[2].unwrap() > 700_000 && sum(&back) <= WHOLE, "{back:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_region_keeps_what_it_may_hold_and_returns_from_the_floor() {
    let mut servers = servers();
    let mut b = Balancer::new(config(&servers)).unwrap();
    rounds(&mut b, &servers, [200, 200, 600], 3).await;
    let before = in_force(&servers, "acme").await;
    assert!(before[2].unwrap() > 500_000, "{before:?}");
    servers[2].kill();
    let killed = Instant::now();
    // Within the grace nothing moves.
    traffic(&servers, "acme", [500, 500, 0]).await;
    let r = b.round().await.unwrap();
    assert!(r.held.as_deref().unwrap_or("").contains("ap unreachable"), "{r:?}");
    assert_eq!(in_force(&servers, "acme").await[..2], before[..2]);
    tokio::time::sleep(Duration::from_millis(600).saturating_sub(killed.elapsed())).await;
    // After the grace: the others share only what ap cannot be holding (its
    // last share, since its gateways may still enforce it).
    rounds(&mut b, &servers, [500, 500, 0], 2).await;
    let auto = in_force(&servers, "acme").await;
    assert_eq!(auto[2], None);
    assert!(sum(&auto) + before[2].unwrap() <= WHOLE, "{auto:?} + ap's {before:?}");
    assert!(sum(&auto) + before[2].unwrap() >= WHOLE - 1000, "the rest is used: {auto:?}");
    // Once ap's gateways must have fallen back: they may hold the fixed split.
    tokio::time::sleep(STALE_AFTER + SETTLE + Duration::from_millis(500)).await;
    rounds(&mut b, &servers, [500, 500, 0], 2).await;
    let aged = in_force(&servers, "acme").await;
    assert!(sum(&aged) + FIXED <= WHOLE && sum(&aged) + FIXED >= WHOLE - 1000, "{aged:?}");
    // The operator asserts ap is down: a new balancer (a higher epoch: the
    // old one is fenced off) gives the others the whole.
    let mut c = config(&servers);
    c.down.insert("ap".into());
    let mut down = Balancer::new(c).unwrap();
    rounds(&mut down, &servers, [500, 500, 0], 2).await;
    assert!(matches!(b.round().await, Err(Stopped::Fenced(_))), "the old balancer is fenced off");
    let all = in_force(&servers, "acme").await;
    assert!(sum(&all) >= WHOLE - 1000 && sum(&all) <= WHOLE, "{all:?}");
    // ap comes back (empty: its Redis lost the table): 0 first, then the floor.
    servers[2].restart();
    traffic(&servers, "acme", [500, 500, 0]).await;
    let r = down.round().await.unwrap();
    assert_eq!(r.tables[2].as_ref().unwrap().lookup("api", "acme").unwrap().share, 0, "{r:?}");
    rounds(&mut down, &servers, [500, 500, 0], 1).await;
    let back = in_force(&servers, "acme").await;
    assert_eq!(back[2], Some(50_000), "from the floor: {back:?}");
    assert!(sum(&back) <= WHOLE, "{back:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_balancers_at_once_never_sum_above_the_whole() {
    let servers = servers();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let first = Balancer::new(config(&servers)).unwrap();
    let mut second = Some(Balancer::new(config(&servers)).unwrap());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopper = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let a = tokio::spawn(first.run(stopper(stop_rx.clone())));
    // The traffic moves between regions every 300 ms, so every round moves shares.
    let feeder = tokio::spawn(async move {
        let splits = [[800, 100, 100], [100, 800, 100], [100, 100, 800]];
        for i in 0.. {
            for (url, n) in urls.iter().zip(splits[i % 3]) {
                if let Some(mut c) = con(url).await {
                    let _ = store::sync(&mut c, DEFAULT_KEY, &[("api", "acme", n)]).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let started = Instant::now();
    let mut b = None;
    let (mut samples, mut highest) = (0, 0);
    while started.elapsed() < Duration::from_secs(5) {
        if started.elapsed() > Duration::from_millis(1200) {
            if let Some(second) = second.take() {
                b = Some(tokio::spawn(second.run(stopper(stop_rx.clone()))));
            }
        }
        let now = in_force(&servers, "acme").await;
        assert!(sum(&now) <= WHOLE, "two balancers pushed the sum above the whole: {now:?}");
        highest = highest.max(now[0].unwrap().max(now[1].unwrap()).max(now[2].unwrap()));
        samples += 1;
    }
    feeder.abort();
    let older = tokio::time::timeout(Duration::from_secs(2), a).await.expect("the older one stopped").unwrap();
    assert!(matches!(older, Err(Stopped::Fenced(_))), "{older:?}");
    stop_tx.send(true).unwrap();
    let newer = b.unwrap().await.unwrap();
    assert!(newer.is_ok(), "the newer one ran until stopped: {newer:?}");
    assert!(samples > 100 && highest > 600_000, "shares moved ({highest}) in {samples} samples");
}

fn rules_toml(rate: u64, burst: u64) -> String {
    format!(
        "[[rules]]\nid = \"api\"\nreason = \"test\"\nlimits = [{{ name = \"s\", rate = {rate}, per = \"1s\", burst = {burst} }}]\nglobal = {{ regions = [\"eu\", \"us\", \"ap\"], floor = 0.05 }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_balances_from_a_rules_file_and_stops_when_fenced_off() {
    use std::process::{Command, Stdio};
    let servers = servers();
    let path = std::env::temp_dir().join(format!("rl-balancer-test-{}-{}.toml", std::process::id(), servers[0].port));
    std::fs::write(&path, rules_toml(100, 100)).unwrap();
    let bin = env!("CARGO_BIN_EXE_rl-balancer");
    let region = |i: usize, name: &str| format!("{name}={}", servers[i].url());
    // Bad input: the reason, status 2.
    let out = Command::new(bin).args(["--rules", "/nonexistent.toml", "--region", &region(0, "eu")]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rules /nonexistent.toml"), "{out:?}");
    let out = Command::new(bin)
        .arg("--rules")
        .arg(&path)
        .args(["--region", &region(1, "us"), "--region", &region(0, "eu"), "--region", &region(2, "ap")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --region in the rule's order"), "{out:?}");
    let out = Command::new(bin)
        .arg("--rules")
        .arg(&path)
        .args(["--region", &region(0, "eu"), "--region", &region(1, "eu"), "--region", &region(2, "ap")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--region eu: named twice"), "{out:?}");
    // A running one follows the traffic...
    let mut child = Command::new(bin)
        .arg("--rules")
        .arg(&path)
        .args(["--region", &region(0, "eu"), "--region", &region(1, "us"), "--region", &region(2, "ap")])
        .args(["--interval", "200ms", "--gateway-refresh", "50ms", "--gateway-timeout", "100ms"])
        .args(["--stale-after", "3s", "--settle", "1s", "--timeout", "400ms"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while in_force(&servers, "acme").await[0].unwrap() < 600_000 {
        assert!(started.elapsed() < Duration::from_secs(10), "the binary does not follow the traffic");
        traffic(&servers, "acme", [800, 100, 100]).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...until a newer balancer claims the regions: it stops with status 3.
    let mut newer = Balancer::new(config(&servers)).unwrap();
    newer.round().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the fenced-off binary keeps running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = std::fs::remove_file(&path);
    let mut log = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut log).unwrap();
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("took over") && log.contains("round"), "{log}");
    assert!(!log.contains('\x1b'), "no terminal colours in a piped log: {log:?}");
}

/// Real gateways (`LiveRules` over a `Limiter`, with `RegionShares`) in
/// each region and the balancer's loop while the traffic moves between
/// regions: over every window, all regions together admit at most
/// burst + rate x (window + the longest request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_over_with_real_gateways_while_traffic_moves() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use rl_gateway::global::{GatewayConfig, RegionShares};
    use rl_gateway::live::{LiveRules, Request, RuleSetSpec};

    const RATE: u64 = 200;
    const BURST: u64 = 40;
    const BUCKET_MS: u128 = 50;
    const LENGTH: Duration = Duration::from_secs(7);
    let servers = servers();
    let spec = RuleSetSpec::from_toml(&rules_toml(RATE, BURST)).unwrap();
    let mut c = config(&servers);
    c.rules = rl_balancer::rules::from_spec(&spec, &["eu", "us", "ap"].map(String::from)).unwrap();
    c.interval = Duration::from_millis(300);
    let balancer = tokio::spawn(Balancer::new(c).unwrap().run(std::future::pending()));
    let start = Instant::now();
    let buckets: Arc<Vec<AtomicU64>> = Arc::new((0..200).map(|_| AtomicU64::new(0)).collect());
    let longest_us = Arc::new(AtomicU64::new(0));
    let mut gateways = Vec::new();
    for (r, server) in servers.iter().enumerate() {
        for _ in 0..3 {
            let config = rl_gateway::LimiterConfig {
                gateways: 3,
                lease_window: Duration::from_millis(1),
                ..rl_gateway::LimiterConfig::new(rl_gateway::Config::standalone(server.url()))
            };
            let live = LiveRules::new(rl_gateway::Limiter::new(config).unwrap(), &spec).unwrap();
            let mut gc = GatewayConfig::new(["eu", "us", "ap"][r], server.url());
            (gc.refresh, gc.timeout) = (Duration::from_millis(50), Duration::from_millis(100));
            (gc.stale_after, gc.settle) = (STALE_AFTER, SETTLE);
            let shares = RegionShares::start(gc).unwrap();
            shares.refresh_now().await.unwrap();
            live.set_region_shares(shares.clone()).unwrap();
            let (buckets, longest_us) = (buckets.clone(), longest_us.clone());
            gateways.push(tokio::spawn(async move {
                let _keep = shares;
                // 400 a second in all, moving from region to region every 1.5 s.
                while start.elapsed() < LENGTH {
                    let here = (start.elapsed().as_millis() / 1500) as usize % 3 == r;
                    let pause = if here { 1000 / 110 } else { 1000 / 11 };
                    let sent = Instant::now();
                    let request = Request { subject: Some("acme"), ..Request::new() };
                    let allowed = live.check(&request).await.is_ok_and(|v| v.decision.allowed);
                    longest_us.fetch_max(sent.elapsed().as_micros() as u64, Ordering::Relaxed);
                    if allowed {
                        buckets[(start.elapsed().as_millis() / BUCKET_MS) as usize].fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            }));
        }
    }
    for g in gateways {
        g.await.unwrap();
    }
    balancer.abort();
    let counts: Vec<u64> = buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
    let slack = Duration::from_micros(longest_us.load(Ordering::Relaxed)).as_secs_f64();
    for from in 0..counts.len() {
        let mut sum = 0;
        for (len, n) in counts[from..].iter().enumerate() {
            sum += n;
            let window = (len + 1) as f64 * BUCKET_MS as f64 / 1000.0;
            let allowance = BURST as f64 + RATE as f64 * (window + slack);
            assert!(sum as f64 <= allowance, "{sum} admitted in {window} s from bucket {from}: above {allowance}");
        }
    }
    let total: u64 = counts.iter().sum();
    assert!(total as f64 > 0.5 * RATE as f64 * LENGTH.as_secs_f64(), "the limit was pressed: {total} admitted");
}

/// A gateway of eu that does not read again (its host is busy) while the
/// traffic moves from eu to ap: the balancer lowers eu, but raises ap only
/// once that gateway enforces the lowering. The old rule (raise a gateway
/// refresh and read timeout after the lowering) raised ap while the
/// gateway still enforced eu's old share: 1.3 times the whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_waits_until_the_lowered_regions_gateways_confirm() {
    use rl_gateway::global::{GatewayConfig, RegionShares};
    use rl_gateway::live::RuleSetSpec;

    let servers = servers();
    let spec = RuleSetSpec::from_toml(&rules_toml(100, 20)).unwrap();
    let global = rl_gateway::live::global_rules(&spec).remove(0).1;
    let mut c = config(&servers);
    c.rules = rl_balancer::rules::from_spec(&spec, &["eu", "us", "ap"].map(String::from)).unwrap();
    let mut b = Balancer::new(c).unwrap();
    // A gateway of eu, refreshed only when the test says (no task).
    let mut gc = GatewayConfig::new("eu", servers[0].url());
    (gc.stale_after, gc.settle) = (STALE_AFTER, SETTLE);
    let eu = RegionShares::new(gc).unwrap();
    rounds(&mut b, &servers, [70, 20, 10], 6).await;
    eu.refresh_now().await.unwrap();
    let before = eu.share("api", &global, "acme").0.share;
    assert!(before > 500_000, "eu holds most of the limit: {before}");
    // The gateway confirms what it enforces (a refresh that took a new
    // version confirms it at once).
    eu.refresh_now().await.unwrap();
    for round in 0..4 {
        traffic(&servers, "acme", [10, 20, 70]).await;
        let report = b.round().await.expect("not fenced");
        let held = eu.share("api", &global, "acme").0.share;
        let others = in_force(&servers[1..], "acme").await;
        assert_eq!(held, before, "the gateway did not read again");
        assert!(
            held + sum(&others) <= WHOLE,
            "round {round}: ap raised to {others:?} while a gateway of eu enforces {held} ({report:?})"
        );
        assert!(!report.raised, "round {round}: raised before eu's gateway confirmed");
    }
    // It reads (and confirms) the lowering: the next rounds raise ap.
    eu.refresh_now().await.unwrap();
    let lowered = eu.share("api", &global, "acme").0.share;
    assert!(lowered < before, "eu lowered: {lowered}");
    let mut raised = false;
    for _ in 0..10 {
        traffic(&servers, "acme", [10, 20, 70]).await;
        raised |= b.round().await.expect("not fenced").raised;
        eu.refresh_now().await.unwrap();
        let shares = in_force(&servers[1..], "acme").await;
        assert!(eu.share("api", &global, "acme").0.share + sum(&shares) <= WHOLE);
        if shares[1].is_some_and(|s| s > 500_000) {
            break;
        }
    }
    assert!(raised, "ap raised once eu's gateway confirmed");
    let ap = in_force(&servers[2..], "acme").await[0];
    assert!(ap.is_some_and(|s| s > 500_000), "ap holds most of the limit: {ap:?}");
}
