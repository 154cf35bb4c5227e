//! Bucket commands (RL.TAKE, RL.PEEK, RL.LEASE, RL.REFUND) against a real
//! redis-server with the module.
//!
//! Buckets here refill slowly (one token an hour) unless a test is about
//! refill, so the live server clock cannot move a result between calls.

use redis::Value;
use testkit::{call, call_err, Server};

const HOUR: i64 = 3_600_000;

fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).unwrap() == 1
}

fn digest(con: &mut redis::Connection, key: &str) -> Vec<String> {
    redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(con).unwrap()
}

fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).unwrap()
}

#[test]
fn new_bucket_starts_full_and_counts_down() {
    let s = Server::start(&[]);
    let mut con = s.con();
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 3 1 3600000"), [1, 2, 0, HOUR, 3, 0]);
    let r = call(&mut con, "RL.TAKE", "1 k 3 1 3600000");
    assert_eq!((r[0], r[1], r[2], r[4], r[5]), (1, 1, 0, 3, 0));
    assert!(r[3] > HOUR && r[3] <= 2 * HOUR, "reset {}", r[3]);
    let r = call(&mut con, "RL.TAKE", "1 k 3 1 3600000");
    assert_eq!((r[0], r[1], r[2]), (1, 0, 0));
    // Empty: refused, told when one token will be back.
    let r = call(&mut con, "RL.TAKE", "1 k 3 1 3600000");
    assert_eq!((r[0], r[1], r[4], r[5]), (0, 0, 3, 0));
    assert!(r[2] > HOUR - 60_000 && r[2] <= HOUR, "retry {}", r[2]);
    assert!(r[3] > 3 * HOUR - 60_000 && r[3] <= 3 * HOUR, "reset {}", r[3]);
}

#[test]
fn resp3_reply_is_the_same_six_integers() {
    let s = Server::start(&[]);
    let mut con = s.con_resp3();
    let v: Value = redis::cmd("RL.TAKE").arg(&["1", "k", "5", "1", "3600000"]).query(&mut con).unwrap();
    let Value::Array(items) = v else { panic!("not an array: {v:?}") };
    let ints: Vec<i64> = items
        .iter()
        .map(|i| match i {
            Value::Int(n) => *n,
            other => panic!("not an integer: {other:?}"),
        })
        .collect();
    assert_eq!(ints, [1, 4, 0, HOUR, 5, 0]);
}

#[test]
fn cost_is_taken_from_every_bucket_or_none() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let r = call(&mut con, "RL.TAKE", "2 {u}a {u}b 10 1 3600000 3 1 3600000 COST 2");
    assert_eq!((r[0], r[1], r[4], r[5]), (1, 1, 3, 1));
    // b holds 1: refused, and a keeps its 8.
    let r = call(&mut con, "RL.TAKE", "2 {u}a {u}b 10 1 3600000 3 1 3600000 cost 2");
    assert_eq!((r[0], r[1], r[4], r[5]), (0, 1, 3, 1));
    assert_eq!(call(&mut con, "RL.PEEK", "1 {u}a 10 1 3600000")[1], 7);
    // More than a bucket can ever hold: -1.
    let r = call(&mut con, "RL.TAKE", "2 {u}a {u}b 10 1 3600000 3 1 3600000 COST 4");
    assert_eq!((r[0], r[2], r[4], r[5]), (0, -1, 3, 1));
}

#[test]
fn binding_names_the_rule_that_refused_or_is_tightest() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // Per second, per minute, per hour: the hour rule is tightest.
    let args = "3 {u}s {u}m {u}h 100 100 1000 50 50 60000 2 2 3600000";
    let r = call(&mut con, "RL.TAKE", args);
    assert_eq!((r[0], r[1], r[4], r[5]), (1, 1, 2, 2));
    call(&mut con, "RL.TAKE", args);
    let r = call(&mut con, "RL.TAKE", args);
    assert_eq!((r[0], r[1], r[4], r[5]), (0, 0, 2, 2));
    assert!(r[2] > 0 && r[2] <= 1_800_000);
}

