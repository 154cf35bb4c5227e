//! What an operator relies on: RL.INSPECT decodes any limiter key, today's
//! encodings of every type keep loading (RDB and DUMP fixtures), and a value
//! the module cannot load is named in the server log before it is refused.

use std::collections::HashMap;

use rl_core::codec::PackedBucket;
use rl_core::BucketState;
use testkit::{call, call_err, reseal, server_ms, Server};

/// RL.INSPECT's field/value pairs (nested lists shown as their length).
fn inspect(con: &mut redis::Connection, key: &str) -> HashMap<String, String> {
    let v: Vec<redis::Value> = redis::cmd("RL.INSPECT").arg(key).query(con).unwrap();
    v.chunks(2)
        .map(|pair| {
            let name: String = redis::from_redis_value(pair[0].clone()).unwrap();
            let value = match &pair[1] {
                redis::Value::Int(i) => i.to_string(),
                redis::Value::Array(items) => format!("{} items", items.len()),
                other => redis::from_redis_value::<String>(other.clone()).unwrap(),
            };
            (name, value)
        })
        .collect()
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// What the version-1 fixtures hold, as RL.INSPECT shows it.
fn check_fixture_states(con: &mut redis::Connection) {
    let t = "1764489600000";
    let want: [(&str, &[(&str, &str)]); 4] = [
        ("fixture:bucket", &[("kind", "bucket"), ("tokens", "5"), ("fraction", "123"), ("updated_ms", t)]),
        ("fixture:window", &[("kind", "window"), ("window_start_ms", t), ("previous", "7"), ("current", "3")]),
        ("fixture:log", &[("kind", "exact-log"), ("entries", "2"), ("requests", "3"), ("newest_ms", "1764489600500")]),
        // Two slots a minute's timeout would give at t: long past their
        // deadlines now (the module refuses a deadline it could not have
        // given, such as one in 2100, see tests/inflight.rs).
        (
            "fixture:inflight",
            &[
                ("kind", "inflight"),
                ("slots", "2"),
                ("in_flight", "0"),
                ("expired", "2"),
                ("latest_deadline_ms", "1764489660000"),
                ("slot_list", "2 items"),
            ],
        ),
    ];
    for (key, fields) in want {
        let got = inspect(con, key);
        for (field, value) in fields {
            assert_eq!(got.get(*field).map(String::as_str), Some(*value), "{key} {field}: {got:?}");
        }
        assert_eq!(got["encoding_version"], "1");
        assert_eq!(got["expires_at_ms"], "4102444800000", "{key}");
    }
}

#[test]
fn version_1_of_every_type_loads_from_rdb_and_dump() {
    // Written by Redis 7.0.15 (tests/fixtures/v1-every-type.rdb); expiring in 2100.
    let s = Server::start_from_rdb(&fixture("v1-every-type.rdb"), &[]);
    let mut con = s.con();
    check_fixture_states(&mut con);
    // The same values as DUMP payloads, restored on an empty server.
    let s = Server::start(&[]);
    let mut con = s.con();
    let dumps = std::fs::read_to_string(fixture("v1-dumps.txt")).unwrap();
    let mut restored = 0;
    for line in dumps.lines().filter(|l| !l.starts_with('#')) {
        let (key, hex) = line.split_once(' ').unwrap();
        let payload: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let ok: String = redis::cmd("RESTORE")
            .arg(key)
            .arg(4_102_444_800_000i64)
            .arg(payload)
            .arg("ABSTTL")
            .query(&mut con)
            .unwrap();
        assert_eq!(ok, "OK");
        restored += 1;
    }
    assert_eq!(restored, 4);
    check_fixture_states(&mut con);
    // And they decide from that state: the two expired slots are left out
    // (lost releases, counted) and the acquire holds the only one.
    let acquired: (i64, i64, i64, i64, i64, String) =
        redis::cmd("RL.ACQUIRE").arg(&["1", "fixture:inflight", "5", "1000"]).query(&mut con).unwrap();
    assert_eq!((acquired.0, acquired.1), (1, 1));
    assert_eq!(s.info("rl", "rl_inflight_healed"), "2");
}

#[test]
fn inspect_answers_for_every_kind_and_shows_a_clock_jump() {
    let s = Server::start(&[]);
    let mut con = s.con();
    assert_eq!(inspect(&mut con, "nothing")["kind"], "none");
    call(&mut con, "CL.THROTTLE", "cell 5 1 60");
    let cell = inspect(&mut con, "cell");
    assert_eq!(cell["kind"], "string");
    assert!(cell["value"].parse::<u64>().unwrap() > 1_000_000_000_000_000_000, "{cell:?}");
    let e = call_err(&mut con, "RL.INSPECT", &[b"a", b"b"]);
    assert!(e.starts_with("ERR wrong number of arguments for 'rl.inspect'"), "{e}");
    // Runbook "a clock jump": a bucket stamped an hour ahead shows it...
    let now = server_ms(&mut con);
    let ahead = PackedBucket::pack(&BucketState { tokens: 0, fraction: 0, updated_ms: now + 3_600_000 }).to_blob();
    let _: String = redis::cmd("RL.SET").arg("jumped").arg(&ahead[..]).arg(now + 7_200_000).query(&mut con).unwrap();
    let stamp: i64 = inspect(&mut con, "jumped")["stamped_ahead_ms"].parse().unwrap();
    assert!((3_590_000..=3_600_000).contains(&stamp), "{stamp}");
    // ...and the next call, refused or not, re-stamps it at now.
    call(&mut con, "RL.TAKE", "1 jumped 10 1 1000");
    assert_eq!(inspect(&mut con, "jumped")["stamped_ahead_ms"], "0");
    // On a read-only replica too: RL.INSPECT is read-only.
    let flags: Vec<redis::Value> = redis::cmd("COMMAND").arg("INFO").arg("rl.inspect").query(&mut con).unwrap();
    assert!(format!("{flags:?}").contains("readonly"), "{flags:?}");
}

#[test]
fn a_value_the_module_cannot_load_is_named_in_the_log() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 victim 10 1 60000");
    let mut dump: Vec<u8> = redis::cmd("DUMP").arg("victim").query(&mut con).unwrap();
    // The blob starts with its kind and version: claim version 9.
    let at = dump.windows(2).position(|w| w == [b'B', 1]).expect("the blob's kind and version");
    dump[at + 1] = 9;
    let e = call_err(&mut con, "RESTORE", &[b"patched", b"0", &reseal(dump)]);
    assert!(e.contains("Bad data format"), "{e}");
    let log = s.log();
    assert!(
        log.contains("rl: cannot load key 'patched': rl-bucket blob (kind 'B', version 9): state blob is of a newer format than this module"),
        "{log}"
    );
}

