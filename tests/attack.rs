//! The reproducers of an outside attack on the module: every value it
//! accepts must persist and load again, no caller-sized count may stall the
//! server, ACL users get what their categories say, CL.THROTTLE answers
//! sense for any stored value, a stamp from the future does not freeze a
//! limit, and writes are visible to keyspace notifications.

use std::time::Duration;

use rl_core::codec::{self, Decoded, PackedBucket};
use rl_core::BucketState;
use testkit::{call, call_err, module_blob, server_ms, Server};

/// (ACL categories can be set by modules, the `ratelimit` category exists).
fn acl_support(s: &Server) -> (bool, bool) {
    let text: String = redis::cmd("INFO").arg("server").query(&mut s.con()).unwrap();
    if text.contains("valkey_version:") {
        return (true, true);
    }
    let version = s.info("server", "redis_version");
    let v: Vec<u32> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    let at_least = |major: u32, minor: u32| (v[0], v[1]) >= (major, minor);
    (at_least(7, 2), at_least(7, 4))
}

#[test]
fn load_options_are_checked_like_config_set() {
    for bad in ["5000000", "0", "-3", "9223372036854775807", "abc"] {
        let log = Server::refused(&["max-log-limit", bad]);
        assert!(log.contains("max-log-limit must be an integer from 1 to 1000000"), "{bad}: {log}");
    }
    let log = Server::refused(&["max-log-limt", "50"]);
    assert!(log.contains("unknown module option 'max-log-limt' (options: max-log-limit, max-inflight-limit)"), "{log}");
    // The redis.conf line (here as a command-line option): the server's own
    // check names the option and its range.
    let log = Server::refused(&["--rl.max-log-limit", "5000000"]);
    assert!(log.contains("rl.max-log-limit") && log.contains("1000000"), "{log}");
    let log = Server::refused(&["max-log-limit"]);
    assert!(log.contains("module option 'max-log-limit' has no value"), "{log}");

    let s = Server::start(&["max-log-limit", "1000000"]);
    let mut con = s.con();
    let got: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("rl.max-log-limit").query(&mut con).unwrap();
    assert_eq!(got[1], "1000000");
    let e = call_err(&mut con, "CONFIG", &[b"SET", b"rl.max-log-limit", b"5000000"]);
    assert!(e.starts_with("ERR"), "{e}");
    // At the ceiling, the largest admission persists and loads again.
    assert_eq!(call(&mut con, "RL.WINDOW", "1 big 1000000 60000 EXACT COST 1000000")[0], 1);
    assert_eq!(call(&mut con, "RL.WINDOW", "1 big2 1000000 60000 EXACT COST 1000001")[..3], [0, 1000000, -1]);
    let ok: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(ok, "OK");
    assert_eq!(call(&mut con, "RL.WINDOWPEEK", "1 big 1000000 60000 EXACT")[..2], [0, 0]);
}

#[test]
fn internal_commands_take_no_more_groups_than_a_call_has_keys() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let triples = |n: usize| -> Vec<Vec<u8>> {
        (0..n).flat_map(|i| [format!("k{i}").into_bytes(), Vec::new(), b"0".to_vec()]).collect()
    };
    // 60,000 triples blocked the server for seconds: now refused at once.
    for n in [33, 60_000] {
        let args = triples(n);
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        let e = call_err(&mut con, "RL.SET", &args);
        assert_eq!(e, format!("ERR RL.SET takes at most 32 key blob pxat triples, got {n}"));
    }
    let args = triples(32);
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let ok: String = redis::cmd("RL.SET").arg(&args).query(&mut con).unwrap();
    assert_eq!(ok, "OK");
    let mut repeated = triples(32);
    repeated[93] = b"k0".to_vec();
    let args: Vec<&[u8]> = repeated.iter().map(|a| a.as_slice()).collect();
    assert_eq!(call_err(&mut con, "RL.SET", &args), "ERR key 'k0' is named more than once");
    let groups: Vec<Vec<u8>> = (0..33)
        .flat_map(|i| [format!("l{i}"), "0".into(), "1".into(), "1".into(), "0".into()])
        .map(String::into_bytes)
        .collect();
    let args: Vec<&[u8]> = groups.iter().map(|a| a.as_slice()).collect();
    let e = call_err(&mut con, "RL.LOGADD", &args);
    assert_eq!(e, "ERR RL.LOGADD takes at most 32 key drop_before at count pxat groups, got 33");
}