#[test]
fn refused_call_writes_nothing() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 k 1 1 3600000");
    let before = (digest(&mut con, "k"), s.info("persistence", "rdb_changes_since_last_save"));
    let ttl = redis::cmd("PEXPIRETIME").arg("k").query::<i64>(&mut con).unwrap();
    for _ in 0..10 {
        assert_eq!(call(&mut con, "RL.TAKE", "1 k 1 1 3600000")[0], 0);
    }
    let after = (digest(&mut con, "k"), s.info("persistence", "rdb_changes_since_last_save"));
    assert_eq!(before, after);
    assert_eq!(redis::cmd("PEXPIRETIME").arg("k").query::<i64>(&mut con).unwrap(), ttl);
}

#[test]
fn key_expires_when_the_bucket_would_be_full() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let server_ms = |con: &mut redis::Connection| testkit::server_ms(con) as i64;
    let expires = |con: &mut redis::Connection| -> i64 { redis::cmd("PEXPIRETIME").arg("k").query(con).unwrap() };
    // 2 tokens, one back every 100 ms: after one take, full in 100 ms.
    let before = server_ms(&mut con);
    let r = call(&mut con, "RL.TAKE", "1 k 2 1 100");
    let after = server_ms(&mut con);
    assert_eq!(r[3], 100);
    assert!((before + 100..=after + 100).contains(&expires(&mut con)));
    // Empty it: full again 200 ms after this call.
    let before = server_ms(&mut con);
    let r = call(&mut con, "RL.TAKE", "1 k 2 1 100");
    let after = server_ms(&mut con);
    assert!(r[3] > 100 && r[3] <= 200);
    let at = expires(&mut con);
    assert!((before + r[3]..=after + r[3]).contains(&at), "{before} {at} {after}");
    while server_ms(&mut con) <= at + 20 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!exists(&mut con, "k"), "a full bucket is no key");
    // And a missing key is a full bucket.
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 2 1 100")[1], 1);
}

#[test]
fn refill_is_continuous() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // 5 tokens, one back every 50 ms.
    for _ in 0..5 {
        assert_eq!(call(&mut con, "RL.TAKE", "1 k 5 1 50")[0], 1);
    }
    let r = call(&mut con, "RL.TAKE", "1 k 5 1 50");
    assert_eq!(r[0], 0);
    std::thread::sleep(std::time::Duration::from_millis(r[2] as u64 + 5));
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 5 1 50")[0], 1);
}

#[test]
fn parameters_may_change_between_calls() {
    let s = Server::start(&[]);
    let mut con = s.con();
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 100 1 3600000")[1], 99);
    // Lowered capacity clamps the level, then the call takes one.
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 10 1 3600000")[1], 9);
    // Raised capacity does not fill the bucket: the new rate applies from now.
    let r = call(&mut con, "RL.TAKE", "1 k 1000 1 3600000");
    assert_eq!((r[1], r[4]), (8, 1000));
    // A new period keeps the whole tokens.
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 1000 1 86400000")[1], 7);
}

#[test]
fn peek_answers_as_take_would_and_writes_nothing() {
    let s = Server::start(&[]);
    let mut con = s.con();
    assert_eq!(call(&mut con, "RL.PEEK", "1 k 3 1 3600000"), [1, 2, 0, HOUR, 3, 0]);
    assert!(!exists(&mut con, "k"));
    assert_eq!(s.info("persistence", "rdb_changes_since_last_save"), "0");
    for _ in 0..3 {
        call(&mut con, "RL.TAKE", "1 k 3 1 3600000");
    }
    let peek = call(&mut con, "RL.PEEK", "1 k 3 1 3600000 COST 1");
    let take = call(&mut con, "RL.TAKE", "1 k 3 1 3600000");
    assert_eq!((peek[0], peek[1], peek[4], peek[5]), (0, 0, 3, 0));
    assert_eq!((take[0], take[1], take[4], take[5]), (0, 0, 3, 0));
    assert!((peek[2] - take[2]).abs() < 1000);
}

