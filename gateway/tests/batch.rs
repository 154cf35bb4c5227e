//! `Limiter::check_batch` against real servers: a request's checks cost one
//! round trip per shard (counted by the server's `total_reads_processed`),
//! all or nothing across policies and across shards, memory first.

mod common;

use std::time::{Duration, Instant};

use common::config;
use rl_gateway::{Backend, Check, Config, Decision, Limiter, LimiterConfig, Policy, Rule, Source, WindowMode};
use testkit::{Cluster, Server};

/// Read events the server has processed: one per round trip of a client
/// (a pipeline arrives in one read). Asked on `con`, whose own INFO counts
/// one more.
fn reads(con: &mut redis::Connection) -> u64 {
    let text: String = redis::cmd("INFO").arg("stats").query(con).unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("total_reads_processed:")).expect("total_reads_processed");
    line.trim().parse().unwrap()
}

/// The whole tokens in a policy's first bucket for `subject`: what RL.PEEK
/// says a take of one would leave, plus the one.
fn left(con: &mut redis::Connection, policy: &Policy, subject: &str, capacity: u64, period_ms: u64) -> i64 {
    let key = &policy.keys(subject).unwrap()[0];
    let reply: Vec<i64> =
        redis::cmd("RL.PEEK").arg(1).arg(key).arg(capacity).arg(capacity).arg(period_ms).query(con).unwrap();
    reply[1] + reply[0]
}

fn quiet(prefix: &str, per_hour: u64) -> Policy {
    Policy::builder(prefix).label(prefix).rule(Rule::per_hour("h", per_hour)).build().unwrap()
}

const HOUR_MS: u64 = 3_600_000;

