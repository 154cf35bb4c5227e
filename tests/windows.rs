//! RL.WINDOW and RL.WINDOWPEEK in their three modes against a real server.

use std::time::Duration;

use testkit::{call, call_err, server_ms, Server};

fn memory(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("MEMORY").arg(&["USAGE", key]).query(con).unwrap()
}

#[test]
fn fixed_window_is_a_quota_aligned_to_the_epoch() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // 3 a day: windows end at UTC midnight.
    let day = 86_400_000;
    let before = server_ms(&mut con);
    let r = call(&mut con, "RL.WINDOW", "1 q 3 86400000 FIXED");
    let to_midnight = day - before % day;
    assert_eq!((r[0], r[1], r[4], r[5]), (1, 2, 3, 0));
    assert!(r[3].abs_diff(to_midnight as i64) < 2_000, "reset {} vs {to_midnight}", r[3]);
    call(&mut con, "RL.WINDOW", "1 q 3 86400000 FIXED COST 2");
    let r = call(&mut con, "RL.WINDOW", "1 q 3 86400000 FIXED");
    assert_eq!((r[0], r[1]), (0, 0));
    assert_eq!(r[2], r[3], "retry at the window's end");
    let pexpireat: i64 = redis::cmd("PEXPIRETIME").arg("q").query(&mut con).unwrap();
    assert_eq!(pexpireat as u64 % day, 0, "the key expires at the window's end");
    assert_eq!(call(&mut con, "RL.WINDOW", "1 q 3 86400000 FIXED COST 4")[2], -1);
}

#[test]
fn fixed_window_resets_at_its_boundary() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let r = call(&mut con, "RL.WINDOW", "1 f 1 300 FIXED");
    assert_eq!(r[0], 1);
    let r = call(&mut con, "RL.WINDOW", "1 f 1 300 FIXED");
    if r[0] == 0 {
        std::thread::sleep(Duration::from_millis(r[2] as u64 + 5));
        assert_eq!(call(&mut con, "RL.WINDOW", "1 f 1 300 FIXED")[0], 1);
    }
}

#[test]
fn sliding_window_limits_and_expires() {
    let s = Server::start(&[]);
    let mut con = s.con();
    for left in (0..5).rev() {
        assert_eq!(call(&mut con, "RL.WINDOW", "1 s 5 60000")[..2], [1, left]);
    }
    let r = call(&mut con, "RL.WINDOW", "1 s 5 60000 SLIDING");
    assert_eq!((r[0], r[1], r[4]), (0, 0, 5));
    assert!(r[2] > 0 && r[2] <= 120_000, "retry {}", r[2]);
    let ttl: i64 = redis::cmd("PTTL").arg("s").query(&mut con).unwrap();
    assert!(ttl > 60_000 && ttl <= 120_000, "kept while it weighs: {ttl}");
}

#[test]
fn sliding_retry_is_when_the_estimate_admits() {
    let s = Server::start(&[]);
    let mut con = s.con();
    for _ in 0..3 {
        call(&mut con, "RL.WINDOW", "1 s 3 400");
    }
    let r = call(&mut con, "RL.WINDOW", "1 s 3 400");
    assert_eq!(r[0], 0);
    std::thread::sleep(Duration::from_millis(r[2] as u64 + 5));
    assert_eq!(call(&mut con, "RL.WINDOW", "1 s 3 400")[0], 1);
}

#[test]
fn exact_log_is_exact_and_refusals_cost_no_memory() {
    let s = Server::start(&[]);
    let mut con = s.con();
    for left in (0..4).rev() {
        assert_eq!(call(&mut con, "RL.WINDOW", "1 e 4 500 EXACT")[..2], [1, left]);
    }
    let size = memory(&mut con, "e");
    let mut last = Vec::new();
    for _ in 0..500 {
        last = call(&mut con, "RL.WINDOW", "1 e 4 500 EXACT");
        if last[0] == 1 {
            break; // the window moved on
        }
    }
    if last[0] == 0 {
        assert_eq!(memory(&mut con, "e"), size, "refusals grew the log");
        std::thread::sleep(Duration::from_millis(last[2] as u64 + 5));
        assert_eq!(call(&mut con, "RL.WINDOW", "1 e 4 500 EXACT")[0], 1);
    }
}

