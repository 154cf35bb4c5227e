//! A second outside attack: load arguments given twice, a FIXED window whose
//! length changes, and the server's own guards (key patterns of ACL users,
//! scripts, out of memory, crafted DUMP payloads of every native type) seen
//! through the module's commands.

use rl_core::codec::{log_blob, PackedBucket, PackedWindow};
use rl_core::exact_log::{Entry, Log};
use rl_core::limits::MAX_TIME_MS;
use rl_core::window::WindowState;
use rl_core::BucketState;
use testkit::{call, call_err, dump_with_blob, server_ms, Server};

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
    // Not across midnight: both calls must fall in the same day.
    let left = DAY - server_ms(&mut con) % DAY;
    if left < 5_000 {
        std::thread::sleep(std::time::Duration::from_millis(left + 100));
    }
    // A 1-second window, then the same key as a daily quota: the second
    // counts in the day's window, which ends at UTC midnight, not a day
    // after the second's start.
    // The times read before each call: the waits the server names are from
    // its later clock, so they can only be shorter (the bug was a day longer).
    let before = server_ms(&mut con);
    let midnight = before / DAY * DAY + DAY;
    assert_eq!(call(&mut con, "RL.WINDOW", "1 q 10 1000 FIXED")[0], 1);
    let r = call(&mut con, "RL.WINDOW", &format!("1 q 10 {DAY} FIXED"));
    assert_eq!(r[..2], [1, 8], "the earlier request still counts");
    assert!(r[3] as u64 <= midnight - before, "reset_after_ms {} past midnight", r[3]);
    assert_eq!(window(&mut con, "q"), (midnight - DAY, 2, midnight));
    // Full: refused until midnight, and the wait says so.
    assert_eq!(call(&mut con, "RL.WINDOW", &format!("1 q 10 {DAY} FIXED COST 8"))[0], 1);
    let before = server_ms(&mut con);
    let r = call(&mut con, "RL.WINDOW", &format!("1 q 10 {DAY} FIXED"));
    assert_eq!(r[0], 0);
    assert!(r[2] as u64 <= midnight - before, "retry_after_ms {} past midnight", r[2]);
}

/// A call of every public command (and RL.INSPECT): `{key}` and a suffix
/// for its native type.
const CALLS: &[(&str, &str)] = &[
    ("RL.TAKE", "1 {key}b 10 1 60000"),
    ("RL.PEEK", "1 {key}b 10 1 60000"),
    ("RL.LEASE", "1 {key}b 10 1 60000 WANT 2"),
    ("RL.REFUND", "1 {key}b 10 1 60000 TOKENS 1"),
    ("RL.WINDOW", "1 {key}e 10 60000 EXACT"),
    ("RL.WINDOWPEEK", "1 {key}w 10 60000"),
    ("RL.ACQUIRE", "1 {key}f 10 60000 ID a"),
    ("RL.RELEASE", "1 {key}f ID a"),
    ("RL.INFLIGHT", "1 {key}f 10 60000"),
    ("RL.INSPECT", "{key}b"),
];
const READS: [&str; 4] = ["RL.PEEK", "RL.WINDOWPEEK", "RL.INFLIGHT", "RL.INSPECT"];

fn args(template: &str, key: &str) -> Vec<String> {
    template.replace("{key}", key).split_whitespace().map(String::from).collect()
}

fn user(s: &Server, name: &str, rules: &str) -> redis::Connection {
    let mut c = redis::cmd("ACL");
    c.arg("SETUSER").arg(name).arg("reset").arg("on").arg(">pw").arg(rules.split_whitespace().collect::<Vec<_>>());
    let _: String = c.query(&mut s.con()).unwrap();
    let mut con = s.con();
    let _: String = redis::cmd("AUTH").arg(name).arg("pw").query(&mut con).unwrap();
    con
}

