//! CL.THROTTLE against a real server: redis-cell's replies, redis-cell's
//! keys, the server's clock and effect replication.

use testkit::{call, call_err, Server};

fn throttle(con: &mut redis::Connection, args: &str) -> Vec<i64> {
    call(con, "CL.THROTTLE", args)
}

fn server_ns(con: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(con).unwrap();
    s * 1_000_000_000 + us * 1000
}

#[test]
fn redis_cell_readme_example() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // max_burst 15, 30 per 60 s: limit 16, one token every 2 s.
    assert_eq!(throttle(&mut con, "user123 15 30 60"), [0, 16, 15, -1, 2]);
    assert_eq!(throttle(&mut con, "user123 15 30 60 1"), [0, 16, 14, -1, 4]);
}

#[test]
fn burst_then_limited_with_retry_in_seconds() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // Limit 5, one every 10 s.
    for left in (0..5).rev() {
        let r = throttle(&mut con, "k 4 6 60");
        assert_eq!(r[..4], [0, 5, left, -1]);
    }
    let r = throttle(&mut con, "k 4 6 60");
    assert_eq!(r[..3], [1, 5, 0]);
    assert!((9..=10).contains(&r[3]), "retry {}", r[3]);
    assert!((49..=50).contains(&r[4]), "reset {}", r[4]);
    // A quantity above the limit can never pass: retry -1.
    assert_eq!(throttle(&mut con, "k 4 6 60 6")[..4], [1, 5, 0, -1]);
}

#[test]
fn quantity_zero_peeks_without_writing() {
    let s = Server::start(&[]);
    let mut con = s.con();
    assert_eq!(throttle(&mut con, "k 4 6 60 0"), [0, 5, 5, -1, 0]);
    assert_eq!(redis::cmd("EXISTS").arg("k").query::<i64>(&mut con).unwrap(), 0);
    throttle(&mut con, "k 4 6 60 2");
    assert_eq!(throttle(&mut con, "k 4 6 60 0")[..3], [0, 5, 3]);
}

#[test]
fn keys_written_by_redis_cell_keep_working() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // redis-cell keeps the TAT in ns as a plain string with a TTL: a key
    // whose TAT is 25 s ahead, limit 5 at one per 10 s, has 2.5 tokens left.
    let tat = server_ns(&mut con) + 25_000_000_000;
    redis::cmd("SET").arg("k").arg(tat.to_string()).arg("PX").arg(25_000).query::<()>(&mut con).unwrap();
    let r = throttle(&mut con, "k 4 6 60");
    assert_eq!(r[..4], [0, 5, 1, -1]);
    // The key is still a redis-cell key: a string holding the new TAT.
    let stored: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    let stored: i64 = stored.parse().unwrap();
    assert_eq!(stored, tat + 10_000_000_000);
    let ttl: i64 = redis::cmd("PTTL").arg("k").query(&mut con).unwrap();
    assert!(ttl > 34_000 && ttl <= 35_001, "expiry rounds the TAT up to the ms: pttl {ttl}");
}

#[test]
fn bad_keys_and_arguments() {
    let s = Server::start(&[]);
    let mut con = s.con();
    redis::cmd("SET").arg("text").arg("hello").query::<()>(&mut con).unwrap();
    redis::cmd("HSET").arg("hash").arg("f").arg("v").query::<()>(&mut con).unwrap();
    let e = call_err(&mut con, "CL.THROTTLE", &[b"text", b"1", b"1", b"1"]);
    assert!(e.starts_with("ERR key 'text' holds a string that is not a CL.THROTTLE timestamp"), "{e}");
    let e = call_err(&mut con, "CL.THROTTLE", &[b"hash", b"1", b"1", b"1"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    let cases: &[(&[&[u8]], &str)] = &[
        (&[b"k", b"1", b"1"], "ERR wrong number of arguments for 'cl.throttle'"),
        (&[b"k", b"1", b"1", b"1", b"1", b"1"], "ERR wrong number of arguments for 'cl.throttle'"),
        (&[b"k", b"-1", b"1", b"1"], "ERR max_burst must be a non-negative integer"),
        (&[b"k", b"1", b"0", b"1"], "ERR count_per_period must be at least 1"),
        (&[b"k", b"1", b"1", b"0"], "ERR period must be from 1 to"),
        (&[b"k", b"1", b"1", b"1", b"-1"], "ERR quantity must be a non-negative integer"),
        (&[b"k", b"1", b"1", b"1.5"], "ERR period must be a non-negative integer"),
        (&[b"k", b"1", b"4000000000", b"1"], "ERR count_per_period is too high"),
        (&[b"k", b"9223372036854775807", b"1", b"1"], "ERR max_burst is too large"),
    ];
    for (args, want) in cases {
        let e = call_err(&mut con, "CL.THROTTLE", args);
        assert!(e.starts_with(want), "{args:?}: {e}");
    }
    assert_eq!(redis::cmd("EXISTS").arg("k").query::<i64>(&mut con).unwrap(), 0);
}

/// What redis-cell accepts and answers, found by tests/cell_differential.rs:
/// signed integers ("+5", "-0"), a quantity above the limit however large
/// (refused, never an error) and a key holding a time centuries ahead.
#[test]
fn accepted_and_answered_as_redis_cell_does() {
    let s = Server::start(&[]);
    let mut con = s.con();
    assert_eq!(throttle(&mut con, "sign +5 +1 +3600"), [0, 6, 5, -1, 3600]);
    assert_eq!(throttle(&mut con, "sign 5 1 3600 +2")[..3], [0, 6, 3]);
    assert_eq!(throttle(&mut con, "zero -0 1 3600 -0"), [0, 1, 1, -1, 0]);
    // A quantity above the limit: limited, retry -1, nothing written.
    assert_eq!(throttle(&mut con, "q 1 1 3600 1000000000000"), [1, 2, 2, -1, 0]);
    assert_eq!(throttle(&mut con, "q 1 1 3600 9223372036854775807"), [1, 2, 2, -1, 0]);
    assert_eq!(redis::cmd("EXISTS").arg("q").query::<i64>(&mut con).unwrap(), 0);
    throttle(&mut con, "q 5 1 3600 3");
    assert_eq!(throttle(&mut con, "q 5 1 3600 1000000000000")[..4], [1, 6, 3, -1]);
    // A TAT near the end of i64 time: a bucket empty for centuries.
    redis::cmd("SET").arg("far").arg((i64::MAX - 10).to_string()).query::<()>(&mut con).unwrap();
    let r = throttle(&mut con, "far 1 1 100");
    assert_eq!(r[..3], [1, 2, 0]);
    assert!(r[3] > 7_000_000_000 && r[4] > r[3], "{r:?}");
    // An allowed call whose TAT would pass the year 2262 is refused, by name.
    let e = call_err(&mut con, "CL.THROTTLE", &[b"late", b"0", b"1", b"9000000000"]);
    assert_eq!(e, "ERR max_burst is too large for this period: the key would expire after the year 2262");
    assert_eq!(redis::cmd("EXISTS").arg("late").query::<i64>(&mut con).unwrap(), 0);
    // redis-cell writes such a TAT (a u64): named as what it is.
    redis::cmd("SET").arg("late").arg("10796078482407918492").query::<()>(&mut con).unwrap();
    let e = call_err(&mut con, "CL.THROTTLE", &[b"late", b"0", b"1", b"9000000000", b"0"]);
    assert_eq!(e, "ERR key 'late' holds a time after the year 2262");
}
