//! What must never happen: a crafted payload killing the server, a refusal
//! breaking a WATCH, a changed limit letting a key expire early, an
//! internal command growing a state the loader refuses.

use testkit::{call, call_err, reseal, Server};

#[test]
fn crafted_restore_payloads_are_refused_and_the_server_lives() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 b 10 1 60000");
    call(&mut con, "RL.WINDOW", "1 e 10 60000 EXACT");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("b").query(&mut con).unwrap();
    assert_eq!(redis::cmd("RESTORE").arg("copy").arg(0).arg(&dump).query::<String>(&mut con).unwrap(), "OK");
    // The module opcode after the module id: 0x05 (string buffer).
    let opcode_at = dump.iter().position(|&b| b == 0x05).expect("string opcode");
    let mut variants: Vec<Vec<u8>> = Vec::new();
    for wrong in [0x00u8, 0x01, 0x02, 0x04, 0xff] {
        let mut p = dump.clone();
        p[opcode_at] = wrong;
        variants.push(reseal(p));
    }
    let mut cut = dump.clone();
    cut[opcode_at + 1] = 0x3f; // claims a 63-byte blob
    variants.push(reseal(cut));
    let mut junk = dump.clone();
    junk[opcode_at + 2] = b'Z'; // an unknown blob kind
    variants.push(reseal(junk));
    for (i, p) in variants.iter().enumerate() {
        let e = call_err(&mut con, "RESTORE", &[format!("bad{i}").as_bytes(), b"0", p]);
        assert!(e.contains("Bad data format") || e.starts_with("ERR"), "variant {i}: {e}");
        assert_eq!(redis::cmd("PING").query::<String>(&mut con).unwrap(), "PONG", "variant {i} killed the server");
    }
    assert_eq!(call(&mut con, "RL.PEEK", "1 copy 10 1 60000")[1], 8);
}

#[test]
fn a_refusal_does_not_break_a_watch_and_a_write_does() {
    let s = Server::start(&[]);
    let (mut watcher, mut other) = (s.con(), s.con());
    call(&mut other, "RL.TAKE", "1 w 1 1 60000");
    call(&mut other, "RL.WINDOW", "1 x 1 60000 EXACT");
    call(&mut other, "CL.THROTTLE", "c 0 1 60");
    // EXEC answers nil when a watched key was modified.
    let transaction = |watcher: &mut redis::Connection| -> Option<()> {
        let r: redis::Value = redis::cmd("EXEC").query(watcher).unwrap();
        (r != redis::Value::Nil).then_some(())
    };
    for (key, refused) in [("w", "1 w 1 1 60000"), ("x", "1 x 1 60000 EXACT")] {
        redis::cmd("WATCH").arg(key).query::<()>(&mut watcher).unwrap();
        redis::cmd("MULTI").query::<()>(&mut watcher).unwrap();
        redis::cmd("PING").query::<()>(&mut watcher).unwrap();
        let cmd = if key == "w" { "RL.TAKE" } else { "RL.WINDOW" };
        assert_eq!(call(&mut other, cmd, refused)[0], 0);
        assert!(transaction(&mut watcher).is_some(), "a refusal on {key} broke the WATCH");
    }
    redis::cmd("WATCH").arg("c").query::<()>(&mut watcher).unwrap();
    redis::cmd("MULTI").query::<()>(&mut watcher).unwrap();
    assert_eq!(call(&mut other, "CL.THROTTLE", "c 0 1 60")[0], 1);
    assert!(transaction(&mut watcher).is_some(), "a CL.THROTTLE refusal broke the WATCH");
    // A write does break it.
    redis::cmd("WATCH").arg("fresh").query::<()>(&mut watcher).unwrap();
    redis::cmd("MULTI").query::<()>(&mut watcher).unwrap();
    assert_eq!(call(&mut other, "RL.TAKE", "1 fresh 5 1 60000")[0], 1);
    assert!(transaction(&mut watcher).is_none(), "an allowed call did not signal its write");
}