#[test]
fn exact_retry_is_the_moment_the_oldest_request_leaves() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.WINDOW", "1 e 2 1000 EXACT");
    std::thread::sleep(Duration::from_millis(300));
    call(&mut con, "RL.WINDOW", "1 e 2 1000 EXACT");
    let r = call(&mut con, "RL.WINDOW", "1 e 2 1000 EXACT");
    assert_eq!(r[0], 0);
    // The first request leaves 1000 ms after it came: at most 700 ms from now.
    assert!(r[2] > 0 && r[2] <= 700, "retry {}", r[2]);
    assert!(r[3] > r[2] && r[3] <= 1000, "reset {}", r[3]);
}

#[test]
fn exact_limit_has_a_configurable_maximum() {
    let s = Server::start(&["--rl.max-log-limit", "100"]);
    let mut con = s.con();
    let e = call_err(&mut con, "RL.WINDOW", &[b"1", b"e", b"101", b"1000", b"EXACT"]);
    assert!(e.starts_with("ERR limit of key 1 ('e') is 101, above the EXACT maximum of 100"), "{e}");
    assert_eq!(call(&mut con, "RL.WINDOW", "1 e 100 1000 EXACT")[0], 1);
    // The counters have no such maximum.
    assert_eq!(call(&mut con, "RL.WINDOW", "1 s 1000000 1000")[0], 1);
    redis::cmd("CONFIG").arg(&["SET", "rl.max-log-limit", "1000"]).query::<()>(&mut con).unwrap();
    assert_eq!(call(&mut con, "RL.WINDOW", "1 e2 101 1000 EXACT")[0], 1);
    let e = call_err(&mut con, "CONFIG", &[b"SET", b"rl.max-log-limit", b"2000000"]);
    assert!(e.contains("rl.max-log-limit"), "{e}");
}

#[test]
fn windows_are_all_or_nothing_across_keys() {
    let s = Server::start(&[]);
    let mut con = s.con();
    for mode in ["SLIDING", "EXACT", "FIXED"] {
        let (a, b) = (format!("{{{mode}}}:min"), format!("{{{mode}}}:hour"));
        let args = format!("2 {a} {b} 10 60000 2 3600000 {mode}");
        assert_eq!(call(&mut con, "RL.WINDOW", &args)[..2], [1, 1]);
        assert_eq!(call(&mut con, "RL.WINDOW", &args)[..2], [1, 0]);
        let r = call(&mut con, "RL.WINDOW", &args);
        assert_eq!((r[0], r[4], r[5]), (0, 2, 1), "{mode}");
        // The minute window kept its 8.
        assert_eq!(call(&mut con, "RL.WINDOWPEEK", &format!("1 {a} 10 60000 {mode}"))[1], 7, "{mode}");
    }
}

#[test]
fn peek_writes_nothing() {
    let s = Server::start(&[]);
    let mut con = s.con();
    for mode in ["SLIDING", "EXACT", "FIXED"] {
        let r = call(&mut con, "RL.WINDOWPEEK", &format!("1 p 3 60000 {mode}"));
        assert_eq!((r[0], r[1], r[4]), (1, 2, 3));
    }
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut con).unwrap(), 0);
    assert_eq!(s.info("persistence", "rdb_changes_since_last_save"), "0");
}

#[test]
fn modes_and_commands_keep_to_their_own_keys() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.WINDOW", "1 counter 5 60000");
    call(&mut con, "RL.WINDOW", "1 log 5 60000 EXACT");
    call(&mut con, "RL.TAKE", "1 bucket 5 1 60000");
    let wrong: &[(&str, &[&[u8]])] = &[
        ("RL.WINDOW", &[b"1", b"log", b"5", b"1000"]),
        ("RL.WINDOW", &[b"1", b"counter", b"5", b"1000", b"EXACT"]),
        ("RL.WINDOW", &[b"1", b"bucket", b"5", b"1000", b"FIXED"]),
        ("RL.TAKE", &[b"1", b"counter", b"5", b"1", b"1000"]),
        ("RL.WINDOWPEEK", &[b"1", b"bucket", b"5", b"1000"]),
    ];
    for (cmd, args) in wrong {
        let e = call_err(&mut con, cmd, args);
        assert!(e.starts_with("WRONGTYPE"), "{cmd} {args:?}: {e}");
    }
    let types: Vec<String> =
        ["counter", "log", "bucket"].iter().map(|k| redis::cmd("TYPE").arg(k).query(&mut con).unwrap()).collect();
    assert_eq!(types, ["rl-window", "rl-winlog", "rl-bucket"]);
}

