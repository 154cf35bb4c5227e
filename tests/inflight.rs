//! In-flight limits: RL.ACQUIRE, RL.RELEASE and RL.INFLIGHT against real
//! servers: never more in flight than the limit under 50 connections, slots
//! of a killed holder healing at their deadline, replicas holding the
//! primary's slots, and bad input refused with nothing written.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_core::codec::inflight_blob;
use rl_core::inflight::{Slot, Slots};
use rl_core::limits::{MAX_PERIOD_MS, MAX_TIME_MS};
use testkit::{call_err, dump_with_blob, server_ms, state, Server};

/// `[allowed, in_flight, retry_after_ms, limit, binding, id]`.
type Acquired = (i64, i64, i64, i64, i64, String);

fn acquire(con: &mut redis::Connection, args: &str) -> Acquired {
    let mut c = redis::cmd("RL.ACQUIRE");
    c.arg(args.split_whitespace().collect::<Vec<_>>());
    c.query(con).unwrap_or_else(|e| panic!("RL.ACQUIRE {args}: {e}"))
}

fn release(con: &mut redis::Connection, args: &str) -> i64 {
    redis::cmd("RL.RELEASE").arg(args.split_whitespace().collect::<Vec<_>>()).query(con).unwrap()
}

#[test]
fn acquire_release_and_peek() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let a = acquire(&mut con, "1 f 2 5000 ID req-1");
    assert_eq!(a, (1, 1, 0, 2, 0, "req-1".into()));
    let b = acquire(&mut con, "1 f 2 5000");
    assert_eq!((b.0, b.1), (1, 2));
    assert_eq!(b.5.len(), 32, "a made id: 32 hex characters");
    assert!(b.5.bytes().all(|c| c.is_ascii_hexdigit()));
    let refused = acquire(&mut con, "1 f 2 5000 ID req-3");
    assert_eq!((refused.0, refused.1, refused.3), (0, 2, 2));
    assert!((4_900..=5_000).contains(&refused.2), "retry until the earliest deadline: {}", refused.2);
    // The same id renews its slot: no second slot.
    assert_eq!(acquire(&mut con, "1 f 2 5000 ID req-1").0, 1);
    let peek: Acquired = redis::cmd("RL.INFLIGHT").arg(&["1", "f", "2", "5000"]).query(&mut con).unwrap();
    assert_eq!(peek, (0, 2, peek.2, 2, 0, String::new()));
    assert_eq!(release(&mut con, "1 f ID req-1"), 1);
    assert_eq!(release(&mut con, "1 f ID req-1"), 0, "released twice: a no-op answered 0");
    assert_eq!(release(&mut con, "1 f ID never-held"), 0);
    assert_eq!(release(&mut con, &format!("1 f ID {}", b.5)), 1);
    let exists: i64 = redis::cmd("EXISTS").arg("f").query(&mut con).unwrap();
    assert_eq!(exists, 0, "an empty set is no key");
    assert_eq!(s.info("rl", "rl_release_unknown"), "2");
    // COST: one request that weighs 3 slots; more than a limit never fits.
    assert_eq!(acquire(&mut con, "1 g 5 5000 ID big COST 3").1, 3);
    assert_eq!(acquire(&mut con, "1 g 5 5000 ID huge COST 6").2, -1);
    // All or nothing across keys: per route and per customer at once.
    assert_eq!(acquire(&mut con, "2 {c}:route {c}:cust 10 5000 1 5000 ID x").0, 1);
    assert_eq!(acquire(&mut con, "2 {c}:route {c}:cust 10 5000 1 5000 ID y").4, 1, "the customer key binds");
    let route: Acquired = redis::cmd("RL.INFLIGHT").arg(&["1", "{c}:route", "10", "5000"]).query(&mut con).unwrap();
    assert_eq!(route.1, 2, "one in flight (the refused call took nothing), two once this one would be");
    // The key lives until its latest deadline.
    let pttl: i64 = redis::cmd("PTTL").arg("g").query(&mut con).unwrap();
    assert!((4_000..=5_000).contains(&pttl), "{pttl}");
    assert_eq!(redis::cmd("TYPE").arg("g").query::<String>(&mut con).unwrap(), "rl-flight");
}