#[test]
fn wrong_type_is_refused_and_nothing_is_written() {
    let s = Server::start(&[]);
    let mut con = s.con();
    redis::cmd("SET").arg("{u}s").arg("v").query::<()>(&mut con).unwrap();
    for cmd in ["RL.TAKE", "RL.PEEK"] {
        let e = call_err(&mut con, cmd, &[b"2", b"{u}b", b"{u}s", b"5", b"1", b"1000", b"5", b"1", b"1000"]);
        assert!(e.starts_with("WRONGTYPE"), "{e}");
    }
    assert!(!exists(&mut con, "{u}b"), "the first bucket was not written");
    assert_eq!(redis::cmd("GET").arg("{u}s").query::<String>(&mut con).unwrap(), "v");
}

#[test]
fn bad_arguments_get_errors_that_name_them() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let cases: &[(&[&[u8]], &str)] = &[
        (&[], "ERR numkeys is missing"),
        (&[b"0", b"k", b"1", b"1", b"1"], "ERR numkeys must be an integer from 1 to 32"),
        (&[b"33"], "ERR numkeys must be an integer from 1 to 32"),
        (&[b"2", b"k"], "ERR numkeys is 2 but only 1 argument follows it"),
        (&[b"1", b"k", b"10", b"1"], "ERR key 1 ('k') lacks its capacity refill period_ms"),
        (&[b"1", b"k", b"0", b"1", b"1"], "ERR capacity of key 1 ('k') must be an integer"),
        (&[b"1", b"k", b"-3", b"1", b"1"], "ERR capacity of key 1 ('k') must be an integer"),
        (&[b"1", b"k", b"1", b"nan", b"1"], "ERR refill of key 1 ('k') must be an integer"),
        (&[b"1", b"k", b"1", b"1", b"inf"], "ERR period_ms of key 1 ('k') must be an integer"),
        (&[b"1", b"k", b"1", b"1", b"1.5"], "ERR period_ms of key 1 ('k') must be an integer"),
        (&[b"1", b"k", b"99999999999999999999999", b"1", b"1"], "ERR capacity of key 1 ('k') must be an integer"),
        (&[b"1", b"k", b"1", b"1", b"1", b"COST"], "ERR option COST needs a value"),
        (&[b"1", b"k", b"1", b"1", b"1", b"COST", b"0"], "ERR COST must be an integer from 1 to"),
        (&[b"1", b"k", b"1", b"1", b"1", b"COST", b"1", b"COST", b"1"], "ERR option COST is given more than once"),
        (&[b"1", b"k", b"1", b"1", b"1", b"BURST", b"1"], "ERR unknown option 'BURST'"),
        (&[b"1", b"k", b"1", b"1", b"1", b"4"], "ERR too many numbers: 1 key takes 3"),
        (&[b"2", b"k", b"k", b"1", b"1", b"1", b"1", b"1", b"1"], "ERR key 'k' is named more than once"),
        (&[b"1", b"k\r\n\x00", b"x", b"1", b"1"], "ERR capacity of key 1 ('k\\x0d\\x0a\\x00')"),
    ];
    for cmd in ["RL.TAKE", "RL.PEEK"] {
        for (args, want) in cases {
            let e = call_err(&mut con, cmd, args);
            assert!(e.contains(want), "{cmd} {args:?}: got {e:?}, want {want:?}");
        }
    }
    let keys: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(keys, 0, "no error wrote anything");
    assert_eq!(s.info("rl", "rl_take_errors"), cases.len().to_string());
}

#[test]
fn largest_values_are_accepted() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let r = call(&mut con, "RL.TAKE", "1 k 100000000000000 100000000000000 63072000000 COST 100000000000000");
    assert_eq!((r[0], r[1], r[4]), (1, 0, 100_000_000_000_000));
    // One token every two years on a huge bucket: waits are capped, not overflowed.
    let r = call(&mut con, "RL.TAKE", "1 slow 100000000000000 1 63072000000 COST 100000000000000");
    assert_eq!((r[0], r[3]), (1, 1_000_000_000_000_000));
    assert!(pttl(&mut con, "slow") > 0);
}

