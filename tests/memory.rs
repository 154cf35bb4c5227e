//! Memory pressure: limiter keys are evicted soonest-expiring first under
//! volatile-ttl, and writes are refused cleanly with OOM when nothing can go.

use testkit::{call, call_err, Server};

fn used_memory(s: &Server) -> u64 {
    s.info("memory", "used_memory").parse().unwrap()
}

fn count(con: &mut redis::Connection, pattern: &str) -> usize {
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(con).unwrap();
    keys.len()
}

#[test]
fn volatile_ttl_evicts_the_soonest_full_limiters_first() {
    let s = Server::start(&["--maxmemory-policy", "volatile-ttl"]);
    let mut con = s.con();
    // Buckets that are full again in a minute, and in ten hours; windows
    // whose requests count for a minute, and for a day.
    let mut pipe = redis::pipe();
    for i in 0..2_000 {
        pipe.cmd("RL.TAKE").arg(&["1", &format!("soon:b:{i}"), "10", "1", "60000"]).ignore();
        pipe.cmd("RL.TAKE").arg(&["1", &format!("late:b:{i}"), "10", "1", "36000000"]).ignore();
        pipe.cmd("RL.WINDOW").arg(&["1", &format!("soon:w:{i}"), "10", "60000", "EXACT"]).ignore();
        pipe.cmd("RL.WINDOW").arg(&["1", &format!("late:w:{i}"), "10", "86400000", "EXACT"]).ignore();
    }
    pipe.query::<()>(&mut con).unwrap();
    // Squeeze: a quarter of the limiter memory must go.
    let used = used_memory(&s);
    let base: u64 = {
        let other = Server::start(&[]);
        used_memory(&other)
    };
    let limit = used - (used - base) / 4;
    redis::cmd("CONFIG").arg(&["SET", "maxmemory", &limit.to_string()]).query::<()>(&mut con).unwrap();
    call(&mut con, "RL.TAKE", "1 trigger 10 1 60000");
    let evicted: u64 = s.info("stats", "evicted_keys").parse().unwrap();
    assert!(evicted > 500, "evicted only {evicted}");
    let soon_left = count(&mut con, "soon:*");
    let late_left = count(&mut con, "late:*");
    eprintln!(
        "evicted {evicted}: {} soon-expiring and {} late-expiring keys gone",
        4_000 - soon_left,
        4_000 - late_left
    );
    // volatile-ttl samples keys, so a few late ones may go, but the soon
    // ones go first by far.
    assert!(4_000 - late_left < (4_000 - soon_left) / 10, "soon left {soon_left}, late left {late_left}");
}

#[test]
fn writes_are_refused_with_oom_and_reads_still_answer() {
    let s = Server::start(&["--maxmemory-policy", "noeviction"]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 k 10 1 60000");
    let used = used_memory(&s);
    redis::cmd("CONFIG").arg(&["SET", "maxmemory", &(used / 2).to_string()]).query::<()>(&mut con).unwrap();
    let writes: &[(&str, &[&[u8]])] = &[
        ("RL.TAKE", &[b"1", b"k", b"10", b"1", b"60000"]),
        ("RL.LEASE", &[b"1", b"k", b"10", b"1", b"60000", b"WANT", b"2"]),
        ("RL.REFUND", &[b"1", b"k", b"10", b"1", b"60000", b"TOKENS", b"1"]),
        ("RL.WINDOW", &[b"1", b"w", b"10", b"60000"]),
        ("CL.THROTTLE", &[b"c", b"1", b"1", b"1"]),
        ("RL.SET", &[b"x", b"", b"0"]),
        ("RL.LOGADD", &[b"x", b"0", b"1", b"1", b"0"]),
    ];
    for (cmd, args) in writes {
        let e = call_err(&mut con, cmd, args);
        assert!(e.starts_with("OOM"), "{cmd}: {e}");
    }
    // Read-only peeks still answer; the server is fine once memory allows.
    assert_eq!(call(&mut con, "RL.PEEK", "1 k 10 1 60000")[..2], [1, 8]);
    assert_eq!(call(&mut con, "RL.WINDOWPEEK", "1 w 10 60000")[0], 1);
    redis::cmd("CONFIG").arg(&["SET", "maxmemory", "0"]).query::<()>(&mut con).unwrap();
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 10 1 60000")[..2], [1, 8]);
}
