//! Exactness under concurrency: 50 connections hammer the same limits for a
//! couple of seconds. Every admission must be accounted for: the buckets'
//! final states satisfy the conservation law exactly, and windows admit
//! exactly their limit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rl_core::codec::{self, Decoded, PackedBucket};
use rl_core::BucketState;
use testkit::{module_blob, server_ms, Server};

const CONNECTIONS: usize = 50;
const RUN: Duration = Duration::from_millis(2_000);

/// Calls `cmd args` from CONNECTIONS connections until RUN has passed;
/// returns (admitted units, calls). `first` of the reply counts as units.
fn hammer(s: &Server, cmd: &str, args: &str) -> (u64, u64) {
    let admitted = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let args: Vec<String> = args.split_whitespace().map(String::from).collect();
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let (admitted, calls, stop, args) = (admitted.clone(), calls.clone(), stop.clone(), args.clone());
            let mut con = s.con();
            let cmd = cmd.to_string();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let r: Vec<i64> = redis::cmd(&cmd).arg(&args).query(&mut con).expect("call");
                    admitted.fetch_add(r[0] as u64, Ordering::Relaxed);
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(RUN);
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|t| t.join().expect("worker"));
    (admitted.load(Ordering::Relaxed), calls.load(Ordering::Relaxed))
}

/// After a hammer: takes one at a time from a single connection until the
/// bucket at index `binding` refuses; returns what that admitted. The
/// hammer's last write may follow a pause of the loaded machine (50 threads
/// on 2 cores), leaving tokens a saturating demand would have taken; after
/// this, the stored level is below one token by the module's own refusal.
fn drain(con: &mut redis::Connection, args: &str, binding: i64) -> u64 {
    let args: Vec<&str> = args.split_whitespace().collect();
    let mut admitted = 0;
    for _ in 0..100_000 {
        let r: Vec<i64> = redis::cmd("RL.TAKE").arg(&args).query(con).expect("call");
        if r[0] == 0 && r[5] == binding {
            return admitted;
        }
        admitted += r[0] as u64;
    }
    panic!("{args:?}: bucket {binding} never refused");
}

fn bucket_state(con: &mut redis::Connection, key: &str) -> BucketState {
    match codec::decode(&module_blob(con, key)) {
        Ok(Decoded::Bucket(p)) => p.unpack(),
        other => panic!("{key}: not a bucket: {other:?}"),
    }
}

/// Starts `key` half full, recorded at server time `t0` (not full: a full
/// bucket drops refill until the first call, which the law would miss).
fn set_half(con: &mut redis::Connection, key: &str, capacity: u64, t0: u64) {
    let blob = PackedBucket::pack(&BucketState { tokens: capacity as i64 / 2, fraction: 0, updated_ms: t0 }).to_blob();
    redis::cmd("RL.SET").arg(key).arg(&blob[..]).arg(t0 + 3_600_000).query::<()>(con).unwrap();
}

#[test]
fn one_bucket_without_refill_admits_exactly_its_capacity() {
    let s = Server::start(&[]);
    let (admitted, calls) = hammer(&s, "RL.TAKE", "1 k 3000 1 3600000000");
    assert!(calls > 3_000, "demand did not exceed the capacity: {calls} calls");
    assert_eq!(admitted, 3_000);
}

/// The conservation law of a bucket refilled during the run, never full:
/// everything it was ever given (its start + refill x elapsed, in units of
/// 1/period) is either admitted or still in it. Exact, to the unit. A
/// `drained` bucket (the binding one, under saturating demand) also holds
/// less than a token: the admitted count is the exact bound.
fn check_conservation(
    con: &mut redis::Connection,
    key: &str,
    (c, r, p): (u64, u64, u64),
    t0: u64,
    admitted: u64,
    drained: bool,
) {
    let s = bucket_state(con, key);
    let level = s.tokens as i128 * p as i128 + s.fraction as i128;
    let supplied = (c / 2 * p) as i128 + (r as i128) * (s.updated_ms - t0) as i128;
    assert_eq!(admitted as i128 * p as i128 + level, supplied, "{key}: {s:?}");
    if drained {
        assert!(level < p as i128, "{key} was not drained: demand never saturated it ({s:?})");
    }
}

#[test]
fn refilled_buckets_account_for_every_token() {
    let s = Server::start(&[]);
    let mut con = s.con();
    // 100 with bursts of 50 a second, 30 a second and 2000 a minute.
    let (c, r, p) = ([100u64, 50, 2000], [100u64, 30, 2000], [1000u64, 1000, 60_000]);
    let keys = ["{c}:a", "{c}:b", "{c}:c"];
    let params = |i: usize| (c[i], r[i], p[i]);
    let t0 = server_ms(&mut con);
    set_half(&mut con, keys[0], c[0], t0);
    let one = format!("1 {} {} {} {}", keys[0], c[0], r[0], p[0]);
    let (admitted_one, calls) = hammer(&s, "RL.TAKE", &one);
    assert!(calls > admitted_one * 2, "demand did not exceed supply: {calls} calls, {admitted_one} admitted");
    let admitted_one = admitted_one + drain(&mut con, &one, 0);
    check_conservation(&mut con, keys[0], params(0), t0, admitted_one, true);
    // The three together, the other two starting now; the 30/s one binds.
    let t1 = server_ms(&mut con);
    set_half(&mut con, keys[1], c[1], t1);
    set_half(&mut con, keys[2], c[2], t1);
    let args = format!(
        "3 {} {} {} {} {} {} {} {} {} {} {} {}",
        keys[0], keys[1], keys[2], c[0], r[0], p[0], c[1], r[1], p[1], c[2], r[2], p[2]
    );
    let (admitted_three, calls) = hammer(&s, "RL.TAKE", &args);
    assert!(calls > admitted_three * 2, "demand did not exceed supply: {calls} calls, {admitted_three} admitted");
    let admitted_three = admitted_three + drain(&mut con, &args, 1);
    check_conservation(&mut con, keys[1], params(1), t1, admitted_three, true);
    check_conservation(&mut con, keys[2], params(2), t1, admitted_three, false);
    // The first bucket (100/s) did not bind: it refills faster than the
    // 30/s one lets it be drained, and is full (no key) soon after the run.
}

#[test]
fn leases_under_concurrency_never_over_grant() {
    let s = Server::start(&[]);
    let (granted, calls) = hammer(&s, "RL.LEASE", "1 k 5000 1 3600000000 WANT 7");
    assert!(calls > 1_000);
    assert_eq!(granted, 5_000);
}

#[test]
fn every_window_mode_admits_exactly_its_limit() {
    let s = Server::start(&[]);
    // Ten-day windows: the run cannot cross a boundary in practice.
    for (key, mode, limit) in [("{w}:s", "SLIDING", 4000), ("{w}:e", "EXACT", 3000), ("{w}:f", "FIXED", 4000)] {
        let (admitted, calls) = hammer(&s, "RL.WINDOW", &format!("1 {key} {limit} 864000000 {mode}"));
        assert!(calls > limit, "{mode}: demand did not exceed the limit ({calls} calls)");
        assert_eq!(admitted, limit, "{mode}");
    }
    // Two windows together: the tighter one holds.
    let (admitted, _) = hammer(&s, "RL.WINDOW", "2 {w}:x {w}:y 2500 864000000 1500 864000000");
    assert_eq!(admitted, 1_500);
    assert_eq!(testkit::call(&mut s.con(), "RL.WINDOWPEEK", "1 {w}:x 2500 864000000")[1], 999);
}