#[test]
fn getkeys_returns_exactly_the_keys() {
    let s = Server::start(&[]);
    let mut con = s.con();
    for cmd in ["RL.TAKE", "RL.PEEK", "RL.LEASE", "RL.REFUND", "RL.WINDOW", "RL.WINDOWPEEK"] {
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg(&["GETKEYS", cmd, "3", "a", "b", "c", "1", "1", "1", "1", "1", "1", "1", "1", "1", "COST", "1"])
            .query(&mut con)
            .unwrap();
        assert_eq!(keys, ["a", "b", "c"]);
        // A numkeys beyond the arguments declares nothing (and crashes nothing).
        let r = redis::cmd("COMMAND").arg(&["GETKEYS", cmd, "9", "a"]).query::<Vec<String>>(&mut con);
        assert!(r.is_err());
    }
    let keys: Vec<String> =
        redis::cmd("COMMAND").arg(&["GETKEYS", "RL.SET", "a", "x", "0", "b", "y", "0"]).query(&mut con).unwrap();
    assert_eq!(keys, ["a", "b"]);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&["GETKEYS", "RL.LOGADD", "a", "0", "1", "1", "0", "b", "0", "1", "1", "0"])
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, ["a", "b"]);
    let keys: Vec<String> =
        redis::cmd("COMMAND").arg(&["GETKEYS", "CL.THROTTLE", "a", "1", "1", "1"]).query(&mut con).unwrap();
    assert_eq!(keys, ["a"]);
}

#[test]
fn command_flags() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let flags = |con: &mut redis::Connection, cmd: &str| -> Vec<String> {
        let v: Value = redis::cmd("COMMAND").arg("INFO").arg(cmd).query(con).unwrap();
        let Value::Array(outer) = v else { panic!() };
        let Value::Array(info) = &outer[0] else { panic!("{outer:?}") };
        let Value::Array(flags) = &info[2] else { panic!("{info:?}") };
        flags.iter().map(|f| redis::from_redis_value_ref::<String>(f).unwrap()).collect()
    };
    let take = flags(&mut con, "rl.take");
    for f in ["write", "denyoom", "fast", "movablekeys", "module"] {
        assert!(take.contains(&f.to_string()), "rl.take flags {take:?} lack {f}");
    }
    let peek = flags(&mut con, "rl.peek");
    for f in ["readonly", "fast", "movablekeys"] {
        assert!(peek.contains(&f.to_string()), "rl.peek flags {peek:?} lack {f}");
    }
    assert!(!peek.contains(&"write".to_string()));
}

#[test]
fn info_counts_calls_per_command() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 k 1 1 3600000");
    call(&mut con, "RL.TAKE", "1 k 1 1 3600000");
    call(&mut con, "RL.PEEK", "1 k 1 1 3600000");
    let _ = call_err(&mut con, "RL.TAKE", &[b"x"]);
    assert_eq!(s.info("rl", "rl_take_calls"), "3");
    assert_eq!(s.info("rl", "rl_take_allowed"), "1");
    assert_eq!(s.info("rl", "rl_take_denied"), "1");
    assert_eq!(s.info("rl", "rl_take_errors"), "1");
    assert_eq!(s.info("rl", "rl_peek_calls"), "1");
    assert_eq!(s.info("rl", "rl_peek_denied"), "1");
}

