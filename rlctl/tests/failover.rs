//! Live rules, rlctl's store and its exporter across a failover (issue
//! 26): through Redis Sentinel (a `redis+sentinel://` URL, `SENTINEL
//! FAILOVER`), and on a fixed address whose primary a standalone
//! `FAILOVER` demoted. Within 5 s a publication lands on the new primary
//! and a gateway's watcher installs it, and the exporter scrapes the new
//! primary and says so.

mod support;

use std::time::{Duration, Instant};

use rl_gateway::live::{LiveRules, RedisSource, RuleSetSpec, RulesStore, DEFAULT_KEY};
use rl_gateway::{Config, Limiter};
use support::Exporter;
use testkit::{call, role, SentinelSet, Server, MASTER};

/// The bound: the new primary is used within this of the switch.
const FOLLOW_WITHIN: Duration = Duration::from_secs(5);

fn rules(id: &str) -> RuleSetSpec {
    RuleSetSpec::from_toml(&format!(
        "[[rules]]\nid = \"{id}\"\nreason = \"failover\"\nlimits = [{{ name = \"s\", rate = 100, per = \"1s\" }}]\n"
    ))
    .unwrap()
}

/// The rules' version as `server` holds it.
fn stored_version(server: &Server) -> Option<u64> {
    redis::cmd("HGET").arg(DEFAULT_KEY).arg("version").query(&mut server.con()).unwrap()
}

/// Publishes until a publication is answered, within [`FOLLOW_WITHIN`].
async fn until_published(store: &RulesStore, spec: &RuleSetSpec) -> u64 {
    let started = Instant::now();
    loop {
        match store.publish(spec).await {
            Ok(version) => return version,
            Err(e) => assert!(started.elapsed() < FOLLOW_WITHIN, "{FOLLOW_WITHIN:?} after the switch: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Until `done`, within [`FOLLOW_WITHIN`].
async fn within(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < FOLLOW_WITHIN, "not within {FOLLOW_WITHIN:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_are_published_and_watched_through_sentinel_across_a_failover() {
    let set = SentinelSet::start(1);
    let url = format!("redis+sentinel://{}/{MASTER}", set.addresses().join(","));
    let store = RulesStore::new(&url, DEFAULT_KEY, Duration::from_secs(1)).unwrap();
    let gateway =
        LiveRules::new(Limiter::new(Config::sentinel(MASTER, set.addresses())).unwrap(), &rules("a")).unwrap();
    let source = RedisSource { poll_every: Duration::from_millis(500), ..RedisSource::new(url.as_str()) };
    let _watcher = gateway.watch_redis(source).unwrap();
    let old = set.primary().port;
    let first = store.publish(&rules("b")).await.unwrap();
    assert_eq!(stored_version(set.primary()), Some(first));
    within("the gateway installs the first publication", || gateway.status().version == first).await;

    let new = tokio::task::block_in_place(|| set.failover());
    assert_ne!(new.port, old);
    // Until the sentinels demote it, the old primary still takes writes
    // (lost when it resyncs from the new one), whoever sends them: Sentinel's
    // replication is asynchronous. Publish once it is demoted.
    let demoted = set.servers.iter().find(|s| s.port == old).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while role(demoted) != "slave" {
        assert!(Instant::now() < deadline, "the sentinels did not demote the old primary");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = until_published(&store, &rules("c")).await;
    assert_eq!(stored_version(new), Some(second), "published on the new primary");
    assert_eq!(store.status().server, Some(format!("127.0.0.1:{}", new.port)));
    within("the gateway installs the publication made after the failover", || gateway.status().version == second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlctl_publishes_to_the_primary_after_a_fixed_address_is_demoted() {
    let primary = Server::start(&[]);
    let replica = primary.replica(&[]);
    let store = RulesStore::new(&primary.url(), DEFAULT_KEY, Duration::from_secs(1)).unwrap();
    let first = store.publish(&rules("a")).await.unwrap();
    assert_eq!(stored_version(&primary), Some(first));

    let _: () = redis::cmd("FAILOVER").arg("TIMEOUT").arg(5000).query(&mut primary.con()).expect("FAILOVER");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(role(&primary) == "slave" && role(&replica) == "master") {
        assert!(Instant::now() < deadline, "the FAILOVER did not complete");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = until_published(&store, &rules("b")).await;
    assert_eq!(stored_version(&replica), Some(second), "published on the new primary");
    let status = store.status();
    assert!(status.redirected, "{status:?}");
    assert_eq!(status.server, Some(format!("127.0.0.1:{}", replica.port)));
}

/// The exporter's `rl_calls_total{command="take"}`, if it answered.
fn takes(page: &str) -> Option<u64> {
    page.lines().find_map(|l| l.strip_prefix("rl_calls_total{command=\"take\"} ")?.parse().ok())
}

#[test]
fn the_exporter_through_sentinel_scrapes_the_new_primary() {
    let set = SentinelSet::start(1);
    let url = format!("redis+sentinel://{}/{MASTER}", set.addresses().join(","));
    let old = set.primary();
    for _ in 0..3 {
        call(&mut old.con(), "RL.TAKE", "1 k 100 1 60000");
    }
    let exporter = Exporter::start(&url);
    assert_eq!(takes(&exporter.scrape()), Some(3), "the primary's counters");

    let new = set.failover();
    for _ in 0..5 {
        call(&mut new.con(), "RL.TAKE", "1 k 100 1 60000");
    }
    let started = Instant::now();
    loop {
        let page = exporter.scrape();
        if page.lines().any(|l| l == "rl_up 1") && takes(&page) == Some(5) {
            break;
        }
        assert!(started.elapsed() < FOLLOW_WITHIN, "still not the new primary's counters:\n{page}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let moved = format!("scraping 127.0.0.1:{} now", new.port);
    assert!(exporter.log().contains(&moved), "the move is logged: {}", exporter.log());
}