#[test]
fn acl_key_patterns_cover_every_key_of_a_call() {
    let s = Server::start(&[]);
    let mut admin = s.con();
    let mut tenant = user(&s, "tenant", "~rl:* +@all");
    for (cmd, template) in CALLS {
        let inside = args(template, "rl:mine");
        let r: redis::RedisResult<redis::Value> = redis::cmd(cmd).arg(&inside).query(&mut tenant);
        assert!(r.is_ok(), "{cmd} on its own key: {r:?}");
        // The outside key alone, or second in a call that names an allowed one.
        let mut calls = vec![args(template, "other")];
        let mut two = args(template, "rl:mine");
        if two[0] == "1" {
            two[0] = "2".into();
            two.insert(2, format!("other{}", two[2].chars().last().unwrap_or('b')));
            let numbers: Vec<String> = two[3..].iter().take_while(|a| a.parse::<u64>().is_ok()).cloned().collect();
            let at = 3 + numbers.len();
            two.splice(at..at, numbers);
            calls.push(two);
        }
        for argv in calls {
            let args: Vec<&[u8]> = argv.iter().map(|a| a.as_bytes()).collect();
            let e = call_err(&mut tenant, cmd, &args);
            assert!(e.starts_with("NOPERM"), "{cmd} {argv:?}: {e}");
        }
    }
    for (cmd, args) in [("RL.SET", "other x 1"), ("RL.LOGADD", "other 0 1 1 1"), ("RL.SLOT", "other 0 a 1 1 1")] {
        let args: Vec<&[u8]> = args.split_whitespace().map(str::as_bytes).collect();
        assert!(call_err(&mut tenant, cmd, &args).starts_with("NOPERM"), "{cmd}");
    }
    let written: Vec<String> = redis::cmd("KEYS").arg("other*").query(&mut admin).unwrap();
    assert!(written.is_empty(), "refused calls wrote {written:?}");
    // Read-only key access (%R~): the peeks answer, the writes are refused.
    let mut reader = user(&s, "reader", "%R~* +@all");
    for (cmd, template) in CALLS {
        let argv = args(template, "rl:mine");
        let r: redis::RedisResult<redis::Value> = redis::cmd(cmd).arg(&argv).query(&mut reader);
        match r {
            Ok(_) => assert!(READS.contains(cmd), "{cmd} wrote with read-only key access"),
            Err(e) => {
                assert!(!READS.contains(cmd), "{cmd}: {e}");
                assert_eq!(e.code(), Some("NOPERM"), "{cmd}: {e}");
            }
        }
    }
}

fn query(con: &mut redis::Connection, cmd: &str, argv: &[String]) -> redis::RedisResult<redis::Value> {
    redis::cmd(cmd).arg(argv).query(con)
}

#[test]
fn scripts_and_transactions_keep_each_call_all_or_nothing() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let _: String = redis::cmd("SET").arg("str").arg("v").query(&mut con).unwrap();
    // In MULTI: a WRONGTYPE call fails alone, writes nothing, the others run.
    redis::cmd("MULTI").query::<()>(&mut con).unwrap();
    for argv in ["1 m 10 1 60000", "2 m2 str 10 1 60000 10 1 60000", "1 m 10 1 60000"] {
        let _: String = redis::cmd("RL.TAKE").arg(argv.split_whitespace().collect::<Vec<_>>()).query(&mut con).unwrap();
    }
    // (The client turns the reply into the error it holds.)
    let e = redis::cmd("EXEC").query::<redis::Value>(&mut con).unwrap_err();
    assert_eq!(e.code(), Some("WRONGTYPE"), "{e}");
    assert_eq!(call(&mut con, "RL.PEEK", "1 m 10 1 60000")[1], 7, "both other calls took a token");
    assert_eq!(redis::cmd("EXISTS").arg("m2").query::<i64>(&mut con).unwrap(), 0);
    // In Lua: redis.pcall hands the error to the script; nothing written.
    let script = "local r = redis.pcall('RL.TAKE', 2, KEYS[1], KEYS[2], 10, 1, 60000, 10, 1, 60000) return r.err";
    let e: String = redis::cmd("EVAL").arg(script).arg(2).arg("p").arg("str").query(&mut con).unwrap();
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    let script = "return redis.call('RL.WINDOW', 2, KEYS[1], KEYS[2], 10, 60000, 10, 60000, 'EXACT')";
    let e: redis::RedisResult<redis::Value> = redis::cmd("EVAL").arg(script).arg(2).arg("p").arg("str").query(&mut con);
    assert_eq!(e.unwrap_err().code(), Some("WRONGTYPE"));
    assert_eq!(redis::cmd("EXISTS").arg("p").query::<i64>(&mut con).unwrap(), 0);
    // Read-only scripts (EVAL_RO, and `no-writes`) may peek, never write.
    for (cmd, template) in CALLS {
        let argv = args(template, "ro");
        let body = format!("return redis.call('{cmd}', unpack(ARGV))");
        for (eval, body) in [("EVAL_RO", body.clone()), ("EVAL", format!("#!lua flags=no-writes\n{body}"))] {
            let r: redis::RedisResult<redis::Value> = redis::cmd(eval).arg(&body).arg(0).arg(&argv).query(&mut con);
            match r {
                Ok(_) => assert!(READS.contains(cmd), "{eval} ran {cmd}"),
                Err(e) => {
                    assert!(!READS.contains(cmd) && e.to_string().contains("Write commands are not allowed"), "{e}")
                }
            }
        }
    }
    let keys: Vec<String> = redis::cmd("KEYS").arg("ro*").query(&mut con).unwrap();
    assert!(keys.is_empty(), "read-only scripts wrote {keys:?}");
}