#[test]
fn a_bucket_is_smaller_than_the_lua_hash_it_replaces() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 bucket:user:1729 200 100 1000");
    // What the Lua token-bucket script keeps: a hash of tokens and timestamp.
    redis::cmd("HSET")
        .arg(&["lua:user:1729", "tokens", "199.337", "ts", "1764489600123"])
        .query::<()>(&mut con)
        .unwrap();
    redis::cmd("PEXPIRE").arg("lua:user:1729").arg(10_000).query::<()>(&mut con).unwrap();
    let ours: i64 = redis::cmd("MEMORY").arg(&["USAGE", "bucket:user:1729"]).query(&mut con).unwrap();
    let lua: i64 = redis::cmd("MEMORY").arg(&["USAGE", "lua:user:1729"]).query(&mut con).unwrap();
    eprintln!("MEMORY USAGE: native bucket {ours} B, Lua hash {lua} B");
    assert!(ours < lua, "native {ours} >= hash {lua}");
}

#[test]
fn copy_dump_restore_and_debug_reload_keep_the_bucket() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 k 10 1 3600000 COST 4");
    let d = digest(&mut con, "k");
    redis::cmd("COPY").arg("k").arg("k2").query::<()>(&mut con).unwrap();
    assert_eq!(digest(&mut con, "k2"), d);
    assert!(pttl(&mut con, "k2") > 0, "COPY keeps the TTL");
    assert_eq!(call(&mut con, "RL.PEEK", "1 k2 10 1 3600000")[1], 5);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut con).unwrap();
    redis::cmd("RESTORE").arg("k3").arg(HOUR).arg(dump).query::<()>(&mut con).unwrap();
    assert_eq!(digest(&mut con, "k3"), d);
    redis::cmd("DEBUG").arg("RELOAD").query::<()>(&mut con).unwrap();
    assert_eq!(digest(&mut con, "k"), d);
    assert_eq!(call(&mut con, "RL.PEEK", "1 k 10 1 3600000")[1], 5);
    // A bucket used where another command expects a string.
    let e = call_err(&mut con, "GET", &[b"k"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
}

#[test]
fn cluster_refuses_keys_of_different_slots() {
    let s = Server::start(&["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]);
    let mut con = s.con();
    redis::cmd("CLUSTER").arg(&["ADDSLOTSRANGE", "0", "16383"]).query::<()>(&mut con).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.info("cluster", "cluster_enabled") != "1" || !cluster_ok(&mut con) {
        assert!(std::time::Instant::now() < deadline, "cluster did not come up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for (cmd, group, opt) in [
        ("RL.TAKE", "5 1 1000", ""),
        ("RL.PEEK", "5 1 1000", ""),
        ("RL.LEASE", "5 1 1000", "WANT 2"),
        ("RL.REFUND", "5 1 1000", "TOKENS 1"),
        ("RL.WINDOW", "5 1000", "EXACT"),
        ("RL.WINDOWPEEK", "5 1000", ""),
    ] {
        let args = format!("2 a b {group} {group} {opt}");
        let args: Vec<&[u8]> = args.split_whitespace().map(str::as_bytes).collect();
        let e = call_err(&mut con, cmd, &args);
        assert!(e.contains("CROSSSLOT"), "{cmd}: {e}");
        // Same slot: served (LEASE answers with the tokens granted).
        assert!(call(&mut con, cmd, &format!("2 {{u}}{cmd}a {{u}}{cmd}b {group} {group} {opt}"))[0] >= 1, "{cmd}");
    }
    let e = call_err(&mut con, "RL.SET", &[b"a", b"", b"0", b"b", b"", b"0"]);
    assert!(e.contains("CROSSSLOT"), "RL.SET: {e}");
}

fn cluster_ok(con: &mut redis::Connection) -> bool {
    let info: String = redis::cmd("CLUSTER").arg("INFO").query(con).unwrap();
    info.contains("cluster_state:ok")
}

#[test]
fn lease_grants_what_every_bucket_can_give() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // 10 tokens; lease 4, then 4, then the last 2 of a WANT 4.
    assert_eq!(call(&mut con, "RL.LEASE", "1 k 10 1 3600000 WANT 4")[..2], [4, 6]);
    assert_eq!(call(&mut con, "RL.LEASE", "1 k 10 1 3600000 WANT 4")[..2], [4, 2]);
    assert_eq!(call(&mut con, "RL.LEASE", "1 k 10 1 3600000 WANT 4")[..2], [2, 0]);
    // Nothing left: granted 0, retry measured for MIN (1) token.
    let r = call(&mut con, "RL.LEASE", "1 k 10 1 3600000 WANT 4");
    assert_eq!((r[0], r[1], r[4]), (0, 0, 10));
    assert!(r[2] > 0 && r[2] <= HOUR);
    // The same key serves RL.TAKE.
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 10 1 3600000")[0], 0);
}

#[test]
fn lease_min_refuses_and_writes_nothing() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "2 {u}a {u}b 10 1 3600000 5 1 3600000 COST 3");
    let dirty = s.info("persistence", "rdb_changes_since_last_save");
    // b holds 2: WANT 5 MIN 3 is refused and reports the wait for 3 tokens.
    let r = call(&mut con, "RL.LEASE", "2 {u}a {u}b 10 1 3600000 5 1 3600000 WANT 5 MIN 3");
    assert_eq!((r[0], r[1], r[4], r[5]), (0, 2, 5, 1));
    assert!(r[2] > 0 && r[2] <= HOUR, "one more token: {}", r[2]);
    assert_eq!(s.info("persistence", "rdb_changes_since_last_save"), dirty);
    // WANT 5 MIN 2 gets the 2 b has, from both buckets.
    assert_eq!(call(&mut con, "RL.LEASE", "2 {u}a {u}b 10 1 3600000 5 1 3600000 WANT 5 MIN 2")[..2], [2, 0]);
    assert_eq!(call(&mut con, "RL.PEEK", "1 {u}a 10 1 3600000")[1], 4);
}

#[test]
fn refund_gives_back_up_to_capacity() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "2 {u}a {u}b 10 1 3600000 5 1 3600000 COST 4");
    let r = call(&mut con, "RL.REFUND", "2 {u}a {u}b 10 1 3600000 5 1 3600000 TOKENS 3");
    assert_eq!((r[0], r[1], r[2], r[5]), (1, 4, 0, 1));
    assert_eq!(call(&mut con, "RL.PEEK", "1 {u}a 10 1 3600000")[1], 8);
    // Never above capacity; a full bucket is no key.
    call(&mut con, "RL.REFUND", "2 {u}a {u}b 10 1 3600000 5 1 3600000 TOKENS 100");
    let n: i64 = redis::cmd("EXISTS").arg(&["{u}a", "{u}b"]).query(&mut con).unwrap();
    assert_eq!(n, 0);
    assert_eq!(call(&mut con, "RL.TAKE", "1 {u}b 5 1 3600000")[1], 4);
}