#[test]
fn window_errors() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let cases: &[(&[&[u8]], &str)] = &[
        (&[b"1", b"w", b"10"], "ERR key 1 ('w') lacks its limit window_ms"),
        (&[b"1", b"w", b"0", b"1000"], "ERR limit of key 1 ('w') must be an integer from 1 to 1000000000000"),
        (&[b"1", b"w", b"10", b"0"], "ERR window_ms of key 1 ('w') must be an integer from 1 to 63072000000"),
        (&[b"1", b"w", b"10", b"1000", b"EXACT", b"FIXED"], "ERR choose one of SLIDING, EXACT and FIXED"),
        (&[b"1", b"w", b"10", b"1000", b"SLIDING", b"SLIDING"], "ERR option SLIDING is given more than once"),
        (&[b"1", b"w", b"10", b"1000", b"10"], "ERR too many numbers: 1 key takes 2 (limit window_ms per key)"),
        (
            &[b"1", b"w", b"10", b"1000", b"BURST"],
            "ERR unknown option 'BURST' (options: COST n, SLIDING, EXACT, FIXED, TIME, REFUND n)",
        ),
        (&[], "ERR numkeys is missing"),
    ];
    for cmd in ["RL.WINDOW", "RL.WINDOWPEEK"] {
        for (args, want) in cases {
            let e = call_err(&mut con, cmd, args);
            assert!(e.starts_with(want), "{cmd} {args:?}: {e}");
        }
    }
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut con).unwrap(), 0);
}

#[test]
fn an_exact_log_costs_memory_per_admitted_millisecond() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.WINDOW", "1 e 1000 60000 EXACT");
    let one = memory(&mut con, "e");
    for _ in 0..200 {
        call(&mut con, "RL.WINDOW", "1 e 1000 60000 EXACT");
        std::thread::sleep(Duration::from_micros(1100));
    }
    let many = memory(&mut con, "e");
    eprintln!("MEMORY USAGE of an EXACT log: {one} B with 1 entry, {many} B with ~200");
    assert!(many > one && many < one + 200 * 8 * 3, "{one} -> {many}");
}

/// RL.WINDOW with TIME and the reading as a string argument.
fn timed(con: &mut redis::Connection, args: &str) -> (Vec<i64>, String) {
    let r = call(con, "RL.WINDOW", &format!("{args} TIME"));
    assert_eq!(r.len(), 7, "TIME adds the server's reading: {r:?}");
    (r[..6].to_vec(), r[6].to_string())
}

#[test]
fn time_answers_the_server_s_reading() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let before = server_ms(&mut con);
    let (r, at) = timed(&mut con, "1 t 5 60000 FIXED");
    let after = server_ms(&mut con);
    assert_eq!(r[..2], [1, 4]);
    let at: u64 = at.parse().unwrap();
    assert!((before..=after).contains(&at), "{before} <= {at} <= {after}");
    let peek: Vec<i64> = call(&mut con, "RL.WINDOWPEEK", "1 t 5 60000 FIXED TIME");
    assert_eq!(peek.len(), 7);
    assert_eq!(call(&mut con, "RL.WINDOW", "1 t 5 60000 FIXED").len(), 6, "six integers unless asked");
}