#[test]
fn acl_users_get_what_their_categories_and_rules_say() {
    let s = Server::start(&[]);
    let mut admin = s.con();
    let (categories, ratelimit) = acl_support(&s);
    let user = |name: &str, rules: &str| {
        let mut c = redis::cmd("ACL");
        c.arg("SETUSER").arg(name).arg("on").arg(">pw").arg("~*");
        for r in rules.split_whitespace() {
            c.arg(r);
        }
        let _: String = c.query(&mut s.con()).unwrap();
        let mut con = s.con();
        let _: String = redis::cmd("AUTH").arg(name).arg("pw").query(&mut con).unwrap();
        con
    };
    let denied = |con: &mut redis::Connection, cmd: &str, args: &str| {
        let args: Vec<&[u8]> = args.split_whitespace().map(str::as_bytes).collect();
        let e = call_err(con, cmd, &args);
        assert!(e.starts_with("NOPERM"), "{cmd}: {e}");
    };
    let blob = PackedBucket::pack(&BucketState { tokens: 0, fraction: 0, updated_ms: server_ms(&mut admin) }).to_blob();

    // The recipe that works on every server, 7.0 included.
    let mut gateway =
        user("gateway", "-@all +rl.take +rl.peek +rl.lease +rl.refund +rl.window +rl.windowpeek +cl.throttle +rl.acquire +rl.release +rl.inflight");
    assert_eq!(call(&mut gateway, "RL.TAKE", "1 v 10 1 1000")[0], 1);
    denied(&mut gateway, "RL.SET", "v x 0");
    let mut reader = user(
        "reader",
        "+@all -@write -@dangerous -rl.take -rl.lease -rl.refund -rl.window -cl.throttle -rl.acquire -rl.release -rl.set -rl.logadd -rl.slot",
    );
    denied(&mut reader, "RL.TAKE", "1 v 10 1 1000 FORCE COST 100000000000000");
    denied(&mut reader, "RL.ACQUIRE", "1 f 1 1000");
    denied(&mut gateway, "RL.SLOT", "f 0 x 1 1 1");
    assert_eq!(call(&mut reader, "RL.PEEK", "1 v 10 1 1000")[0], 1);

    let info: redis::Value = redis::cmd("COMMAND").arg("INFO").arg("rl.take").arg("rl.set").query(&mut admin).unwrap();
    let text = format!("{info:?}");
    if !categories {
        // Redis 7.0: no module command is in any category.
        assert!(!text.contains("@write"), "{text}");
        return;
    }
    assert!(text.contains("@write") && text.contains("@fast") && text.contains("@dangerous"), "{text}");
    assert_eq!(text.contains("@ratelimit"), ratelimit, "{text}");
    let mut ro = user("ro", "+@all -@write -@dangerous");
    denied(&mut ro, "RL.TAKE", "1 victim 10 1 1000 FORCE COST 100000000000000");
    denied(&mut ro, "RL.WINDOW", "1 w 10 1000");
    denied(&mut ro, "CL.THROTTLE", "t 1 1 1");
    denied(&mut ro, "RL.SET", "victim x 0");
    denied(&mut ro, "RL.ACQUIRE", "1 f 1 1000");
    denied(&mut ro, "RL.RELEASE", "1 f ID x");
    assert_eq!(call(&mut ro, "RL.PEEK", "1 victim 10 1 1000")[0], 1);
    assert_eq!(call(&mut ro, "RL.WINDOWPEEK", "1 w 10 1000")[0], 1);
    let mut safe = user("safe", "+@all -@dangerous");
    assert_eq!(call(&mut safe, "RL.TAKE", "1 victim 10 1 1000")[0], 1);
    let e = call_err(&mut safe, "RL.SET", &[b"victim", &blob, b"0"]);
    assert!(e.starts_with("NOPERM"), "{e}");
    denied(&mut safe, "RL.LOGADD", "l 0 1 1 0");
    if ratelimit {
        let mut limited = user("limited", "-@all +@ratelimit");
        assert_eq!(call(&mut limited, "RL.TAKE", "1 victim 10 1 1000")[0], 1);
        denied(&mut limited, "RL.SET", "victim x 0");
    }
}

