//! Effects, not commands, are replicated: a replica holds exactly the
//! primary's state and expiry, and a refused call propagates nothing.

use std::time::Duration;
use testkit::{call, state, Server};

fn wait_replicas(con: &mut redis::Connection) {
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(con).unwrap();
    assert_eq!(acked, 1, "the replica did not acknowledge");
}

#[test]
fn replica_holds_the_primary_state_and_expiry() {
    let primary = Server::start(&[]);
    let replica = primary.replica(&[]);
    let mut p = primary.con();
    let mut keys = Vec::new();
    for i in 0..40 {
        let (a, b) = (format!("{{s{i}}}:sec"), format!("{{s{i}}}:min"));
        for _ in 0..(i % 7) {
            let args = format!("2 {a} {b} 5 5 10000 20 1 60000 COST {}", 1 + i % 3);
            call(&mut p, "RL.TAKE", &args);
        }
        keys.push(a);
        keys.push(b);
        // A little live time between calls, so the clocks would drift apart
        // if the replica re-ran the decisions.
        std::thread::sleep(Duration::from_millis(3));
    }
    wait_replicas(&mut p);
    let mut r = replica.con();
    let mut compared = 0;
    for k in &keys {
        let primary_state = state(&mut p, k);
        if primary_state.1 == -2 {
            continue; // never written (0 calls) or expired
        }
        assert_eq!(state(&mut r, k), primary_state, "key {k}");
        compared += 1;
    }
    assert!(compared > 60, "compared only {compared} keys");
    // The replica ran the internal RL.SET, never RL.TAKE.
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut r).unwrap();
    assert!(stats.contains("cmdstat_rl.set:"), "{stats}");
    assert!(!stats.contains("cmdstat_rl.take:"), "{stats}");
}