/// Field `name` of RL.INSPECT's answer for `key`.
fn inspected(con: &mut redis::Connection, key: &str, name: &str) -> i64 {
    let fields: Vec<redis::Value> = redis::cmd("RL.INSPECT").arg(key).query(con).unwrap();
    let at = fields.iter().position(|v| *v == redis::Value::BulkString(name.as_bytes().to_vec())).unwrap();
    redis::from_redis_value(fields[at + 1].clone()).unwrap()
}

#[test]
fn the_reply_counts_every_slot_held_even_above_a_lowered_limit() {
    let s = Server::start(&[]);
    let mut con = s.con();
    for i in 0..20 {
        assert_eq!(acquire(&mut con, &format!("1 f 20 60000 ID s{i}")).0, 1);
    }
    // The limit lowered to 5 with 20 held: refused, and the reply says 20,
    // as RL.INSPECT does; the wait is until 16 of them reach their deadline.
    let a = acquire(&mut con, "1 f 5 60000 ID new");
    assert_eq!((a.0, a.1, a.3, a.4), (0, 20, 5, 0), "{a:?}");
    assert!((59_000..=60_000).contains(&a.2), "retry_after_ms {}", a.2);
    let peek: Acquired = redis::cmd("RL.INFLIGHT").arg(&["1", "f", "5", "60000"]).query(&mut con).unwrap();
    assert_eq!((peek.0, peek.1, peek.3), (0, 20, 5), "{peek:?}");
    assert_eq!(inspected(&mut con, "f", "in_flight"), 20);
    // A refused renewal: the caller's own slot is still held, and counted.
    let renewal = acquire(&mut con, "1 f 20 60000 ID s0 COST 2");
    assert_eq!((renewal.0, renewal.1), (0, 20), "{renewal:?}");
    // The binding key of two answers for itself.
    let two = acquire(&mut con, "2 g f 100 60000 5 60000 ID new");
    assert_eq!((two.0, two.1, two.3, two.4), (0, 20, 5, 1), "{two:?}");
    // Back under the limit: admitted, and the count after the call.
    for i in 4..20 {
        assert_eq!(release(&mut con, &format!("1 f ID s{i}")), 1);
    }
    assert_eq!(acquire(&mut con, "1 f 5 60000 ID new"), (1, 5, 0, 5, 0, "new".into()));
    assert_eq!(inspected(&mut con, "f", "in_flight"), 5);
}