#[test]
fn cl_throttle_answers_sense_for_a_stale_stored_time() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let _: String = redis::cmd("SET").arg("oldtat").arg(1_000_000_000u64).query(&mut con).unwrap();
    let r = call(&mut con, "CL.THROTTLE", "oldtat 0 1 1 5");
    assert_eq!(r, [1, 1, 1, -1, 0], "limited, limit 1, all of it remaining, never, nothing to reset");
}

#[test]
fn a_bucket_stamped_in_the_future_refills_from_now() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let now = server_ms(&mut con);
    let hour = 3_600_000;
    // Empty, stamped an hour ahead (a clock stepped back, or state from a
    // server whose clock ran ahead): RL.SET, then RESTORE of its DUMP.
    let ahead = PackedBucket::pack(&BucketState { tokens: 0, fraction: 0, updated_ms: now + hour }).to_blob();
    let ok: String = redis::cmd("RL.SET").arg("k").arg(&ahead[..]).arg(now + 2 * hour).query(&mut con).unwrap();
    assert_eq!(ok, "OK");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut con).unwrap();
    let ok: String = redis::cmd("RESTORE").arg("restored").arg(0).arg(&dump).query(&mut con).unwrap();
    assert_eq!(ok, "OK");
    for key in ["k", "restored"] {
        // A token a second: refused, and the wait counts from now.
        let r = call(&mut con, "RL.TAKE", &format!("1 {key} 10 1 1000"));
        assert_eq!(r[0], 0, "{key}");
        assert!((1..=1000).contains(&r[2]), "{key}: retry {} ms", r[2]);
        let Decoded::Bucket(b) = codec::decode(&module_blob(&mut con, key)).unwrap() else {
            panic!("{key}: not a bucket")
        };
        let state = b.unpack();
        assert_eq!(state.tokens, 0, "{key}: the level is kept, nothing minted");
        assert!(state.updated_ms <= server_ms(&mut con), "{key}: re-stamped at the server's now");
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
        assert!((0..=10_000).contains(&pttl), "{key}: expires when full under these parameters, {pttl}");
    }
    // The other direction: a stamp in the past refills from that stamp.
    let past = PackedBucket::pack(&BucketState { tokens: 0, fraction: 0, updated_ms: now - 5_000 }).to_blob();
    let _: String = redis::cmd("RL.SET").arg("old").arg(&past[..]).arg(now + hour).query(&mut con).unwrap();
    assert_eq!(call(&mut con, "RL.TAKE", "1 old 10 1 1000 COST 5")[0], 1, "five seconds refilled five tokens");
    // Refill resumes: a second later the re-stamped bucket admits again.
    std::thread::sleep(Duration::from_millis(1_100));
    assert_eq!(call(&mut con, "RL.TAKE", "1 k 10 1 1000")[0], 1);
}