#[test]
fn every_command_replicates_its_effect() {
    let primary = Server::start(&[]);
    let replica = primary.replica(&[]);
    let mut p = primary.con();
    let mut keys = Vec::new();
    for i in 0..12 {
        let t = format!("{{t{i}}}");
        let calls = [
            ("RL.LEASE", format!("1 {t}:lease 50 5 1000 WANT {}", 3 + i)),
            ("RL.TAKE", format!("1 {t}:lease 50 5 1000 COST {} FORCE", 40 + i)),
            ("RL.REFUND", format!("1 {t}:lease 50 5 1000 TOKENS 7")),
            ("RL.WINDOW", format!("2 {t}:s1 {t}:s2 10 30000 100 60000 COST 2")),
            ("RL.WINDOW", format!("2 {t}:f1 {t}:f2 10 30000 100 60000 FIXED")),
            ("RL.WINDOW", format!("2 {t}:e1 {t}:e2 10 30000 100 60000 EXACT")),
            ("CL.THROTTLE", format!("{t}:cell 5 10 60 2")),
        ];
        for round in 0..3 {
            for (cmd, args) in &calls {
                call(&mut p, cmd, args);
            }
            // Window refunds: the counters' new states, the log whole.
            for (keys, mode) in [("s1 s2", "SLIDING"), ("f1 f2", "FIXED"), ("e1 e2", "EXACT")] {
                let keys: Vec<String> = keys.split(' ').map(|k| format!("{t}:{k}")).collect();
                let args = format!("2 {} {} 10 30000 100 60000 COST {} {mode}", keys[0], keys[1], 1 + round);
                let r = call(&mut p, "RL.WINDOW", &format!("{args} TIME"));
                if r[0] == 1 && (i + round) % 2 == 0 {
                    call(&mut p, "RL.WINDOW", &format!("{args} REFUND {}", r[6]));
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        for k in ["lease", "s1", "s2", "f1", "f2", "e1", "e2", "cell"] {
            keys.push(format!("{t}:{k}"));
        }
    }
    wait_replicas(&mut p);
    let mut r = replica.con();
    let mut compared = 0;
    for k in &keys {
        let primary_state = state(&mut p, k);
        if primary_state.1 == -2 {
            continue; // a fixed window that just ended, on a slow machine
        }
        assert!(primary_state.1 > 0, "{k} has no expiry on the primary");
        assert_eq!(state(&mut r, k), primary_state, "key {k}");
        compared += 1;
    }
    assert!(compared >= keys.len() * 3 / 4, "compared only {compared} of {}", keys.len());
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut r).unwrap();
    for internal in ["cmdstat_rl.set:", "cmdstat_rl.logadd:", "cmdstat_set:"] {
        assert!(stats.contains(internal), "{internal} missing from {stats}");
    }
    for public in ["rl.take", "rl.lease", "rl.refund", "rl.window", "cl.throttle"] {
        assert!(!stats.contains(&format!("cmdstat_{public}:")), "{public} ran on the replica: {stats}");
    }
}

#[test]
fn refused_calls_propagate_nothing() {
    let primary = Server::start(&[]);
    let _replica = primary.replica(&[]);
    let mut p = primary.con();
    call(&mut p, "RL.TAKE", "1 k 1 1 3600000");
    call(&mut p, "RL.WINDOW", "1 w 1 3600000");
    call(&mut p, "RL.WINDOW", "1 x 1 3600000 EXACT");
    call(&mut p, "CL.THROTTLE", "c 0 1 3600");
    wait_replicas(&mut p);
    let offset = primary.info("replication", "master_repl_offset");
    let dirty = primary.info("persistence", "rdb_changes_since_last_save");
    for _ in 0..20 {
        assert_eq!(call(&mut p, "RL.TAKE", "1 k 1 1 3600000")[0], 0);
        assert_eq!(call(&mut p, "RL.LEASE", "1 k 1 1 3600000 WANT 3")[0], 0);
        assert_eq!(call(&mut p, "RL.WINDOW", "1 w 1 3600000")[0], 0);
        assert_eq!(call(&mut p, "RL.WINDOW", "1 x 1 3600000 EXACT")[0], 0);
        assert_eq!(call(&mut p, "CL.THROTTLE", "c 0 1 3600")[0], 1);
    }
    call(&mut p, "RL.PEEK", "1 k 1 1 3600000");
    call(&mut p, "RL.WINDOWPEEK", "1 w 1 3600000");
    call(&mut p, "CL.THROTTLE", "c 0 1 3600 0");
    assert_eq!(primary.info("replication", "master_repl_offset"), offset);
    assert_eq!(primary.info("persistence", "rdb_changes_since_last_save"), dirty);
}

#[test]
fn peek_runs_on_a_read_only_replica_and_take_does_not() {
    let primary = Server::start(&[]);
    let replica = primary.replica(&[]);
    let mut p = primary.con();
    call(&mut p, "RL.TAKE", "1 k 5 1 3600000 COST 2");
    wait_replicas(&mut p);
    let mut r = replica.con();
    assert_eq!(call(&mut r, "RL.PEEK", "1 k 5 1 3600000")[..2], [1, 2]);
    let e = testkit::call_err(&mut r, "RL.TAKE", &[b"1", b"k", b"5", b"1", b"3600000"]);
    assert!(e.starts_with("READONLY"), "{e}");
}

#[test]
fn internal_set_validates_its_arguments() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let good = {
        // A valid blob: kind 'B', version 1, 16 bytes of state: 5 tokens
        // as of the server's now.
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
        let now_ms = secs * 1000 + micros / 1000;
        let mut b = vec![b'B', 1];
        b.extend_from_slice(&now_ms.to_le_bytes());
        b.extend_from_slice(&(5u64 << 16).to_le_bytes());
        b
    };
    let e = testkit::call_err(&mut con, "RL.SET", &[b"k", &good]);
    assert!(e.contains("wrong number of arguments"), "{e}");
    let e = testkit::call_err(&mut con, "RL.SET", &[b"k", b"junk", b"0"]);
    assert!(e.contains("unknown kind"), "{e}");
    let e = testkit::call_err(&mut con, "RL.SET", &[b"k", &good[..10], b"0"]);
    assert!(e.contains("wrong length"), "{e}");
    let mut newer = good.clone();
    newer[1] = 9;
    let e = testkit::call_err(&mut con, "RL.SET", &[b"k", &newer, b"0"]);
    assert!(e.contains("newer format"), "{e}");
    let e = testkit::call_err(&mut con, "RL.SET", &[b"k", &good, b"-5"]);
    assert!(e.contains("pxat"), "{e}");
    // One bad triple: nothing of the call is written.
    let e = testkit::call_err(&mut con, "RL.SET", &[b"k", &good, b"4000000000000", b"k2", b"junk", b"0"]);
    assert!(e.contains("unknown kind"), "{e}");
    redis::cmd("SET").arg("str").arg("v").query::<()>(&mut con).unwrap();
    let e = testkit::call_err(&mut con, "RL.SET", &[b"str", &good, b"4000000000000"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    let n: i64 = redis::cmd("EXISTS").arg(&["k", "k2"]).query(&mut con).unwrap();
    assert_eq!(n, 0);
    // A good one writes the state and the absolute expiry.
    let at = 4_000_000_000_000i64;
    redis::cmd("RL.SET").arg("k").arg(&good).arg(at).query::<()>(&mut con).unwrap();
    assert_eq!(redis::cmd("PEXPIRETIME").arg("k").query::<i64>(&mut con).unwrap(), at);
    assert_eq!(call(&mut con, "RL.PEEK", "1 k 100 1 3600000000")[1], 4);
    // An empty blob is a full bucket: the key goes.
    redis::cmd("RL.SET").arg("k").arg("").arg(0).query::<()>(&mut con).unwrap();
    assert_eq!(redis::cmd("EXISTS").arg("k").query::<i64>(&mut con).unwrap(), 0);
}

#[test]
fn internal_logadd_validates_its_arguments() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let ok = |con: &mut redis::Connection, args: &[&str]| {
        redis::cmd("RL.LOGADD").arg(args).query::<()>(con).unwrap();
    };
    ok(&mut con, &["log", "0", "5000", "2", "4000000000000"]);
    ok(&mut con, &["log", "0", "5000", "1", "4000000000000"]);
    let cases: &[(&[&[u8]], &str)] = &[
        (&[b"log", b"0", b"5000", b"1"], "wrong number of arguments"),
        (&[b"log", b"0", b"5000", b"0", b"0"], "ERR RL.LOGADD count must be an integer from 1 to 1000000"),
        (&[b"log", b"0", b"x", b"1", b"0"], "ERR RL.LOGADD at must be a time"),
        (&[b"log", b"0", b"17592186044416", b"1", b"0"], "ERR RL.LOGADD at must be a time"),
        (&[b"log", b"0", b"4000", b"1", b"4000000000000"], "at is older than the log's newest entry"),
        (&[b"log", b"0", b"6000", b"1", b"-1"], "ERR pxat must be a non-negative integer"),
    ];
    for (args, want) in cases {
        let e = testkit::call_err(&mut con, "RL.LOGADD", args);
        assert!(e.contains(want), "{args:?}: {e}");
    }
    redis::cmd("SET").arg("str").arg("v").query::<()>(&mut con).unwrap();
    let e = testkit::call_err(&mut con, "RL.LOGADD", &[b"str", b"0", b"1", b"1", b"4000000000000"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    // The log holds 3 requests at 5000; dropping before 5001 empties it.
    let blob: Vec<u8> = redis::cmd("DUMP").arg("log").query(&mut con).unwrap();
    assert!(!blob.is_empty());
    ok(&mut con, &["log", "5001", "6000", "1", "4000000000000"]);
    assert_eq!(redis::cmd("PEXPIRETIME").arg("log").query::<i64>(&mut con).unwrap(), 4_000_000_000_000);
    // RL.SET of an EXACT blob and of a window blob replaces the state.
    let mut log_blob = vec![b'L', 1];
    log_blob.extend_from_slice(&(7000u64 | 3 << 44).to_le_bytes());
    redis::cmd("RL.SET").arg("log").arg(&log_blob).arg(4_000_000_000_000i64).query::<()>(&mut con).unwrap();
    assert_eq!(redis::cmd("TYPE").arg("log").query::<String>(&mut con).unwrap(), "rl-winlog");
    let mut bad = log_blob.clone();
    bad.push(1);
    let e = testkit::call_err(&mut con, "RL.SET", &[b"log", &bad, b"0"]);
    assert!(e.contains("wrong length"), "{e}");
}

#[test]
fn a_promoted_replica_continues_from_the_replicated_state() {
    let mut primary = Server::start(&[]);
    let replica = primary.replica(&[]);
    let mut p = primary.con();
    for _ in 0..5 {
        call(&mut p, "RL.TAKE", "1 drained 5 1 3600000");
    }
    call(&mut p, "RL.TAKE", "1 debt 10 1 3600000 COST 25 FORCE");
    for _ in 0..3 {
        call(&mut p, "RL.WINDOW", "1 exact 3 3600000 EXACT");
        call(&mut p, "RL.WINDOW", "1 sliding 3 3600000");
    }
    call(&mut p, "CL.THROTTLE", "cell 2 1 3600 3");
    wait_replicas(&mut p);
    // The primary dies; the replica is promoted.
    primary.kill();
    let mut r = replica.con();
    redis::cmd("REPLICAOF").arg("NO").arg("ONE").query::<()>(&mut r).unwrap();
    assert_eq!(replica.info("replication", "role"), "master");
    // Nothing was reset to full, no debt was forgiven.
    assert_eq!(call(&mut r, "RL.TAKE", "1 drained 5 1 3600000")[..2], [0, 0]);
    let debt = call(&mut r, "RL.TAKE", "1 debt 10 1 3600000");
    assert_eq!(debt[0], 0);
    assert!(debt[2] > 15 * 3_600_000, "15 tokens of debt remain: retry {}", debt[2]);
    assert_eq!(call(&mut r, "RL.WINDOW", "1 exact 3 3600000 EXACT")[..2], [0, 0]);
    assert_eq!(call(&mut r, "RL.WINDOW", "1 sliding 3 3600000")[..2], [0, 0]);
    assert_eq!(call(&mut r, "CL.THROTTLE", "cell 2 1 3600")[0], 1);
}