#[test]
fn replicas_pauses_and_full_memory_refuse_writes_and_answer_reads() {
    let primary = Server::start(&["--maxmemory-policy", "noeviction"]);
    let replica = primary.replica(&[]);
    let mut p = primary.con();
    for (cmd, template) in CALLS {
        let _ = query(&mut p, cmd, &args(template, "k"));
    }
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut p).unwrap();
    let mut r = replica.con();
    for (cmd, template) in CALLS {
        match query(&mut r, cmd, &args(template, "k")) {
            Ok(_) => assert!(READS.contains(cmd), "{cmd} ran on a read-only replica"),
            Err(e) => assert_eq!(e.code(), Some("READONLY"), "{cmd}: {e}"),
        }
    }
    // CLIENT PAUSE WRITE: reads answer at once, writes wait for the end.
    let _: String = redis::cmd("CLIENT").arg("PAUSE").arg(10_000).arg("WRITE").query(&mut p).unwrap();
    let mut paused = primary.con();
    paused.set_read_timeout(Some(std::time::Duration::from_millis(300))).unwrap();
    for (cmd, template) in CALLS.iter().filter(|(c, _)| READS.contains(c)) {
        assert!(query(&mut paused, cmd, &args(template, "k")).is_ok(), "{cmd} waited for the pause");
    }
    let e = query(&mut paused, "RL.TAKE", &args("1 kb 10 1 60000", "")).unwrap_err();
    assert!(e.is_timeout(), "RL.TAKE ran during CLIENT PAUSE WRITE: {e}");
    let _: String = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut p).unwrap();
    // Out of memory with noeviction: every write is refused but RL.RELEASE,
    // which frees; reads answer.
    query(&mut p, "RL.ACQUIRE", &args("1 kf 10 60000 ID a", "")).unwrap();
    let _: String = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(1).query(&mut p).unwrap();
    let dirty = primary.info("persistence", "rdb_changes_since_last_save");
    for (cmd, template) in CALLS {
        match query(&mut p, cmd, &args(template, "k")) {
            Ok(_) => assert!(READS.contains(cmd) || *cmd == "RL.RELEASE", "{cmd} ran out of memory"),
            Err(e) => assert_eq!(e.code(), Some("OOM"), "{cmd}: {e}"),
        }
    }
    let released = primary.info("persistence", "rdb_changes_since_last_save");
    assert_eq!(released.parse::<u64>().unwrap(), dirty.parse::<u64>().unwrap() + 1, "only the release wrote");
    let _: String = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(0).query(&mut p).unwrap();
}

/// `body` (a DUMP payload without its footer) with the footer: the RDB
/// version `version` and a CRC64 that matches, so the server reads it.
fn sealed(body: &[u8], version: &[u8]) -> Vec<u8> {
    testkit::reseal([body, version, &[0; 8]].concat())
}

