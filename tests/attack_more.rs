//! A second outside attack: load arguments given twice, a FIXED window whose
//! length changes, and the server's own guards (key patterns of ACL users,
//! scripts, out of memory, crafted DUMP payloads of every native type) seen
//! through the module's commands.

use testkit::{call, server_ms, Server};

#[test]
fn a_load_option_given_twice_is_refused() {
    let log = Server::refused(&["max-log-limit", "5", "max-log-limit", "6"]);
    assert!(log.contains("module option 'max-log-limit' is given more than once"), "{log}");
    let log = Server::refused(&["max-inflight-limit", "5", "MAX-INFLIGHT-LIMIT", "5"]);
    assert!(log.contains("module option 'max-inflight-limit' is given more than once"), "{log}");
}

/// (window_start_ms, current, PEXPIRETIME) of a window key.
fn window(con: &mut redis::Connection, key: &str) -> (u64, u64, u64) {
    let fields: Vec<redis::Value> = redis::cmd("RL.INSPECT").arg(key).query(con).unwrap();
    let field = |name: &str| -> u64 {
        let at = fields.iter().position(|v| *v == redis::Value::BulkString(name.as_bytes().to_vec())).unwrap();
        redis::from_redis_value(fields[at + 1].clone()).unwrap()
    };
    let at: u64 = redis::cmd("PEXPIRETIME").arg(key).query(con).unwrap();
    (field("window_start_ms"), field("current"), at)
}

#[test]
fn a_fixed_window_made_longer_still_ends_at_its_epoch_boundary() {
    let s = Server::start(&[]);
    let mut con = s.con();
    const DAY: u64 = 86_400_000;
    // A 1-second window, then the same key as a daily quota: the second
    // counts in the day's window, which ends at UTC midnight, not a day
    // after the second's start.
    assert_eq!(call(&mut con, "RL.WINDOW", "1 q 10 1000 FIXED")[0], 1);
    let r = call(&mut con, "RL.WINDOW", &format!("1 q 10 {DAY} FIXED"));
    let midnight = server_ms(&mut con) / DAY * DAY + DAY;
    assert_eq!(r[..2], [1, 8], "the earlier request still counts");
    assert!(r[3] as u64 <= midnight - server_ms(&mut con) + 5, "reset_after_ms {} past midnight", r[3]);
    assert_eq!(window(&mut con, "q"), (midnight - DAY, 2, midnight));
    // Full: refused until midnight, and the wait says so.
    assert_eq!(call(&mut con, "RL.WINDOW", &format!("1 q 10 {DAY} FIXED COST 8"))[0], 1);
    let r = call(&mut con, "RL.WINDOW", &format!("1 q 10 {DAY} FIXED"));
    assert_eq!(r[0], 0);
    assert!(r[2] as u64 <= midnight - server_ms(&mut con) + 5, "retry_after_ms {} past midnight", r[2]);
}
