//! The limiter on a 3-node Redis Cluster: every call reaches its slot's
//! primary, leases and the deny cache work there, and one failing shard
//! degrades only the subjects it serves.

use std::time::{Duration, Instant};

use rl_gateway::{Backend, Config, Limiter, LimiterConfig, Policy, Rule, Source};
use testkit::Cluster;

fn cluster_config(cluster: &Cluster, backend: Backend) -> LimiterConfig {
    LimiterConfig {
        topology_refresh: Duration::from_millis(500),
        ..LimiterConfig::new(Config {
            backend,
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            breaker_trip_after: 3,
            breaker_open_for: Duration::from_millis(500),
            ..Config::cluster(cluster.urls())
        })
    }
}

/// A subject whose keys live on each node, in node order.
fn one_subject_per_node(cluster: &Cluster, policy: &Policy) -> Vec<String> {
    cluster
        .nodes
        .iter()
        .map(|node| {
            (0..1000)
                .map(|i| format!("s{i}"))
                .find(|s| cluster.node_for(&policy.keys(s).unwrap()[0]).port == node.port)
                .expect("a subject on every node")
        })
        .collect()
}

/// Waits until the limiter has read the slot map (a breaker per primary).
async fn until_shards_known(l: &Limiter, p: &Policy, subject: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while l.shards().len() < 3 {
        assert!(Instant::now() < deadline, "slot map never read: {:?}", l.shards());
        l.check(p, subject).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_answers_its_own_subjects_on_both_backends() {
    let cluster = Cluster::start(3);
    for backend in [Backend::Module, Backend::Lua] {
        let l = Limiter::new(cluster_config(&cluster, backend)).unwrap();
        let quiet = Policy::builder(format!("q{backend:?}"))
            .rule(Rule::per_hour("h", 3))
            .rule(Rule::per_minute("m", 50))
            .build()
            .unwrap();
        let busy = Policy::builder(format!("b{backend:?}")).rule(Rule::per_second("s", 1000)).build().unwrap();
        for subject in one_subject_per_node(&cluster, &quiet) {
            for left in (0..3).rev() {
                let d = l.check(&quiet, &subject).await.unwrap();
                assert_eq!(
                    (d.allowed, d.remaining, d.source, d.rule),
                    (true, left, Source::Redis, 0),
                    "{backend:?} {subject}"
                );
            }
            let d = l.check(&quiet, &subject).await.unwrap();
            assert_eq!((d.allowed, d.source), (false, Source::Redis));
            assert_eq!(l.check(&quiet, &subject).await.unwrap().source, Source::DenyCache);
        }
        for subject in one_subject_per_node(&cluster, &busy) {
            let sources: Vec<Source> = {
                let mut v = Vec::new();
                for _ in 0..50 {
                    let d = l.check(&busy, &subject).await.unwrap();
                    assert!(d.allowed);
                    v.push(d.source);
                }
                v
            };
            assert_eq!(sources[0], Source::Redis);
            assert!(sources[1..].iter().filter(|&&s| s == Source::Lease).count() >= 45, "{backend:?}: {sources:?}");
        }
        assert_eq!(l.counters().get(rl_gateway::Event::Error), 0, "{backend:?}: no call went astray");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_shard_degrades_only_its_subjects() {
    let mut cluster = Cluster::start(3);
    // Let the other shards keep serving when one is gone.
    for node in &cluster.nodes {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query::<()>(&mut node.con())
            .unwrap();
    }
    let l = Limiter::new(cluster_config(&cluster, Backend::Module)).unwrap();
    let p = Policy::builder("api").rule(Rule::per_hour("h", 1000)).build().unwrap();
    let subjects = one_subject_per_node(&cluster, &p);
    until_shards_known(&l, &p, &subjects[0]).await;

    let dead = format!("127.0.0.1:{}", cluster.nodes[0].port);
    cluster.nodes[0].kill();
    for _ in 0..10 {
        let d = l.check(&p, &subjects[0]).await.unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Fallback));
        for alive in &subjects[1..] {
            assert_eq!(l.check(&p, alive).await.unwrap().source, Source::Redis, "{alive} is on a live shard");
        }
    }
    let open: Vec<String> = l.shards().into_iter().filter(|(_, open)| *open).map(|(name, _)| name).collect();
    assert_eq!(open, [dead]);

    cluster.nodes[0].restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    while l.check(&p, &subjects[0]).await.unwrap().source != Source::Redis {
        assert!(Instant::now() < deadline, "the shard's subjects never went back to Redis");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