#[test]
fn forced_debit_puts_a_bucket_into_debt() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // 10 tokens, one back every 100 ms; a request settled at 15 tokens.
    let r = call(&mut con, "RL.TAKE", "1 k 10 1 100 COST 15 FORCE");
    assert_eq!((r[0], r[1]), (1, 0));
    assert!(r[3] > 1_400 && r[3] <= 1_500, "15 tokens to refill: reset {}", r[3]);
    // 5 tokens of debt: nothing is admitted until refill pays them back.
    let r = call(&mut con, "RL.TAKE", "1 k 10 1 100");
    assert_eq!(r[0], 0);
    assert!(r[2] > 500 && r[2] <= 600, "retry {}", r[2]);
    std::thread::sleep(std::time::Duration::from_millis(r[2] as u64 + 20));
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 10 1 100")[0], 1);
}

#[test]
fn lease_and_refund_errors() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let cases: &[(&str, &[&[u8]], &str)] = &[
        ("RL.LEASE", &[b"1", b"k", b"10", b"1", b"1000"], "ERR RL.LEASE needs WANT n"),
        ("RL.LEASE", &[b"1", b"k", b"10", b"1", b"1000", b"WANT", b"0"], "ERR WANT must be an integer from 1"),
        (
            "RL.LEASE",
            &[b"1", b"k", b"10", b"1", b"1000", b"WANT", b"2", b"MIN", b"3"],
            "ERR MIN (3) must not exceed WANT (2)",
        ),
        (
            "RL.LEASE",
            &[b"1", b"k", b"10", b"1", b"1000", b"WANT", b"2", b"COST", b"1"],
            "ERR unknown option 'COST' (options: WANT n, MIN n)",
        ),
        ("RL.REFUND", &[b"1", b"k", b"10", b"1", b"1000"], "ERR RL.REFUND needs TOKENS n"),
        ("RL.REFUND", &[b"1", b"k", b"10", b"1", b"1000", b"TOKENS", b"-1"], "ERR TOKENS must be an integer from 1"),
        ("RL.PEEK", &[b"1", b"k", b"10", b"1", b"1000", b"FORCE"], "ERR unknown option 'FORCE' (options: COST n)"),
    ];
    for (cmd, args, want) in cases {
        let e = call_err(&mut con, cmd, args);
        assert!(e.starts_with(want), "{cmd} {args:?}: {e}");
    }
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut con).unwrap(), 0);
}