#[tokio::test]
async fn a_one_check_batch_and_a_refund_carry_no_more_state_than_a_check() {
    // The several-check path's state (leases, pipelines, refunds) is kilobytes:
    // a layer with one policy must not allocate and move it on every request.
    let l = Limiter::new(Config::standalone("redis://127.0.0.1:1/")).unwrap();
    let p = quiet("size", 1);
    let checks = [Check { policy: &p, subject: "s", cost: 1 }];
    let batch = std::mem::size_of_val(&l.check_batch(&checks));
    let check = std::mem::size_of_val(&l.check_cost(&p, "s", 1));
    assert!(batch <= check + 128, "check_batch's future is {batch} bytes, check_cost's {check}");
    // A refund (which a refused batch makes) boxes its call, as a check does.
    assert!(l.check_batch(&[]).await.unwrap().is_empty(), "no checks, no decisions");
    let refund = std::mem::size_of_val(&l.refund(&p, "s", 1));
    assert!(refund <= check, "refund's future is {refund} bytes, check_cost's {check}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_for_every_policy_and_all_or_nothing() {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let mut con = s.con();
    let (ip, key) = (quiet("ip", 10), quiet("key", 2));
    let daily = Policy::builder("route")
        .label("route")
        .rule(Rule::window("d", 100, Duration::from_secs(86_400), WindowMode::Fixed))
        .build()
        .unwrap();
    let checks = |cost| {
        [
            Check { policy: &ip, subject: "ip:10.0.0.1", cost },
            Check { policy: &key, subject: "k1", cost },
            Check { policy: &daily, subject: "GET /a", cost },
        ]
    };
    // Warm the connection: its first use connects (more reads).
    l.client().peek(&[rl_gateway::Bucket::new("warm", 1, 1, Duration::from_secs(1)).unwrap()], 1).await.unwrap();

    // Three policies, two kinds of call: one round trip.
    let before = reads(&mut con);
    let d = l.check_batch(&checks(1)).await.unwrap();
    assert_eq!(reads(&mut con) - before, 1 + 1, "one read for the batch, one for INFO: {d:?}");
    let d: Vec<Decision> = d.into_iter().map(Option::unwrap).collect();
    assert!(d.iter().all(|d| d.allowed && d.source == Source::Redis), "{d:?}");
    assert_eq!(d.iter().map(|d| d.remaining).collect::<Vec<_>>(), [9, 1, 99], "each policy's own answer");
    // The same checks in turn: three round trips (the measure can tell).
    let before = reads(&mut con);
    for c in checks(1) {
        l.check_cost(c.policy, c.subject, c.cost).await.unwrap();
    }
    assert_eq!(reads(&mut con) - before, 3 + 1);

    // The key has nothing left: refused, and what the IP took is given back.
    let ip_left = left(&mut con, &ip, "ip:10.0.0.1", 10, HOUR_MS);
    assert_eq!(ip_left, 8);
    let d = l.check_batch(&checks(1)).await.unwrap();
    let d: Vec<Decision> = d.into_iter().map(Option::unwrap).collect();
    assert_eq!(d.iter().map(|d| d.allowed).collect::<Vec<_>>(), [true, false, true], "{d:?}");
    assert_eq!(left(&mut con, &ip, "ip:10.0.0.1", 10, HOUR_MS), ip_left, "refunded: all or nothing");

    // Refused again: from the deny cache, before anything is charged or sent.
    let before = reads(&mut con);
    let d = l.check_batch(&checks(1)).await.unwrap();
    assert_eq!(reads(&mut con) - before, 1, "no call at all");
    assert!(d[0].is_none() && d[2].is_none(), "nothing else was decided: {d:?}");
    let refused = d[1].unwrap();
    assert_eq!((refused.allowed, refused.source), (false, Source::DenyCache));
    assert_eq!(left(&mut con, &ip, "ip:10.0.0.1", 10, HOUR_MS), ip_left);

    // A cost the IP cannot pay: the key's and the window's are not kept
    // either (the window counts it: windows take nothing back).
    let other =
        [Check { policy: &ip, subject: "ip:10.0.0.2", cost: 11 }, Check { policy: &key, subject: "k2", cost: 1 }];
    let d = l.check_batch(&other).await.unwrap();
    assert!(!d[0].unwrap().allowed && d[1].unwrap().allowed, "{d:?}");
    assert_eq!(left(&mut con, &key, "k2", 2, HOUR_MS), 2, "the key's token is back");

    // Bad input is an error before anything is sent, naming the fault.
    let bad =
        [Check { policy: &ip, subject: "ip:10.0.0.3", cost: 1 }, Check { policy: &key, subject: "a{b}", cost: 1 }];
    let e = l.check_batch(&bad).await.unwrap_err();
    assert!(e.to_string().contains("without '{' or '}', got \"a{b}\""), "{e}");
    assert_eq!(left(&mut con, &ip, "ip:10.0.0.3", 10, HOUR_MS), 10, "nothing was taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_policy_spends_its_lease_and_only_the_rest_goes_to_redis() {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let mut con = s.con();
    let busy = Policy::builder("busy").rule(Rule::per_second("s", 100_000)).build().unwrap();
    let key = quiet("key", 1000);
    let checks = [Check { policy: &busy, subject: "ip:1", cost: 1 }, Check { policy: &key, subject: "k", cost: 1 }];
    // The first batch leases for the busy policy; wait for it to be there.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let d = l.check_batch(&checks).await.unwrap();
        if d[0].unwrap().source == Source::Lease {
            break;
        }
        assert!(Instant::now() < deadline, "no lease: {d:?}");
    }
    let before = reads(&mut con);
    let d = l.check_batch(&checks).await.unwrap();
    assert_eq!(d[0].unwrap().source, Source::Lease, "from memory");
    assert_eq!(d[1].unwrap().source, Source::Redis);
    assert_eq!(reads(&mut con) - before, 1 + 1, "only the quiet policy's call");

    // A cost the busy policy can never pay is refused by its lease call
    // first: the quiet policy is not asked (undecided, nothing taken).
    let key_left = left(&mut con, &key, "k", 1000, HOUR_MS);
    let heavy =
        [Check { policy: &busy, subject: "ip:1", cost: 200_000 }, Check { policy: &key, subject: "k", cost: 1 }];
    let d = l.check_batch(&heavy).await.unwrap();
    assert_eq!(d[0].map(|d| (d.allowed, d.retry_after)), Some((false, None)), "{d:?}");
    assert!(d[1].is_none(), "{d:?}");
    assert_eq!(left(&mut con, &key, "k", 1000, HOUR_MS), key_left);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lua_backend_checks_in_turn_with_the_same_refunds() {
    let s = Server::start(&[]);
    let l = Limiter::new(config(s.url(), Backend::Lua)).unwrap();
    let (ip, key) = (quiet("ip", 10), quiet("key", 1));
    let checks = [Check { policy: &ip, subject: "ip:1", cost: 1 }, Check { policy: &key, subject: "k", cost: 1 }];
    assert!(l.check_batch(&checks).await.unwrap().iter().all(|d| d.unwrap().allowed));
    let d = l.check_batch(&checks).await.unwrap();
    assert!(d[0].unwrap().allowed && !d[1].unwrap().allowed, "{d:?}");
    // The Lua script's buckets: read back through a check of the IP alone.
    let d = l.check(&ip, "ip:1").await.unwrap();
    assert_eq!(d.remaining, 8, "the refused batch's token came back");
}

fn cluster_config(cluster: &Cluster) -> LimiterConfig {
    LimiterConfig {
        // Read once; no refresh lands in a measured window.
        topology_refresh: Duration::from_secs(600),
        ..LimiterConfig::new(Config {
            backend: Backend::Module,
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            ..Config::cluster(cluster.urls())
        })
    }
}

/// `n` subjects of `policy` whose keys live on `node`.
fn subjects_on(cluster: &Cluster, policy: &Policy, node: u16, n: usize) -> Vec<String> {
    (0..5000)
        .map(|i| format!("s{i}"))
        .filter(|s| cluster.node_for(&policy.keys(s).unwrap()[0]).port == node)
        .take(n)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_one_round_trip_per_shard_and_all_or_nothing_across_shards() {
    let cluster = Cluster::start(3);
    let l = Limiter::new(cluster_config(&cluster)).unwrap();
    let (ip, key, route) = (quiet("ip", 10), quiet("key", 1), quiet("route", 100));
    let (a, b) = (cluster.nodes[0].port, cluster.nodes[1].port);
    // Two subjects (two slots) on node a, one on node b, none on the third.
    let on_a = subjects_on(&cluster, &ip, a, 2);
    let on_b = subjects_on(&cluster, &key, b, 1);
    let checks = [
        Check { policy: &ip, subject: &on_a[0], cost: 1 },
        Check { policy: &route, subject: &on_a[1], cost: 1 },
        Check { policy: &key, subject: &on_b[0], cost: 1 },
    ];
    // Until the slot map is read, calls go slot by slot: read it first.
    let deadline = Instant::now() + Duration::from_secs(10);
    while l.shards().len() < 3 || l.shards().iter().any(|(name, _)| name == "unknown") {
        assert!(Instant::now() < deadline, "slot map never read: {:?}", l.shards());
        l.check(&quiet("warm", 1_000_000), "w").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut cons: Vec<redis::Connection> = cluster.nodes.iter().map(|n| n.con()).collect();
    let counts = |cons: &mut Vec<redis::Connection>| cons.iter_mut().map(reads).collect::<Vec<u64>>();

    let before = counts(&mut cons);
    let d = l.check_batch(&checks).await.unwrap();
    let after = counts(&mut cons);
    assert!(d.iter().all(|d| d.is_some_and(|d| d.allowed && d.source == Source::Redis)), "{d:?}");
    let trips: Vec<u64> = after.iter().zip(&before).map(|(x, y)| x - y - 1).collect();
    assert_eq!(trips, [1, 1, 0], "one round trip to each shard with keys, none to the other");

    // The key (on b) is spent: refused there, and both checks on a refunded.
    let d = l.check_batch(&checks).await.unwrap();
    assert_eq!(d.iter().map(|d| d.unwrap().allowed).collect::<Vec<_>>(), [true, true, false], "{d:?}");
    let mut con_a = cluster.nodes[0].con();
    assert_eq!(left(&mut con_a, &ip, &on_a[0], 10, HOUR_MS), 9, "the first batch's token only");
    assert_eq!(left(&mut con_a, &route, &on_a[1], 100, HOUR_MS), 99);
    assert_eq!(l.counters().get(rl_gateway::Event::Error), 0, "no call went astray");
}