#[test]
fn crafted_dumps_of_every_native_type_are_refused_or_loaded_whole() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.TAKE", "1 b 10 1 60000");
    call(&mut con, "RL.WINDOW", "1 w 10 60000");
    for _ in 0..3 {
        call(&mut con, "RL.WINDOW", "1 e 10 60000 EXACT");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    for id in ["a", "bb"] {
        query(&mut con, "RL.ACQUIRE", &args(&format!("1 f 10 60000 ID {id}"), "")).unwrap();
    }
    let (mut refused, mut loaded) = (0, 0);
    for key in ["b", "w", "e", "f"] {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut con).unwrap();
        let (body, footer) = dump[..dump.len() - 8].split_at(dump.len() - 10);
        let version = &footer[..2];
        let mut variants: Vec<Vec<u8>> = (0..body.len()).map(|n| body[..n].to_vec()).collect();
        for at in 0..body.len() {
            for bit in 0..8 {
                let mut v = body.to_vec();
                v[at] ^= 1 << bit;
                variants.push(v);
            }
            // A length claiming 4 GB, and bytes inserted.
            let mut v = body.to_vec();
            v.splice(at..at + 1, [0x80, 0xff, 0xff, 0xff, 0xff]);
            variants.push(v);
            let mut v = body.to_vec();
            v.splice(at..at, [0x3f, 0xff, 0x00]);
            variants.push(v);
        }
        for (i, v) in variants.iter().enumerate() {
            let name = format!("x{key}{i}");
            let r: redis::RedisResult<String> =
                redis::cmd("RESTORE").arg(&name).arg(0).arg(sealed(v, version)).query(&mut con);
            let ping: String = redis::cmd("PING").query(&mut con).expect("the server died on a crafted payload");
            assert_eq!(ping, "PONG");
            match r {
                Err(e) => {
                    assert_eq!(e.code(), Some("ERR"), "{key} variant {i}: {e}");
                    refused += 1;
                }
                Ok(_) => {
                    // Loaded: then it is a state the module reads and writes.
                    let kind: Vec<redis::Value> = redis::cmd("RL.INSPECT").arg(&name).query(&mut con).unwrap();
                    assert_ne!(kind[1], redis::Value::BulkString(b"other-module-type".to_vec()), "{key} {i}");
                    loaded += 1;
                }
            }
        }
    }
    eprintln!("{refused} payloads refused, {loaded} loaded");
    assert!(refused > 1_000, "{refused} refused");
    let ok: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(ok, "OK", "what RESTORE loaded saves and loads again");
    assert!(!s.log().contains("panic"), "{}", s.log());
}

#[test]
fn resp3_replies_are_the_resp2_replies() {
    let s = Server::start(&[]);
    let (mut two, mut three) = (s.con(), s.con_resp3());
    for (cmd, template) in CALLS.iter().filter(|(c, _)| *c != "RL.INSPECT") {
        let a = query(&mut two, cmd, &args(template, "two")).unwrap();
        let b = query(&mut three, cmd, &args(template, "three")).unwrap();
        // The same values, but the waits (fields 3 and 4), which may be a
        // millisecond apart: the calls on the two keys are not at once.
        let near = |x: &redis::Value, y: &redis::Value| match (x, y) {
            (redis::Value::Int(x), redis::Value::Int(y)) => x.abs_diff(*y) <= 5,
            _ => false,
        };
        match (&a, &b) {
            (redis::Value::Array(x), redis::Value::Array(y)) => {
                assert_eq!(x.len(), y.len(), "{cmd}");
                for (i, (x, y)) in x.iter().zip(y).enumerate() {
                    assert!(x == y || ((2..=3).contains(&i) && near(x, y)), "{cmd} field {i}: {x:?} / {y:?}");
                }
            }
            _ => assert!(a == b && matches!(b, redis::Value::Int(_)), "{cmd}: {a:?} / {b:?}"),
        }
    }
    let v = query(&mut three, "RL.INSPECT", &["twob".to_string()]).unwrap();
    assert!(matches!(v, redis::Value::Array(ref f) if f.len() % 2 == 0), "field/value pairs: {v:?}");
}