#[test]
fn acl_category_on_servers_that_support_module_categories() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let categories: Vec<String> = redis::cmd("ACL").arg("CAT").query(&mut con).unwrap();
    let version = s.info("server", "redis_version");
    let modern = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0)).collect::<Vec<_>>() >= vec![7, 4];
    if !categories.contains(&"ratelimit".to_string()) {
        assert!(!modern, "Redis {version} supports module ACL categories but ratelimit is missing");
        eprintln!("server {version}: no module ACL categories, skipped");
        return;
    }
    let mut ours: Vec<String> = redis::cmd("ACL").arg(&["CAT", "ratelimit"]).query(&mut con).unwrap();
    ours.sort();
    assert_eq!(
        ours,
        [
            "cl.throttle",
            "rl.acquire",
            "rl.inflight",
            "rl.lease",
            "rl.peek",
            "rl.refund",
            "rl.release",
            "rl.take",
            "rl.window",
            "rl.windowpeek"
        ]
    );
    // A gateway user with +@ratelimit calls the limiter but cannot forge state.
    redis::cmd("ACL")
        .arg(&["SETUSER", "gateway", "on", ">pw", "~*", "-@all", "+@ratelimit"])
        .query::<()>(&mut con)
        .unwrap();
    redis::cmd("AUTH").arg(&["gateway", "pw"]).query::<()>(&mut con).unwrap();
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 5 1 1000")[0], 1);
    let e = call_err(&mut con, "RL.SET", &[b"k", b"", b"0"]);
    assert!(e.starts_with("NOPERM"), "{e}");
}

#[test]
fn command_docs_and_key_specs_describe_every_command() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let text = |con: &mut redis::Connection, sub: &str, cmd: &str| -> String {
        let v: Value = redis::cmd("COMMAND").arg(sub).arg(cmd).query(con).unwrap();
        format!("{v:?}").replace("bulk-string(", "").replace("simple-string(", "")
    };
    for (cmd, find_keys, access) in [
        ("rl.take", "keynum", "RW"),
        ("rl.peek", "keynum", "RO"),
        ("rl.lease", "keynum", "RW"),
        ("rl.refund", "keynum", "RW"),
        ("rl.window", "keynum", "RW"),
        ("rl.windowpeek", "keynum", "RO"),
        ("cl.throttle", "range", "RW"),
        ("rl.set", "range", "OW"),
        ("rl.logadd", "range", "RW"),
    ] {
        let docs = text(&mut con, "DOCS", cmd);
        assert!(docs.contains("summary") && docs.contains("0.1.0"), "{cmd}: {docs}");
        let info = text(&mut con, "INFO", cmd);
        assert!(info.contains(find_keys) && info.contains(access), "{cmd}: {info}");
    }
    // The server's own arity check is off: the module names what is missing.
    assert_eq!(call_err(&mut con, "RL.TAKE", &[]), "ERR numkeys is missing");
}