#[test]
fn writes_fire_keyspace_notifications() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let _: String = redis::cmd("CONFIG").arg("SET").arg("notify-keyspace-events").arg("Kgd$").query(&mut con).unwrap();
    let mut sub = s.con();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    let mut next = || {
        let msg = pubsub.get_message().expect("a notification");
        let channel: String = msg.get_channel_name().to_string();
        let event: String = msg.get_payload().unwrap();
        (channel.trim_start_matches("__keyspace@0__:").to_string(), event)
    };
    call(&mut con, "RL.TAKE", "1 b 10 1 1000");
    assert_eq!(next(), ("b".into(), "rl.take".into()));
    call(&mut con, "RL.LEASE", "1 b 10 1 1000 WANT 2");
    assert_eq!(next(), ("b".into(), "rl.lease".into()));
    call(&mut con, "RL.REFUND", "1 b 10 1 1000 TOKENS 3");
    assert_eq!(next(), ("b".into(), "del".into()), "refunded to full: no key");
    call(&mut con, "RL.WINDOW", "1 w 10 1000 EXACT");
    assert_eq!(next(), ("w".into(), "rl.window".into()));
    call(&mut con, "CL.THROTTLE", "t 1 1 1");
    assert_eq!(next(), ("t".into(), "set".into()));
    assert_eq!(next(), ("t".into(), "expire".into()));
    let now = server_ms(&mut con);
    let blob = PackedBucket::pack(&BucketState { tokens: 1, fraction: 0, updated_ms: now }).to_blob();
    let _: String = redis::cmd("RL.SET").arg("x").arg(&blob[..]).arg(now + 60_000).query(&mut con).unwrap();
    assert_eq!(next(), ("x".into(), "rl.set".into()));
    // A refusal writes nothing and fires nothing.
    call(&mut con, "RL.TAKE", "1 x 10 1 1000 COST 5");
    call(&mut con, "RL.PEEK", "1 x 10 1 1000");
    call(&mut con, "RL.TAKE", "1 last 10 1 1000");
    assert_eq!(next(), ("last".into(), "rl.take".into()));
}

#[test]
fn no_client_can_write_a_key_without_expiry() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let now = server_ms(&mut con);
    let blob = PackedBucket::pack(&BucketState { tokens: 1, fraction: 0, updated_ms: now }).to_blob();
    let e = call_err(&mut con, "RL.SET", &[b"k", &blob, b"0"]);
    assert!(e.starts_with("ERR pxat 0 (no expiry) is only accepted while loading the AOF"), "{e}");
    let e = call_err(&mut con, "RL.LOGADD", &[b"l", b"0", b"1", b"1", b"0"]);
    assert!(e.starts_with("ERR pxat 0"), "{e}");
    let exists: i64 = redis::cmd("EXISTS").arg("k").arg("l").query(&mut con).unwrap();
    assert_eq!(exists, 0);
    // "0" with an empty blob deletes: still fine.
    let ok: String = redis::cmd("RL.SET").arg("k").arg("").arg(0).query(&mut con).unwrap();
    assert_eq!(ok, "OK");
}

#[test]
fn a_window_key_switched_between_sliding_and_fixed_counts_by_the_new_mode() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // A one-day window: the calls below all fall in its current window.
    assert_eq!(call(&mut con, "RL.WINDOW", "1 w 10 86400000 SLIDING COST 4")[..2], [1, 6]);
    assert_eq!(call(&mut con, "RL.WINDOW", "1 w 10 86400000 FIXED COST 3")[..2], [1, 3]);
    let pttl: i64 = redis::cmd("PTTL").arg("w").query(&mut con).unwrap();
    assert!(pttl <= 86_400_000, "FIXED expires at the window's end: {pttl}");
    // 7 counted in the current window: a peek of 1 more leaves 2.
    assert_eq!(call(&mut con, "RL.WINDOWPEEK", "1 w 10 86400000 SLIDING")[..2], [1, 2]);
}

#[test]
fn info_shows_decisions_only_for_commands_that_decide() {
    let s = Server::start(&[]);
    let text: String = redis::cmd("INFO").arg("rl").query(&mut s.con()).unwrap();
    for field in ["rl_take_allowed", "rl_take_denied", "rl_set_calls", "rl_set_errors", "rl_logadd_calls"] {
        assert!(text.contains(&format!("{field}:")), "{field} missing:\n{text}");
    }
    for field in ["rl_set_allowed", "rl_set_denied", "rl_logadd_allowed", "rl_logadd_denied"] {
        assert!(!text.contains(field), "{field} shown:\n{text}");
    }
}
