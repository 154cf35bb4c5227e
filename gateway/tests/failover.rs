//! Failovers that gateways follow (issue 26): through Redis Sentinel
//! (`SENTINEL FAILOVER`), and on a fixed address whose primary a
//! standalone `FAILOVER` demoted. Under traffic, the new primary must
//! receive the module's calls within 5 s of the switch, fail-closed rules
//! must admit again, the demoted primary must be left, and the gateway
//! must say which server it talks to.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::limiter_calls;
use rl_gateway::{Backend, Config, Event, Limiter, Policy, Rule, Source};
use testkit::{role, SentinelSet, Server, MASTER};

/// The bound: the new primary is used within this of the switch.
const FOLLOW_WITHIN: Duration = Duration::from_secs(5);

fn login() -> Policy {
    Policy::builder("login").rule(Rule::per_second("attempts", 100_000).fail_closed()).build().unwrap()
}

/// Timeouts for a busy machine, a short breaker.
fn config(base: Config) -> Config {
    Config {
        timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_secs(1),
        breaker_open_for: Duration::from_millis(200),
        ..base
    }
}

/// Rounds of checks on every gateway, each a new subject (never leased:
/// each is a call to Redis), until `done` after a round; how many Redis
/// answered.
async fn traffic(gateways: &[Limiter], policy: &Policy, n: &mut u64, done: impl Fn() -> bool) -> u64 {
    let mut answered = 0;
    loop {
        for g in gateways {
            *n += 1;
            let d = g.check(policy, &format!("ip{n}")).await.unwrap();
            answered += u64::from(d.source == Source::Redis);
        }
        if done() {
            return answered;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Ten rounds: every check answered by Redis.
async fn all_answered(gateways: &[Limiter], policy: &Policy, n: &mut u64) {
    let mut answered = 0;
    for _ in 0..10 {
        answered += traffic(gateways, policy, n, || true).await;
    }
    assert_eq!(answered, 10 * gateways.len() as u64, "the primary answers every check");
}

/// The module's calls a server ran (INFO commandstats).
fn module_calls(server: &Server) -> u64 {
    limiter_calls(server, Backend::Module)
}

/// After a switch to `new`: until every gateway's fail-closed check is
/// admitted by Redis and `new` has counted the module's calls, within
/// [`FOLLOW_WITHIN`]; how long it took.
async fn until_followed(gateways: &[Limiter], policy: &Policy, n: &mut u64, new: &Server) -> Duration {
    let switched = Instant::now();
    let before = module_calls(new);
    loop {
        let mut admitted = 0;
        for g in gateways {
            *n += 1;
            let d = g.check(policy, &format!("ip{n}")).await.unwrap();
            admitted += usize::from(d.allowed && d.source == Source::Redis);
        }
        if admitted == gateways.len() && module_calls(new) > before {
            return switched.elapsed();
        }
        assert!(
            switched.elapsed() < FOLLOW_WITHIN,
            "{FOLLOW_WITHIN:?} after the switch: {admitted} of {} gateways admitted, {} module calls on the new primary",
            gateways.len(),
            module_calls(new) - before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_through_sentinel_follow_a_sentinel_failover() {
    let set = Arc::new(SentinelSet::start(1));
    let old = set.primary().port;
    let gateways: Vec<Limiter> =
        (0..2).map(|_| Limiter::new(config(Config::sentinel(MASTER, set.addresses()))).unwrap()).collect();
    let login = login();
    let mut n = 0;
    all_answered(&gateways, &login, &mut n).await;
    for g in &gateways {
        let status = g.client().connection().status();
        assert_eq!(status.server, Some(format!("127.0.0.1:{old}")), "{status:?}");
        assert!(!status.redirected && status.configured.contains("sentinel master 'mymaster'"), "{status:?}");
    }

    let failover = tokio::task::spawn_blocking({
        let set = set.clone();
        move || set.failover().port
    });
    let answered = traffic(&gateways, &login, &mut n, || failover.is_finished()).await;
    let new_port = failover.await.unwrap();
    assert_ne!(new_port, old);
    let new = set.servers.iter().find(|s| s.port == new_port).unwrap();
    let took = until_followed(&gateways, &login, &mut n, new).await;
    eprintln!("followed the Sentinel failover {took:?} after the switch ({answered} answered during it)");
    for g in &gateways {
        let status = g.client().connection().status();
        assert_eq!(status.server, Some(format!("127.0.0.1:{new_port}")), "{status:?}");
        assert!(status.switches >= 1 && !status.redirected, "{status:?}");
        assert!(g.counters().get(Event::ServerSwitch) >= 1);
    }
    // The old primary is left: no more calls reach it.
    let demoted = set.servers.iter().find(|s| s.port == old).unwrap();
    let left = module_calls(demoted);
    traffic(&gateways, &login, &mut n, {
        let until = Instant::now() + Duration::from_millis(300);
        move || Instant::now() >= until
    })
    .await;
    assert_eq!(module_calls(demoted), left, "a gateway still calls the old primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_a_fixed_address_leaves_a_primary_demoted_by_failover() {
    let primary = Server::start(&[]);
    let replica = primary.replica(&[]);
    let gateways: Vec<Limiter> =
        (0..2).map(|_| Limiter::new(config(Config::standalone(primary.url()))).unwrap()).collect();
    let login = login();
    let mut n = 0;
    all_answered(&gateways, &login, &mut n).await;

    // The README's rolling upgrade step: FAILOVER on the primary, then it
    // is a replica of the promoted one.
    let mut con = primary.con();
    let _: () = redis::cmd("FAILOVER").arg("TIMEOUT").arg(5000).query(&mut con).expect("FAILOVER");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(role(&primary) == "slave" && role(&replica) == "master") {
        assert!(Instant::now() < deadline, "the FAILOVER did not complete");
        traffic(&gateways, &login, &mut n, || true).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = until_followed(&gateways, &login, &mut n, &replica).await;
    eprintln!("followed the FAILOVER {took:?} after it completed");
    for g in &gateways {
        let status = g.client().connection().status();
        assert_eq!(status.server, Some(format!("127.0.0.1:{}", replica.port)), "{status:?}");
        assert!(status.redirected, "shown as not the configured server: {status:?}");
        assert_eq!(status.configured, primary.url());
        assert!(g.counters().get(Event::ServerSwitch) >= 1);
    }
    let left = module_calls(&primary);
    traffic(&gateways, &login, &mut n, {
        let until = Instant::now() + Duration::from_millis(300);
        move || Instant::now() >= until
    })
    .await;
    assert_eq!(module_calls(&primary), left, "a gateway still calls the demoted primary");

    // Back: the configured server is the primary again, and the gateways
    // return to it, no longer redirected.
    let _: () = redis::cmd("FAILOVER").arg("TIMEOUT").arg(5000).query(&mut replica.con()).expect("FAILOVER back");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(role(&primary) == "master" && role(&replica) == "slave") {
        assert!(Instant::now() < deadline, "the FAILOVER back did not complete");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_followed(&gateways, &login, &mut n, &primary).await;
    for g in &gateways {
        let status = g.client().connection().status();
        assert_eq!(status.server, Some(format!("127.0.0.1:{}", primary.port)), "{status:?}");
        assert!(!status.redirected, "{status:?}");
    }
}