#[test]
fn a_lowered_rate_does_not_let_a_key_expire_full() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // Drained at 10 a second: the key would be full, and gone, in a second.
    assert_eq!(call(&mut con, "RL.TAKE", "1 p 10 10 1000 COST 10")[0], 1);
    // The limit drops to 1 a second: refused, and the key now lives 10 s.
    let r = call(&mut con, "RL.TAKE", "1 p 10 1 1000 COST 10");
    assert_eq!(r[0], 0);
    let ttl: i64 = redis::cmd("PTTL").arg("p").query(&mut con).unwrap();
    assert!(ttl > 9_000 && ttl <= 10_000, "pttl {ttl}");
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    assert_eq!(call(&mut con, "RL.TAKE", "1 p 10 1 1000 COST 10")[0], 0, "the bucket came back full");
    // Same for a window made longer.
    assert_eq!(call(&mut con, "RL.WINDOW", "1 q 1 1000 EXACT")[0], 1);
    assert_eq!(call(&mut con, "RL.WINDOW", "1 q 1 60000 EXACT")[0], 0);
    let ttl: i64 = redis::cmd("PTTL").arg("q").query(&mut con).unwrap();
    assert!(ttl > 58_000, "pttl {ttl}");
    // With unchanged parameters a refusal writes nothing.
    let dirty = s.info("persistence", "rdb_changes_since_last_save");
    assert_eq!(call(&mut con, "RL.TAKE", "1 p 10 1 1000 COST 10")[0], 0);
    assert_eq!(call(&mut con, "RL.WINDOW", "1 q 1 60000 EXACT")[0], 0);
    assert_eq!(s.info("persistence", "rdb_changes_since_last_save"), dirty);
}

#[test]
fn refunding_a_full_bucket_writes_nothing() {
    let s = Server::start(&[]);
    let mut con = s.con();
    assert_eq!(call(&mut con, "RL.REFUND", "1 nokey 10 1 1000 TOKENS 3")[..2], [1, 10]);
    assert_eq!(s.info("persistence", "rdb_changes_since_last_save"), "0");
    assert_eq!(redis::cmd("EXISTS").arg("nokey").query::<i64>(&mut con).unwrap(), 0);
}

#[test]
fn internal_commands_refuse_what_would_corrupt_state() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let mut blob = vec![b'B', 1];
    blob.extend_from_slice(&1_764_489_600_000u64.to_le_bytes());
    blob.extend_from_slice(&(5u64 << 16).to_le_bytes());
    let e = call_err(&mut con, "RL.SET", &[b"d", &blob, b"4000000000000", b"d", &blob, b"4000000000000"]);
    assert!(e.starts_with("ERR key 'd' is named more than once"), "{e}");
    let e = call_err(
        &mut con,
        "RL.LOGADD",
        &[b"d", b"0", b"1", b"1", b"4000000000000", b"d", b"0", b"2", b"1", b"4000000000000"],
    );
    assert!(e.starts_with("ERR key 'd' is named more than once"), "{e}");
    // 1,000,001 entries of 8 bytes: refused before anything is allocated.
    let mut huge = vec![b'L', 1];
    huge.resize(2 + 8 * 1_000_001, 0);
    let e = call_err(&mut con, "RL.SET", &[b"h", &huge, b"0"]);
    assert!(e.contains("longer than any log may be"), "{e}");
    // pxat 0 (no expiry) is for AOF loading only: a client cannot write a
    // key that never expires, for RL.LOGADD as for RL.SET.
    let e = call_err(&mut con, "RL.LOGADD", &[b"l", b"0", b"5", b"1", b"0"]);
    assert!(e.starts_with("ERR pxat 0"), "{e}");
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut con).unwrap(), 0);
}

#[test]
fn throttle_keys_stay_raw_strings() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "CL.THROTTLE", "c 0 1 60");
    let encoding =
        |con: &mut redis::Connection| -> String { redis::cmd("OBJECT").arg("ENCODING").arg("c").query(con).unwrap() };
    assert_eq!(encoding(&mut con), "raw");
    let dirty = s.info("persistence", "rdb_changes_since_last_save");
    for q in ["1", "0"] {
        assert_eq!(call(&mut con, "CL.THROTTLE", &format!("c 0 1 60 {q}"))[0], if q == "1" { 1 } else { 0 });
        assert_eq!(encoding(&mut con), "raw");
    }
    assert_eq!(s.info("persistence", "rdb_changes_since_last_save"), dirty);
}