#[test]
fn refund_gives_back_a_call_s_count_in_every_mode() {
    let s = Server::start(&[]);
    let mut con = s.con();
    for mode in ["FIXED", "SLIDING", "EXACT"] {
        let (a, b) = (format!("{{r{mode}}}:a"), format!("{{r{mode}}}:b"));
        call(&mut con, "RL.WINDOW", &format!("2 {a} {b} 5 3600000 10 3600000 COST 2 {mode}"));
        let (r, at) = timed(&mut con, &format!("2 {a} {b} 5 3600000 10 3600000 COST 3 {mode}"));
        assert_eq!(r[..2], [1, 0], "{mode}: a full");
        // The request was refused elsewhere: its 3 go back to both keys.
        let r = call(&mut con, "RL.WINDOW", &format!("2 {a} {b} 5 3600000 10 3600000 COST 3 {mode} REFUND {at}"));
        assert_eq!(r, [1, 3, 0, r[3], 5, 0], "{mode}: the windows after the refund");
        let peek = call(&mut con, "RL.WINDOWPEEK", &format!("2 {a} {b} 5 3600000 10 3600000 COST 3 {mode}"));
        assert_eq!(peek[..2], [1, 0], "{mode}: room for 3 again");
        assert_eq!(call(&mut con, "RL.WINDOWPEEK", &format!("1 {b} 10 3600000 {mode}"))[1], 7);
        // A refund of more than a key counts gives back what it counts,
        // and a key left with nothing is removed.
        let c = format!("{{r{mode}}}:c");
        let (_, at_c) = timed(&mut con, &format!("1 {c} 10 3600000 COST 2 {mode}"));
        call(&mut con, "RL.WINDOW", &format!("1 {c} 10 3600000 COST 9 {mode} REFUND {at_c}"));
        let exists: i64 = redis::cmd("EXISTS").arg(&c).query(&mut con).unwrap();
        assert_eq!(exists, 0, "{mode}: nothing counted, no key");
        // EXACT gives back only what was logged from the call on: b's
        // first call (COST 2) stays, unless both fell in one millisecond.
        if mode == "EXACT" {
            call(&mut con, "RL.WINDOW", &format!("1 {b} 10 3600000 COST 9 {mode} REFUND {at}"));
            let left = call(&mut con, "RL.WINDOWPEEK", &format!("1 {b} 10 3600000 {mode}"))[1];
            assert!(left == 7 || left == 9, "EXACT b after refunding from the second call on: {left} left");
        }
        // A key that never counted anything stays absent.
        call(&mut con, "RL.WINDOW", &format!("1 {{r{mode}}}:none 10 3600000 {mode} REFUND {at}"));
        let exists: i64 = redis::cmd("EXISTS").arg(format!("{{r{mode}}}:none")).query(&mut con).unwrap();
        assert_eq!(exists, 0);
    }
    let info: String = redis::cmd("INFO").arg("rl").query(&mut con).unwrap();
    let field = |name: &str| {
        info.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))).map(|v| v.trim().parse::<u64>().unwrap())
    };
    // 9 decided calls (allowed), 10 refunds counted only as calls.
    assert_eq!(field("rl_window_allowed"), Some(9), "{info}");
    assert_eq!(field("rl_window_calls"), Some(19), "{info}");
}

#[test]
fn refund_of_a_window_that_has_ended_gives_nothing_back() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // A 200 ms window: counted in one, refunded once the next has begun.
    let (r, at) = timed(&mut con, "1 f 2 200 FIXED COST 2");
    assert_eq!(r[0], 1);
    std::thread::sleep(Duration::from_millis(r[3] as u64 + 5));
    call(&mut con, "RL.WINDOW", "1 f 2 200 FIXED COST 2");
    let r = call(&mut con, "RL.WINDOW", &format!("1 f 2 200 FIXED COST 2 REFUND {at}"));
    assert_eq!(r[1], 0, "the new window's count is not the refunded call's");
    assert_eq!(call(&mut con, "RL.WINDOWPEEK", "1 f 2 200 FIXED")[0], 0);
    // EXACT: the call's entry has left the window; a newer one stays.
    let (_, at) = timed(&mut con, "1 e 1 200 EXACT");
    std::thread::sleep(Duration::from_millis(210));
    assert_eq!(call(&mut con, "RL.WINDOW", "1 e 1 200 EXACT")[0], 1);
    call(&mut con, "RL.WINDOW", &format!("1 e 1 200 EXACT REFUND {at}"));
    assert_eq!(call(&mut con, "RL.WINDOWPEEK", "1 e 1 200 EXACT")[0], 0, "the newer entry still counts");
}

#[test]
fn refund_is_refused_where_it_makes_no_sense() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let now = server_ms(&mut con);
    let err = call_err(&mut con, "RL.WINDOWPEEK", &[b"1", b"k", b"5", b"1000", b"REFUND", now.to_string().as_bytes()]);
    assert!(err.contains("RL.WINDOWPEEK counts nothing"), "{err}");
    let ahead = (now + 2 * 86_400_000).to_string();
    let err = call_err(&mut con, "RL.WINDOW", &[b"1", b"k", b"5", b"1000", b"REFUND", ahead.as_bytes()]);
    assert!(err.contains("more than a day ahead"), "{err}");
    let err = call_err(&mut con, "RL.WINDOW", &[b"1", b"k", b"5", b"1000", b"REFUND", b"soon"]);
    assert!(err.starts_with("ERR REFUND must be an integer"), "{err}");
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut con).unwrap();
    assert_eq!(exists, 0, "a refused call writes nothing");
}