#[test]
fn what_the_upgrade_and_monitoring_runbooks_rely_on() {
    let s = Server::start(&["--enable-module-command", "yes"]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 k 10 1 60000");
    // The module exports data types: it cannot be unloaded (a restart is the
    // rollback).
    let e = call_err(&mut con, "MODULE", &[b"UNLOAD", b"rl"]);
    assert!(e.contains("unload") || e.contains("data types"), "{e}");
    // INFO rl is a modules section: not in plain INFO, in INFO rl, INFO
    // modules and INFO everything.
    let info = |section: &[&str]| -> String { redis::cmd("INFO").arg(section).query(&mut s.con()).unwrap() };
    assert!(!info(&[]).contains("rl_take_calls"));
    for section in [&["rl"][..], &["modules"], &["everything"]] {
        assert!(info(section).contains("rl_take_calls:1"), "INFO {section:?}");
    }
    // CONFIG RESETSTAT resets the server's counters, not the module's (no
    // server event tells a module): scrape them as monotonic counters.
    let _: String = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut con).unwrap();
    assert_eq!(s.info("rl", "rl_take_calls"), "1");
    // Calls refused before the command runs (OOM) are in commandstats'
    // rejected_calls, not in INFO rl.
    let _: String = redis::cmd("CONFIG").arg(&["SET", "maxmemory-policy", "noeviction"]).query(&mut con).unwrap();
    let _: String = redis::cmd("CONFIG").arg(&["SET", "maxmemory", "1"]).query(&mut con).unwrap();
    let e = call_err(&mut con, "RL.TAKE", &[b"1", b"new", b"10", b"1", b"60000"]);
    assert!(e.starts_with("OOM"), "{e}");
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut con).unwrap();
    let line = stats.lines().find(|l| l.starts_with("cmdstat_rl.take:")).unwrap();
    assert!(line.contains("rejected_calls=1"), "{line}");
    assert_eq!(s.info("rl", "rl_take_calls"), "1");
}

#[test]
fn a_replica_with_smaller_options_still_applies_what_the_primary_admitted() {
    let primary = Server::start(&["max-log-limit", "50000"]);
    // Default max-log-limit (10,000): the replicated effects are checked
    // against the hard ceilings, not the options.
    let replica = primary.replica(&[]);
    let mut p = primary.con();
    assert_eq!(call(&mut p, "RL.WINDOW", "1 big 20000 60000 EXACT COST 15000")[0], 1);
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut p).unwrap();
    let mut r = replica.con();
    assert_eq!(testkit::state(&mut r, "big"), testkit::state(&mut p, "big"));
    // But promoted, it would refuse that limit: options must match.
    let e = call_err(&mut r, "RL.WINDOWPEEK", &[b"1", b"big", b"20000", b"60000", b"EXACT"]);
    assert!(e.contains("above the EXACT maximum of 10000"), "{e}");
}

#[test]
fn the_running_version_is_the_crates_in_module_list_and_info_rl() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let version = env!("CARGO_PKG_VERSION");
    let number: i64 = version.split('.').map(|p| p.parse::<i64>().unwrap()).fold(0, |n, p| n * 100 + p);
    // MODULE LIST: [[name, rl, ver, N, ...], ...].
    let modules: Vec<Vec<redis::Value>> = redis::cmd("MODULE").arg("LIST").query(&mut con).unwrap();
    let rl = modules
        .iter()
        .find(|m| m.get(1).and_then(|v| redis::from_redis_value::<String>(v.clone()).ok()).as_deref() == Some("rl"))
        .expect("rl in MODULE LIST");
    let ver: i64 = redis::from_redis_value(rl[3].clone()).unwrap();
    assert_eq!(ver, number, "MODULE LIST ver of {version}");
    let info: String = redis::cmd("INFO").arg("rl").query(&mut con).unwrap();
    assert!(info.contains(&format!("rl_version:{version}\r\n")), "{info}");
    assert!(info.contains("rl_encoding_version:1\r\n"), "{info}");
}
