//! Redis Cluster: three masters on loopback, each with the module.

use std::time::{Duration, Instant};

use testkit::{call, call_err, state, Cluster, Server};

fn node_id(s: &Server) -> String {
    redis::cmd("CLUSTER").arg("MYID").query(&mut s.con()).unwrap()
}

#[test]
fn hash_tagged_calls_are_served_and_others_redirected() {
    let c = Cluster::start(3);
    let node = c.node_for("{user42}");
    let mut con = node.con();
    let calls = [
        ("RL.TAKE", "2 rl:{user42}:s rl:{user42}:m 10 10 1000 100 100 60000"),
        ("RL.LEASE", "2 rl:{user42}:s rl:{user42}:m 10 10 1000 100 100 60000 WANT 3"),
        ("RL.WINDOW", "2 rl:{user42}:ws rl:{user42}:wm 10 1000 100 60000"),
        ("RL.WINDOW", "2 rl:{user42}:es rl:{user42}:em 10 1000 100 60000 EXACT"),
        ("CL.THROTTLE", "rl:{user42}:cell 5 10 60"),
    ];
    for (cmd, args) in calls {
        let r = call(&mut con, cmd, args);
        assert!(r[0] >= 1 || cmd == "CL.THROTTLE", "{cmd}: {r:?}");
    }
    let other = c.nodes.iter().find(|s| s.port != node.port).unwrap();
    let e = call_err(&mut other.con(), "RL.TAKE", &[b"1", b"rl:{user42}:s", b"10", b"10", b"1000"]);
    assert!(e.starts_with("MOVED"), "{e}");
    let e = call_err(&mut con, "RL.TAKE", &[b"2", b"rl:{a}:s", b"rl:{b}:s", b"1", b"1", b"1", b"1", b"1", b"1"]);
    assert!(e.starts_with("CROSSSLOT"), "{e}");
    let e = call_err(&mut con, "RL.ACQUIRE", &[b"2", b"rl:{a}:f", b"rl:{b}:f", b"1", b"1000", b"1", b"1000"]);
    assert!(e.starts_with("CROSSSLOT"), "{e}");
    let e = call_err(&mut other.con(), "RL.RELEASE", &[b"1", b"rl:{user42}:f", b"ID", b"x"]);
    assert!(e.starts_with("MOVED"), "{e}");
}

#[test]
fn keys_survive_a_slot_migration() {
    let c = Cluster::start(3);
    let source = c.node_for("{mig}");
    let target = c.nodes.iter().find(|s| s.port != source.port).unwrap();
    let mut src = source.con();
    call(&mut src, "RL.TAKE", "1 {mig}:bucket 100 1 60000 COST 37");
    call(&mut src, "RL.WINDOW", "1 {mig}:sliding 100 60000 COST 5");
    call(&mut src, "RL.WINDOW", "1 {mig}:fixed 100 60000 FIXED COST 6");
    for _ in 0..4 {
        call(&mut src, "RL.WINDOW", "1 {mig}:exact 100 60000 EXACT");
        std::thread::sleep(Duration::from_millis(2));
    }
    call(&mut src, "CL.THROTTLE", "{mig}:cell 10 1 60 4");
    for id in ["a", "b"] {
        redis::cmd("RL.ACQUIRE")
            .arg(&["1", "{mig}:flight", "5", "60000", "ID", id])
            .query::<redis::Value>(&mut src)
            .unwrap();
    }
    let keys = ["{mig}:bucket", "{mig}:sliding", "{mig}:fixed", "{mig}:exact", "{mig}:cell", "{mig}:flight"];
    let before: Vec<_> = keys.iter().map(|k| state(&mut src, k)).collect();

    let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg("{mig}").query(&mut src).unwrap();
    let (source_id, target_id) = (node_id(source), node_id(target));
    let mut dst = target.con();
    redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("IMPORTING").arg(&source_id).query::<()>(&mut dst).unwrap();
    redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("MIGRATING").arg(&target_id).query::<()>(&mut src).unwrap();
    redis::cmd("MIGRATE")
        .arg(&["127.0.0.1", &target.port.to_string(), "", "0", "5000", "KEYS"])
        .arg(&keys)
        .query::<()>(&mut src)
        .unwrap();
    for node in &c.nodes {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(&target_id)
            .query::<()>(&mut node.con())
            .unwrap();
    }

    for (k, (digest, at)) in keys.iter().zip(&before) {
        let (got_digest, got_at) = state(&mut dst, k);
        assert_eq!(&got_digest, digest, "{k}: state changed in the move");
        // MIGRATE carries the TTL relative to its clock: the absolute expiry
        // may move by the transfer time.
        assert!((got_at - at).abs() < 1_000, "{k}: expiry {at} became {got_at}");
    }
    assert_eq!(call(&mut dst, "RL.PEEK", "1 {mig}:bucket 100 1 60000")[1], 62);
    assert_eq!(call(&mut dst, "RL.WINDOWPEEK", "1 {mig}:exact 100 60000 EXACT")[1], 95);
    let released: i64 = redis::cmd("RL.RELEASE").arg(&["1", "{mig}:flight", "ID", "a"]).query(&mut dst).unwrap();
    assert_eq!(released, 1, "the slot moved with its key");
    let e = call_err(&mut src, "RL.PEEK", &[b"1", b"{mig}:bucket", b"100", b"1", b"60000"]);
    assert!(e.starts_with("MOVED"), "{e}");
}

#[test]
fn a_replica_in_the_cluster_takes_over_with_the_state() {
    let c = Cluster::start(3);
    let owner = c.node_for("{fo}");
    let replica = Server::start(&["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]);
    let mut r = replica.con();
    redis::cmd("CLUSTER").arg("MEET").arg("127.0.0.1").arg(owner.port).query::<()>(&mut r).unwrap();
    let owner_id = node_id(owner);
    let deadline = Instant::now() + Duration::from_secs(20);
    // REPLICATE fails until the MEET has spread; once accepted, wait for
    // the link (calling it again would restart the sync).
    while let Err(e) = redis::cmd("CLUSTER").arg("REPLICATE").arg(&owner_id).query::<()>(&mut r) {
        assert!(Instant::now() < deadline, "the replica was not accepted: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    while replica.info("replication", "master_link_status") != "up" {
        assert!(Instant::now() < deadline, "the replica did not sync");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut o = owner.con();
    for _ in 0..5 {
        call(&mut o, "RL.TAKE", "1 {fo}:k 5 1 3600000");
    }
    let _: redis::Value =
        redis::cmd("RL.ACQUIRE").arg(&["1", "{fo}:f", "1", "3600000", "ID", "held"]).query(&mut o).unwrap();
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut o).unwrap();
    assert_eq!(acked, 1);
    redis::cmd("CLUSTER").arg("FAILOVER").query::<()>(&mut r).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while replica.info("replication", "role") != "master" {
        assert!(Instant::now() < deadline, "failover did not happen");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The new primary continues from the replicated state: still empty.
    let r2 = call(&mut r, "RL.TAKE", "1 {fo}:k 5 1 3600000");
    assert_eq!((r2[0], r2[1]), (0, 0));
    let f: (i64, i64, i64, i64, i64, String) =
        redis::cmd("RL.ACQUIRE").arg(&["1", "{fo}:f", "1", "3600000", "ID", "other"]).query(&mut r).unwrap();
    assert_eq!((f.0, f.1), (0, 1), "the slot held before the failover still counts");
}