#[test]
fn fifty_connections_never_see_more_than_the_limit_in_flight() {
    let s = Arc::new(Server::start(&[]));
    let inside = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let admitted = Arc::new(AtomicI64::new(0));
    let first_admitted = Arc::new(AtomicI64::new(0));
    // Every connection asks once and holds what it got until all fifty have
    // asked: the key is loaded to its limit however the threads are
    // scheduled (a busy machine may run them one after another).
    let asked = Arc::new(AtomicI64::new(0));
    let threads: Vec<_> = (0..50)
        .map(|t| {
            let (s, inside, most, admitted) = (s.clone(), inside.clone(), most.clone(), admitted.clone());
            let (first_admitted, asked) = (first_admitted.clone(), asked.clone());
            std::thread::spawn(move || {
                let mut con = s.con();
                let id = format!("t{t}-first");
                let first = acquire(&mut con, &format!("1 hot 20 10000 ID {id}"));
                first_admitted.fetch_add(first.0, Ordering::SeqCst);
                asked.fetch_add(1, Ordering::SeqCst);
                // Not a Barrier: a connection that failed must not hang the rest.
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                while asked.load(Ordering::SeqCst) < 50 && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if first.0 == 1 {
                    assert_eq!(release(&mut con, &format!("1 hot ID {id}")), 1);
                }
                for i in 0..60 {
                    let id = format!("t{t}-{i}");
                    let a = acquire(&mut con, &format!("1 hot 20 10000 ID {id}"));
                    assert!(a.1 <= 20, "the module answered {} in flight", a.1);
                    if a.0 == 1 {
                        // Inside the permit: the shared count never passes 20.
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        admitted.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_micros(200));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        assert_eq!(release(&mut con, &format!("1 hot ID {id}")), 1);
                    }
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(first_admitted.load(Ordering::SeqCst), 20, "fifty asking at once while none gives back: 20 admitted");
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 20, "{most} in flight at once");
    assert!(admitted.load(Ordering::SeqCst) > 300);
    assert_eq!(redis::cmd("EXISTS").arg("hot").query::<i64>(&mut s.con()).unwrap(), 0, "every slot given back");
}

#[test]
fn slots_of_a_killed_holder_heal_at_their_deadline() {
    let s = Server::start(&[]);
    // A real process takes 3 slots and dies without releasing them.
    let mut holder = Command::new("redis-cli")
        .args(["-p", &s.port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-cli");
    {
        use std::io::Write;
        let stdin = holder.stdin.as_mut().unwrap();
        for id in ["a", "b", "c"] {
            writeln!(stdin, "RL.ACQUIRE 1 lost 3 1500 ID {id}").unwrap();
        }
        stdin.flush().unwrap();
    }
    let mut con = s.con();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let peek: Acquired = redis::cmd("RL.INFLIGHT").arg(&["1", "lost", "3", "1500"]).query(&mut con).unwrap();
        if peek.1 == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "the holder never took its slots");
        std::thread::sleep(Duration::from_millis(20));
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
    let start = server_ms(&mut con);
    assert_eq!(acquire(&mut con, "1 lost 3 1500 ID next").0, 0, "still held");
    // The three were taken before `start`, each by its own command (maybe
    // in different milliseconds): all are past their deadline once the
    // server's clock passed start + timeout_ms, and the next call leaves
    // them all out, whatever the machine's load (no timer has to fire on
    // time).
    while server_ms(&mut con) <= start + 1_500 {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(acquire(&mut con, "1 lost 3 1500 ID next").0, 1, "back once timeout_ms passed");
    assert_eq!(s.info("rl", "rl_inflight_healed"), "3", "the lost releases are counted");
}

#[test]
fn an_idle_set_expires_and_its_lost_releases_are_counted() {
    let s = Server::start(&[]);
    let mut con = s.con();
    acquire(&mut con, "1 idle 5 200 ID gone");
    std::thread::sleep(Duration::from_millis(400));
    // Expired by its TTL (the latest deadline): no key, one healed slot.
    assert_eq!(redis::cmd("EXISTS").arg("idle").query::<i64>(&mut con).unwrap(), 0);
    assert_eq!(s.info("rl", "rl_inflight_healed"), "1");
}

#[test]
fn replicas_and_restarts_keep_the_slots() {
    let primary = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = primary.replica(&[]);
    let mut p = primary.con();
    let mut keys = Vec::new();
    for i in 0..10 {
        let k = format!("{{s{i}}}:f");
        for j in 0..(3 + i % 4) {
            acquire(&mut p, &format!("1 {k} 5 {} ID r{j}", 60_000 + 1_000 * i));
            std::thread::sleep(Duration::from_millis(2));
        }
        release(&mut p, &format!("1 {k} ID r1"));
        keys.push(k);
    }
    // Short slots that expire, then a call that leaves them out.
    acquire(&mut p, "1 {s0}:f 5 60000 ID short1 COST 1");
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut p).unwrap();
    let mut r = replica.con();
    let before: Vec<_> = keys.iter().map(|k| state(&mut p, k)).collect();
    for (k, st) in keys.iter().zip(&before) {
        assert!(st.1 > 0, "{k} has an expiry");
        assert_eq!(&state(&mut r, k), st, "{k} on the replica");
    }
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut r).unwrap();
    assert!(stats.contains("cmdstat_rl.slot:") && !stats.contains("cmdstat_rl.acquire:"), "{stats}");
    // DUMP/RESTORE and COPY.
    let dump: Vec<u8> = redis::cmd("DUMP").arg("{s3}:f").query(&mut p).unwrap();
    let at = before[3].1;
    let _: String = redis::cmd("RESTORE").arg("{s3}:copy").arg(at).arg(&dump).arg("ABSTTL").query(&mut p).unwrap();
    assert_eq!(state(&mut p, "{s3}:copy"), before[3]);
    let _: i64 = redis::cmd("COPY").arg("{s3}:f").arg("{s3}:copy2").query(&mut p).unwrap();
    assert_eq!(state(&mut p, "{s3}:copy2"), before[3]);
    // AOF without preamble, rewritten, then a restart; then RDB.
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut p).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while primary.info("persistence", "aof_rewrite_in_progress") != "0"
        || primary.info("persistence", "aof_rewrite_scheduled") != "0"
    {
        assert!(Instant::now() < deadline, "AOF rewrite did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(p);
    let mut primary = primary;
    primary.shutdown("NOSAVE");
    primary.restart();
    let mut p = primary.con();
    for (k, st) in keys.iter().zip(&before) {
        assert_eq!(&state(&mut p, k), st, "{k} after the AOF");
    }
    let _: String = redis::cmd("SAVE").query(&mut p).unwrap();
    let ok: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut p).unwrap();
    assert_eq!(ok, "OK");
    for (k, st) in keys.iter().zip(&before) {
        assert_eq!(&state(&mut p, k), st, "{k} after the RDB");
    }
    // And the slots still count.
    let peek: Acquired = redis::cmd("RL.INFLIGHT").arg(&["1", "{s2}:f", "5", "60000"]).query(&mut p).unwrap();
    assert_eq!(peek.1, 5, "5 taken, 1 released: 4, and 5 once this one would be in");
}

#[test]
fn bad_input_is_refused_and_writes_nothing() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let long_id = "x".repeat(65);
    let cases: &[(&str, &str, &str)] = &[
        ("RL.ACQUIRE", "1 k 0 1000", "ERR limit of key 1 ('k') must be an integer from 1 to 100000, got '0'"),
        ("RL.ACQUIRE", "1 k 20 0", "ERR timeout_ms of key 1 ('k') must be an integer from 1 to"),
        ("RL.ACQUIRE", "1 k 20000 1000", "ERR limit of key 1 ('k') is 20000, above the in-flight maximum of 10000"),
        ("RL.ACQUIRE", "1 k 20 1000 COST 0", "ERR COST must be an integer from 1 to 100000"),
        ("RL.ACQUIRE", "1 k 20 1000 ID", "ERR option ID needs a value"),
        ("RL.ACQUIRE", "1 k 20 1000 ID a ID b", "ERR option ID is given more than once"),
        ("RL.ACQUIRE", &format!("1 k 20 1000 ID {long_id}"), "ERR ID must be 1 to 64 bytes, got 65 bytes"),
        ("RL.ACQUIRE", "2 k k 20 1000 20 1000", "ERR key 'k' is named more than once"),
        ("RL.ACQUIRE", "1 k 20", "ERR key 1 ('k') lacks its limit timeout_ms"),
        ("RL.ACQUIRE", "1 k 20 1000 WAIT 5", "ERR unknown option 'WAIT'"),
        ("RL.RELEASE", "1 k", "ERR RL.RELEASE needs ID id after its keys"),
        ("RL.RELEASE", "2 a b c ID x", "ERR RL.RELEASE takes numkeys key [key ...] ID id; found 'c'"),
        ("RL.RELEASE", "33 k ID x", "ERR numkeys must be an integer from 1 to 32"),
        ("RL.INFLIGHT", "1 k 20 1000 FORCE", "ERR unknown option 'FORCE'"),
        ("RL.SLOT", "k 0 id 1 1", "ERR wrong number of arguments for 'rl.slot'"),
        ("RL.SLOT", "k 0 id 99999999999999999 1 1", "ERR RL.SLOT key 'k': slot id, deadline or count out of range"),
        ("RL.SLOT", "k 0 id 1 1 0", "ERR pxat 0"),
    ];
    for (cmd, args, want) in cases {
        let argv: Vec<&[u8]> = args.split_whitespace().map(str::as_bytes).collect();
        let e = call_err(&mut con, cmd, &argv);
        assert!(e.starts_with(want), "{cmd} {args}: {e}");
    }
    let _: String = redis::cmd("SET").arg("str").arg("v").query(&mut con).unwrap();
    let e = call_err(&mut con, "RL.ACQUIRE", &[b"1", b"str", b"5", b"1000"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    let e = call_err(&mut con, "RL.RELEASE", &[b"1", b"str", b"ID", b"x"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    acquire(&mut con, "1 bucket-like 5 1000");
    let e = call_err(&mut con, "RL.TAKE", &[b"1", b"bucket-like", b"5", b"1", b"1000"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut con).unwrap(), 2, "only str and the one good set");
    // A raised maximum lets a larger limit in; the hard ceiling stays.
    let _: String = redis::cmd("CONFIG").arg("SET").arg("rl.max-inflight-limit").arg(20_000).query(&mut con).unwrap();
    assert_eq!(acquire(&mut con, "1 big 20000 1000").0, 1);
    let e = call_err(&mut con, "CONFIG", &[b"SET", b"rl.max-inflight-limit", b"100001"]);
    assert!(e.starts_with("ERR"), "{e}");
}

fn restore(con: &mut redis::Connection, key: &str, payload: &[u8]) -> redis::RedisResult<String> {
    redis::cmd("RESTORE").arg(key).arg(0).arg(payload).query(con)
}

#[test]
fn restore_and_the_internal_commands_refuse_far_deadlines_and_empty_sets() {
    let s = Server::start(&[]);
    let mut con = s.con();
    acquire(&mut con, "1 f 5 60000 ID a");
    let now = server_ms(&mut con);
    let one = |deadline_ms: u64| {
        inflight_blob(&Slots::from_slots(vec![Slot { id: (*b"a").into(), deadline_ms, count: 1 }]).unwrap())
    };
    let longest = now + MAX_PERIOD_MS;
    // A slot held the longest timeout loads; one in the year 2527 (it would
    // never heal, and the key's TTL would follow it) and one a few days past
    // the longest timeout are refused, as is a set with no slot (the module
    // deletes such a key: it is never written).
    let payload = dump_with_blob(&mut con, "f", &one(longest));
    assert_eq!(restore(&mut con, "ok", &payload).unwrap(), "OK");
    let empty = [b'I', 1];
    for (name, blob) in
        [("y2527", one(MAX_TIME_MS)), ("days", one(longest + 3 * 86_400_000)), ("empty", empty.to_vec())]
    {
        let payload = dump_with_blob(&mut con, "f", &blob);
        let e = restore(&mut con, name, &payload).unwrap_err();
        assert_eq!(e.code(), Some("ERR"), "{name}: {e}");
        let pxat = (now + 60_000).to_string();
        let e = call_err(&mut con, "RL.SET", &[name.as_bytes(), &blob, pxat.as_bytes()]);
        assert!(e.starts_with(&format!("ERR RL.SET key '{name}': state blob")), "{name}: {e}");
    }
    let log = s.log();
    assert!(log.contains("cannot load key 'y2527'") && log.contains("slot deadline"), "{log}");
    assert!(log.contains("cannot load key 'empty'") && log.contains("no slot"), "{log}");
    // RL.SLOT, what replicas and the AOF apply: the same bounds on the
    // deadline and on expired_at (a clock reading).
    let far = (longest + 3 * 86_400_000).to_string();
    let (at, fine) = (now.to_string(), (now + 60_000).to_string());
    for (args, want) in [
        ([&at, "b", &far, "1", &fine], "ERR RL.SLOT key 'f': slot deadline"),
        ([&far, "b", &fine, "1", &fine], "ERR RL.SLOT key 'f': expired_at"),
    ] {
        let argv: Vec<&[u8]> = std::iter::once(&b"f"[..]).chain(args.iter().map(|a| a.as_bytes())).collect();
        let e = call_err(&mut con, "RL.SLOT", &argv);
        assert!(e.starts_with(want), "{args:?}: {e}");
    }
    assert_eq!(inspected(&mut con, "f", "slots"), 1, "nothing written");
    let ok: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(ok, "OK", "what was accepted saves and loads again");
    assert_eq!(inspected(&mut con, "ok", "latest_deadline_ms"), longest as i64);
}
