//! Buckets survive restarts from RDB and from AOF (with and without the RDB
//! preamble, rewritten or replayed), state and expiry intact.

use std::time::{Duration, Instant};
use testkit::{call, Server};

/// Writes buckets of several shapes; returns each key with its digest and
/// absolute expiry.
fn fill(s: &Server) -> Vec<(String, Vec<String>, i64)> {
    let mut con = s.con();
    let mut keys = Vec::new();
    for i in 0..30 {
        let k = format!("b:{i}");
        let args = format!("1 {k} {} 1 3600000 COST {}", 10 + i, 1 + i % 4);
        call(&mut con, "RL.TAKE", &args);
        keys.push(k);
    }
    call(&mut con, "RL.TAKE", "3 {u}a {u}b {u}c 5 1 60000 50 1 60000 500 1 60000 COST 2");
    keys.extend(["{u}a", "{u}b", "{u}c"].map(String::from));
    for mode in ["SLIDING", "FIXED", "EXACT"] {
        for i in 0..5 {
            let k = format!("w:{mode}:{i}");
            for _ in 0..=i {
                call(&mut con, "RL.WINDOW", &format!("1 {k} 100 3600000 {mode}"));
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            keys.push(k);
        }
    }
    call(&mut con, "CL.THROTTLE", "cell 10 1 60 3");
    keys.push("cell".into());
    keys.into_iter()
        .map(|k| {
            let d: Vec<String> = redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(&k).query(&mut con).unwrap();
            let at: i64 = redis::cmd("PEXPIRETIME").arg(&k).query(&mut con).unwrap();
            assert!(at > 0, "{k} has no expiry");
            (k, d, at)
        })
        .collect()
}

fn check(s: &Server, keys: &[(String, Vec<String>, i64)]) {
    let mut con = s.con();
    for (k, d, at) in keys {
        let got: Vec<String> = redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(k).query(&mut con).unwrap();
        assert_eq!(&got, d, "{k} state");
        let got_at: i64 = redis::cmd("PEXPIRETIME").arg(k).query(&mut con).unwrap();
        assert_eq!(got_at, *at, "{k} expiry");
    }
    // And the buckets still decide from that state.
    assert_eq!(call(&mut con, "RL.PEEK", "1 b:0 10 1 3600000")[1], 8);
}

fn wait_rewrite(s: &Server) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.info("persistence", "aof_rewrite_in_progress") != "0"
        || s.info("persistence", "aof_rewrite_scheduled") != "0"
    {
        assert!(Instant::now() < deadline, "AOF rewrite did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(s.info("persistence", "aof_last_bgrewrite_status"), "ok");
}

#[test]
fn restart_from_rdb() {
    let mut s = Server::start(&[]);
    let keys = fill(&s);
    s.shutdown("SAVE");
    s.restart();
    check(&s, &keys);
}

#[test]
fn restart_from_replayed_aof() {
    // Every write is in the AOF as RL.SET; a crash loses nothing fsynced.
    let mut s = Server::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let keys = fill(&s);
    s.kill();
    s.restart();
    check(&s, &keys);
}

/// AOF rewrite emits each key as `RL.SET key blob 0` (then the server's
/// PEXPIREAT), or as RDB inside the AOF with the preamble.
fn restart_from_rewritten_aof(rdb_preamble: &str) {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", rdb_preamble]);
    let keys = fill(&s);
    redis::cmd("BGREWRITEAOF").query::<()>(&mut s.con()).unwrap();
    wait_rewrite(&s);
    s.shutdown("NOSAVE");
    s.restart();
    check(&s, &keys);
}

#[test]
fn restart_from_rewritten_aof_without_rdb_preamble() {
    restart_from_rewritten_aof("no");
}

#[test]
fn restart_from_rewritten_aof_with_rdb_preamble() {
    restart_from_rewritten_aof("yes");
}

/// `tests/fixtures/v1.rdb` was written by Redis 7.0.15 with this module's
/// format version 1 (keys without expiry, set with RL.SET). Every later
/// version must load it into exactly these states, on every server.
#[test]
fn loads_the_version_1_rdb_fixture() {
    use rl_core::codec::{log_blob, PackedBucket, PackedWindow};
    use rl_core::exact_log::{Entry, Log};
    use rl_core::window::WindowState;
    use rl_core::BucketState;

    let rdb = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1.rdb");
    let s = Server::start_from_rdb(&rdb, &[]);
    let mut con = s.con();
    let t = 1_764_489_600_000;
    let expected: [(&str, Vec<u8>); 4] = [
        (
            "fixture:bucket",
            PackedBucket::pack(&BucketState { tokens: 5, fraction: 123, updated_ms: t }).to_blob().to_vec(),
        ),
        (
            "fixture:debt",
            PackedBucket::pack(&BucketState { tokens: -42, fraction: 7, updated_ms: t }).to_blob().to_vec(),
        ),
        (
            "fixture:sliding",
            PackedWindow::pack(&WindowState { start_ms: t, previous: 7, current: 3 }).to_blob().to_vec(),
        ),
        ("fixture:log", log_blob(&Log::from_entries([Entry::new(t, 2), Entry::new(t + 500, 1)]).unwrap())),
    ];
    for (key, blob) in &expected {
        assert_eq!(&testkit::module_blob(&mut con, key), blob, "{key}");
    }
    let cell: String = redis::cmd("GET").arg("fixture:cell").query(&mut con).unwrap();
    assert_eq!(cell, "1764489600123456789");
    // And they decide: the debt is still owed (refill of 1 token a year).
    assert_eq!(call(&mut con, "RL.TAKE", "1 fixture:debt 10 1 31536000000")[..2], [0, 0]);
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut con).unwrap(), 5);
}