#[test]
fn windows_and_logs_stamped_far_ahead_of_the_clock_or_empty_are_refused() {
    let s = Server::start(&[]);
    let mut con = s.con();
    call(&mut con, "RL.WINDOW", "1 w 10 60000");
    call(&mut con, "RL.WINDOW", "1 e 10 60000 EXACT");
    call(&mut con, "RL.TAKE", "1 b 10 1 60000");
    let now = server_ms(&mut con);
    let window = |start_ms| PackedWindow::pack(&WindowState { start_ms, previous: 0, current: 10 }).to_blob().to_vec();
    let log = |at: &[u64]| log_blob(&Log::from_entries(at.iter().map(|&t| Entry::new(t, 1))).unwrap());
    // A window or log stamped in 2527 would count its requests until then
    // (the window never rolls, the entries never leave it), and the key's
    // TTL would follow: refused, as is a log with no entry (never written:
    // an EXACT key always holds one). A stamp a little ahead, as from a
    // primary whose clock runs ahead, loads.
    let refused =
        [("w2527", "w", window(MAX_TIME_MS)), ("e2527", "e", log(&[now, MAX_TIME_MS])), ("e0", "e", log(&[]))];
    for (name, from, blob) in &refused {
        let payload = dump_with_blob(&mut con, from, blob);
        let r: redis::RedisResult<String> = redis::cmd("RESTORE").arg(name).arg(0).arg(payload).query(&mut con);
        assert_eq!(r.unwrap_err().code(), Some("ERR"), "{name}");
        let pxat = (now + 60_000).to_string();
        let e = call_err(&mut con, "RL.SET", &[name.as_bytes(), blob, pxat.as_bytes()]);
        assert!(e.starts_with(&format!("ERR RL.SET key '{name}': state blob")), "{name}: {e}");
    }
    let log_text = s.log();
    assert!(log_text.contains("cannot load key 'w2527'") && log_text.contains("ahead"), "{log_text}");
    assert!(log_text.contains("cannot load key 'e0'") && log_text.contains("no entry"), "{log_text}");
    let ahead = now + 60_000;
    for (name, from, blob) in [("w+1m", "w", window(ahead)), ("e+1m", "e", log(&[now, ahead]))] {
        let payload = dump_with_blob(&mut con, from, &blob);
        let r: String = redis::cmd("RESTORE").arg(name).arg(0).arg(payload).query(&mut con).unwrap();
        assert_eq!(r, "OK", "{name}");
    }
    // A bucket stamped ahead is taken: its next call re-stamps it at now.
    let bucket = PackedBucket::pack(&BucketState { tokens: 0, fraction: 0, updated_ms: MAX_TIME_MS }).to_blob();
    let payload = dump_with_blob(&mut con, "b", &bucket);
    let _: String = redis::cmd("RESTORE").arg("b2527").arg(60_000).arg(payload).query(&mut con).unwrap();
    assert_eq!(call(&mut con, "RL.TAKE", "1 b2527 10 1 60000")[0], 0);
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    assert_eq!(call(&mut con, "RL.TAKE", "1 b2527 10 1 1000")[0], 1, "refilled from now on");
    // RL.LOGADD, what replicas and the AOF apply: the same bound.
    let (far, pxat) = (MAX_TIME_MS.to_string(), (now + 60_000).to_string());
    let at = now.to_string();
    for (args, want) in [
        ([at.as_str(), &far, "1", &pxat], "ERR RL.LOGADD key 'e': at"),
        ([far.as_str(), &at, "1", &pxat], "ERR RL.LOGADD key 'e': at or drop_before"),
    ] {
        let argv: Vec<&[u8]> = std::iter::once(&b"e"[..]).chain(args.iter().map(|a| a.as_bytes())).collect();
        let e = call_err(&mut con, "RL.LOGADD", &argv);
        assert!(e.starts_with(want), "{args:?}: {e}");
    }
    let ok: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(ok, "OK", "what was accepted saves and loads again");
}
