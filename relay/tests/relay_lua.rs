//! The relay on a Redis without the module (`--redis-backend lua`: rl-client's
//! Lua scripts) against the relay on the module, on the same seeded traffic:
//! over the RESP front (pooled RL.TAKE and RL.LEASE, the bucket, window and
//! in-flight commands it forwards) and over the Envoy front (a token bucket,
//! fixed, sliding and exact windows, a quota, concurrency slots). The answers
//! are compared call by call and the counts read back from Redis at the end.
//!
//! Exact wherever the design promises exact: every grant and count. A field
//! that reads the server's clock (a retry or reset time) is compared within
//! the time between the two relays' decisions of the same call (at most
//! twice the time since the run began). Limits refill a token in half an
//! hour or more, so no refill lands within a run; windows are a day long
//! (a run does not start within a minute of UTC midnight, where FIXED ones
//! end).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::rls::*;
use common::{away_from_midnight, call, Relay, Resp};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;
use testkit::{PlainServer, Server};

/// A small seeded generator: the traffic is the same on every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }

    fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[self.below(of.len() as u64) as usize]
    }
}

/// Leases as long as the limits' refill, so that the pools' decisions do
/// not hang on the time between calls.
const LEASES: [&str; 4] = ["--lease-window-ms", "86400000", "--lease-ttl-ms", "86400000"];

/// The clock-read fields' tolerance: the two relays decide a call at
/// moments apart by at most the run's length so far, on each side.
fn skew_ms(started: Instant) -> i64 {
    2 * started.elapsed().as_millis() as i64 + 2
}

/// Both replies to `line` the same: integers exact but the clock-read
/// ones (`clock`: their indexes) within `skew`; the seventh (TIME's reading)
/// is the server's own.
fn same(line: &str, module: &Resp, lua: &Resp, clock: &[usize], skew: i64) {
    match (module, lua) {
        (Resp::Array(m), Resp::Array(l)) => {
            assert_eq!(m.len(), l.len(), "{line}: {module:?} vs {lua:?}");
            for (i, (a, b)) in m.iter().zip(l).enumerate() {
                match (a, b) {
                    (Resp::Int(_), Resp::Int(_)) if i == 6 => {}
                    (Resp::Int(a), Resp::Int(b)) if clock.contains(&i) => assert!(
                        (a - b).abs() <= skew && (*a < 0) == (*b < 0),
                        "{line}: field {i}: {a} vs {b} (skew {skew}): {module:?} vs {lua:?}"
                    ),
                    _ => assert_eq!(a, b, "{line}: field {i}: {module:?} vs {lua:?}"),
                }
            }
        }
        (Resp::Int(a), Resp::Int(b)) => assert_eq!(a, b, "{line}"),
        _ => panic!("{line}: {module:?} vs {lua:?}"),
    }
}

fn ints(reply: &Resp) -> Vec<i64> {
    match reply {
        Resp::Array(items) => items.iter().filter_map(|i| if let Resp::Int(n) = i { Some(*n) } else { None }).collect(),
        other => panic!("expected an array, got {other:?}"),
    }
}

/// One RESP call of the traffic, and how its replies compare.
enum Step {
    /// A pooled RL.TAKE or RL.LEASE: a refusal's other fields depend on
    /// whether a background top-up had answered (timing, the same on
    /// either backend): the grant is compared, the rest when granted.
    Pooled(String),
    /// Forwarded: every field.
    Forwarded(String),
    /// RL.WINDOW ... TIME: its reading is kept (per relay) for a refund.
    Timed(String, String),
    /// RL.WINDOW ... REFUND of the reading kept under the name.
    Refund(String, String),
}

fn traffic(seed: u64, n: usize) -> Vec<Step> {
    let mut r = Lcg(seed);
    let bucket = "40 40 86400000";
    let mut steps = Vec::new();
    for _ in 0..n {
        let s = r.pick(&["a", "b", "c"]);
        let c = 1 + r.below(3);
        steps.push(match r.below(12) {
            0 | 1 => Step::Pooled(format!("RL.TAKE 1 p:{s} {bucket} COST {c}")),
            2 => Step::Pooled(format!("RL.LEASE 1 p:{s} {bucket} WANT {} MIN {c}", c + r.below(4))),
            3 => Step::Pooled(format!("RL.TAKE 2 p:{s} p:two {bucket} 30 30 86400000 COST {c}")),
            // Never RL.TAKE without FORCE here: it would be pooled, and a
            // refund racing a background top-up is timing, not backend.
            4 => Step::Forwarded(match r.below(2) {
                0 => format!("RL.TAKE 1 f:{s} 20 20 86400000 COST {c} FORCE"),
                _ => format!("RL.PEEK 1 f:{s} 20 20 86400000 COST {c}"),
            }),
            5 => Step::Forwarded(format!("RL.REFUND 1 f:{s} 20 20 86400000 TOKENS {c}")),
            6 | 7 => {
                let mode = r.pick(&["SLIDING", "FIXED", "EXACT"]);
                let keys =
                    if r.below(3) == 0 { format!("2 w:{mode}:{s} w:{mode}:all") } else { format!("1 w:{mode}:{s}") };
                let limits = if keys.starts_with('2') { "12 86400000 30 86400000" } else { "12 86400000" };
                let line = format!("RL.WINDOW {keys} {limits} COST {c} {mode} TIME");
                if r.below(3) == 0 {
                    Step::Timed(format!("{mode}{s}{keys}"), line)
                } else {
                    Step::Forwarded(line)
                }
            }
            8 => {
                let mode = r.pick(&["SLIDING", "FIXED", "EXACT"]);
                Step::Forwarded(format!("RL.WINDOWPEEK 1 w:{mode}:{s} 12 86400000 COST {c} {mode}"))
            }
            9 => Step::Forwarded(format!("RL.ACQUIRE 1 i:{s} 3 600000 ID r{} COST 1", r.below(6))),
            10 => Step::Forwarded(format!("RL.RELEASE 1 i:{s} ID r{}", r.below(6))),
            _ => Step::Forwarded(format!("RL.INFLIGHT 1 i:{s} 3 600000")),
        });
        // A refund of a timed call made earlier (if any), now and then.
        if let Some(Step::Timed(name, line)) = steps.iter().rev().find(|s| matches!(s, Step::Timed(..))) {
            if r.below(4) == 0 {
                let line = line.replace(" TIME", " REFUND {AT}");
                steps.push(Step::Refund(name.clone(), line));
            }
        }
    }
    steps
}

#[test]
fn the_resp_front_answers_and_counts_the_same_on_the_scripts() {
    away_from_midnight();
    let server = Server::start(&[]);
    let plain = PlainServer::start();
    let module = Relay::start(&server.url(), &LEASES);
    let lua = Relay::start(&plain.url(), &[&LEASES[..], &["--redis-backend", "lua"]].concat());
    let (mut m, mut l) = (module.raw(), lua.raw());
    let mut at: [HashMap<String, String>; 2] = Default::default();
    let started = Instant::now();
    // Grants and refusals of the pools, and of the forwarded calls.
    let (mut granted, mut refused, mut forwarded_refused) = (0, 0, 0);
    for step in traffic(37, 400) {
        let skew = skew_ms(started);
        match step {
            Step::Pooled(line) => {
                let (a, b) = (ints(&call(&mut m, &line)), ints(&call(&mut l, &line)));
                assert_eq!(a[0], b[0], "{line}: granted {a:?} vs {b:?}");
                refused += i64::from(a[0] == 0);
                if a[0] > 0 {
                    granted += a[0];
                    same(
                        &line,
                        &Resp::Array(a.into_iter().map(Resp::Int).collect()),
                        &Resp::Array(b.into_iter().map(Resp::Int).collect()),
                        &[2, 3],
                        skew,
                    );
                }
            }
            Step::Forwarded(line) => {
                let (a, b) = (call(&mut m, &line), call(&mut l, &line));
                // RL.ACQUIRE and RL.INFLIGHT: [allowed, in_flight, retry, limit, binding, id].
                let clock: &[usize] =
                    if line.contains("ACQUIRE") || line.contains("INFLIGHT") { &[2] } else { &[2, 3] };
                same(&line, &a, &b, clock, skew);
                forwarded_refused += i64::from(matches!(&a, Resp::Array(r) if r[0] == Resp::Int(0)));
            }
            Step::Timed(name, line) => {
                let (a, b) = (call(&mut m, &line), call(&mut l, &line));
                same(&line, &a, &b, &[2, 3], skew);
                for (side, reply) in [(0, &a), (1, &b)] {
                    let reading = ints(reply)[6];
                    assert!(reading > 1_600_000_000_000, "{line}: {reply:?}");
                    at[side].insert(name.clone(), reading.to_string());
                }
            }
            Step::Refund(name, line) => {
                let a = call(&mut m, &line.replace("{AT}", &at[0][&name]));
                let b = call(&mut l, &line.replace("{AT}", &at[1][&name]));
                same(&line, &a, &b, &[2, 3], skew);
            }
        }
    }
    // The traffic reaches every path: grants, and refusals once spent.
    assert!(
        granted > 60 && refused > 20 && forwarded_refused > 20,
        "{granted} granted, {refused} refused by the pools, {forwarded_refused} forwarded refusals"
    );
    // The counts in Redis, read back through each relay (forwarded).
    let skew = skew_ms(started);
    let mut read_back = Vec::new();
    for s in ["a", "b", "c"] {
        read_back.push(format!("RL.PEEK 1 p:{s} 40 40 86400000"));
        read_back.push(format!("RL.PEEK 1 f:{s} 20 20 86400000"));
        read_back.push(format!("RL.INFLIGHT 1 i:{s} 3 600000"));
        for mode in ["SLIDING", "FIXED", "EXACT"] {
            read_back.push(format!("RL.WINDOWPEEK 1 w:{mode}:{s} 12 86400000 {mode}"));
        }
    }
    read_back.push("RL.PEEK 1 p:two 30 30 86400000".into());
    for line in read_back {
        let (a, b) = (call(&mut m, &line), call(&mut l, &line));
        let clock: &[usize] = if line.contains("INFLIGHT") { &[2] } else { &[2, 3] };
        same(&line, &a, &b, clock, skew);
    }
    // Said: INFO relay, /ready's status (below), and a plain Redis with the
    // module's commands never sent (its scripts did the work).
    assert!(lua.info().contains("redis_backend:lua\r\n"), "{}", lua.info());
    assert!(module.info().contains("redis_backend:module\r\n"), "{}", module.info());
    let mut con = plain.con();
    assert!(calls(&mut con, "evalsha") > 0);
    assert_eq!(calls(&mut con, "rl.lease"), 0);
    wait_log(&lua, "--redis-backend lua");
}

#[test]
fn what_the_scripts_do_not_serve_is_refused_by_name() {
    let plain = PlainServer::start();
    let lua = Relay::start(&plain.url(), &["--redis-backend", "lua"]);
    let mut s = lua.raw();
    let e = call(&mut s, "CL.THROTTLE k 10 1 60 1");
    assert!(e.error().contains("CL.THROTTLE needs the redis-rl module"), "{e:?}");
    // A bad argument: the script's own error, naming the field.
    let e = call(&mut s, "RL.PEEK 1 k 0 1 1000");
    assert!(e.error().contains("capacity of key 1 must be an integer from 1"), "{e:?}");
    let e = call(&mut s, "RL.WINDOW 1 w 10 1000 COST 1 BOGUS");
    assert!(e.error().contains("unknown option 'BOGUS'"), "{e:?}");
}

#[test]
fn a_script_redis_forgot_is_loaded_again() {
    let plain = PlainServer::start();
    let lua = Relay::start(&plain.url(), &["--redis-backend", "lua"]);
    let mut s = lua.raw();
    assert_eq!(ints(&call(&mut s, "RL.WINDOW 1 w 10 86400000 COST 1 FIXED"))[0], 1);
    let mut con = plain.con();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    let again = ints(&call(&mut s, "RL.WINDOW 1 w 10 86400000 COST 1 FIXED"));
    assert_eq!((again[0], again[1]), (1, 8), "{again:?}");
    assert!(calls(&mut con, "script|load") >= 1);
}

/// With `auto` undecided (here its probe's PING is refused, so no probe
/// decides), a module command's own answer decides: on a Redis without
/// the module it is answered by the scripts, never "unknown command".
/// Before, calls went as module commands until a probe decided.
#[test]
fn on_auto_a_call_before_any_probe_decides_is_answered_by_the_scripts() {
    let plain = PlainServer::start();
    let mut con = plain.con();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "noping", "on", ">pw", "~*", "&*", "+@all", "-ping"])
        .query(&mut con)
        .unwrap();
    let url = plain.url().replace("redis://", "redis://noping:pw@");
    let (relay, port) = metrics_relay(&url, "auto");
    let mut s = relay.raw();
    // [allowed, remaining, ...]: 2, 1, 0 left of 3, then refused.
    for left in [2, 1, 0] {
        let reply = call(&mut s, "RL.TAKE 1 k 3 1 86400000");
        assert_eq!(ints(&reply)[..2], [1, left], "{reply:?}");
    }
    assert_eq!(ints(&call(&mut s, "RL.TAKE 1 k 3 1 86400000"))[0], 0, "exact: 3 of 3");
    wait_log(&relay, "--redis-backend auto: Redis answers without the redis-rl module");
    let (_, metrics) = http_get(port, "/metrics");
    assert!(metrics.contains("rl_relay_redis_backend{backend=\"lua\"} 1"), "{metrics}");
    assert!(calls(&mut con, "evalsha") >= 4);

    // With the module, the first call's answer decides the module.
    let server = Server::start(&[]);
    let mut con = server.con();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "noping", "on", ">pw", "~*", "&*", "+@all", "-ping"])
        .query(&mut con)
        .unwrap();
    let (relay, port) = metrics_relay(&server.url().replace("redis://", "redis://noping:pw@"), "auto");
    let reply = call(&mut relay.raw(), "RL.TAKE 1 k 3 1 86400000");
    assert_eq!(ints(&reply)[..2], [1, 2], "{reply:?}");
    wait_log(&relay, "--redis-backend auto: Redis has the redis-rl module");
    let (_, metrics) = http_get(port, "/metrics");
    assert!(metrics.contains("rl_relay_redis_backend{backend=\"module\"} 1"), "{metrics}");
    assert_eq!(calls(&mut con, "evalsha"), 0);
}

/// GET `path` on a relay's `--metrics` endpoint: the status and body.
fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text.split(' ').nth(1).unwrap().parse().unwrap();
    (code, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Polls until `done`, 20 s at most; the relay's log if it never is.
fn wait_for(relay: &Relay, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {}", relay.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `/ready` until its status is `code` and its body says `says`
/// (before the first probe it is 503 "Redis does not answer").
fn wait_ready(relay: &Relay, port: u16, code: u16, says: &str) {
    wait_for(relay, &format!("/ready {code} {says:?}"), || {
        let (status, body) = http_get(port, "/ready");
        status == code && body.contains(says)
    });
}

/// Waits until the relay's log says `says`.
fn wait_log(relay: &Relay, says: &str) {
    wait_for(relay, says, || relay.log().contains(says));
}

fn metrics_relay(url: &str, backend: &str) -> (Relay, u16) {
    let port = testkit::free_port();
    let metrics = format!("127.0.0.1:{port}");
    (Relay::start(url, &["--redis-backend", backend, "--metrics", &metrics]), port)
}

#[test]
fn on_a_plain_redis_lua_and_auto_are_ready_module_is_not() {
    let plain = PlainServer::start();
    let (lua, lua_port) = metrics_relay(&plain.url(), "lua");
    wait_ready(&lua, lua_port, 200, "ready (redis backend: lua)");
    let (_, metrics) = http_get(lua_port, "/metrics");
    assert!(metrics.contains("rl_relay_redis_backend{backend=\"lua\"} 1\n"), "{metrics}");
    assert!(metrics.contains("rl_relay_redis_backend{backend=\"module\"} 0\n"), "{metrics}");
    assert!(metrics.contains("rl_relay_ready 1\n"), "{metrics}");
    wait_log(&lua, "on the lua backend: ready");

    // Today's behaviour kept: the module asked for, and missing.
    let (module, module_port) = metrics_relay(&plain.url(), "module");
    let says = "not ready: Redis answers without the redis-rl module (redis backend: module)";
    wait_ready(&module, module_port, 503, says);
    let (_, metrics) = http_get(module_port, "/metrics");
    assert!(metrics.contains("rl_relay_module_missing 1\n"), "{metrics}");
    assert!(module.info().contains("redis_backend:module\r\n"));

    // auto: detected at start, said.
    let (auto, auto_port) = metrics_relay(&plain.url(), "auto");
    wait_ready(&auto, auto_port, 200, "ready (redis backend: lua)");
    wait_log(&auto, "without the redis-rl module: rl-client's Lua scripts serve");
    let server = Server::start(&[]);
    let (auto, auto_port) = metrics_relay(&server.url(), "auto");
    wait_ready(&auto, auto_port, 200, "ready (redis backend: module)");
    assert!(auto.info().contains("redis_backend:module\r\n"));
}

#[test]
fn a_bad_backend_is_refused_by_name() {
    let mut relay =
        Relay::spawn(common::Start { no_wait: true, ..common::Start::args(&["--redis-backend", "scripts"]) });
    assert_eq!(relay.exit_code(), Some(2));
    assert!(relay.log().contains("'scripts': one of module, lua, auto"), "{}", relay.log());
}

const RLS_CONFIG: &str = "\
domain: d
descriptors:
  - key: bucket
    rate_limit: { unit: day, requests_per_unit: 30, algorithm: token_bucket }
  - key: fixed
    rate_limit: { unit: day, requests_per_unit: 25 }
  - key: sliding
    rate_limit: { unit: day, requests_per_unit: 25, algorithm: sliding_window }
  - key: exact
    rate_limit: { unit: day, requests_per_unit: 20, algorithm: exact_window }
  - key: quota
    quota_mode: true
    rate_limit: { unit: day, requests_per_unit: 15 }
  - key: user
    descriptors:
      - key: request_id
        rate_limit: { unit: day, requests_per_unit: 3, algorithm: concurrency }
";

/// Both answers the same: codes and counts exact, reset times within `skew`.
fn same_answer(what: &str, a: &RateLimitResponse, b: &RateLimitResponse, skew: i64) {
    assert_eq!(a.overall_code, b.overall_code, "{what}: {a:?} vs {b:?}");
    assert_eq!(a.statuses.len(), b.statuses.len(), "{what}");
    for (x, y) in a.statuses.iter().zip(&b.statuses) {
        assert_eq!(
            (x.code, x.limit_remaining, limit_of(x)),
            (y.code, y.limit_remaining, limit_of(y)),
            "{what}: {a:?} vs {b:?}"
        );
        let ms = |s: &envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus| {
            s.duration_until_reset.map_or(0, |d| d.seconds * 1000 + i64::from(d.nanos) / 1_000_000)
        };
        // Whole seconds on the wire: one more second of rounding.
        assert!((ms(x) - ms(y)).abs() <= skew + 1000, "{what}: reset {} vs {} ms", ms(x), ms(y));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_front_answers_and_counts_the_same_on_the_scripts() {
    away_from_midnight();
    let server = Server::start(&[]);
    let plain = PlainServer::start();
    let (_dir, config) = config_file(RLS_CONFIG);
    let module = RlsRelay::start(&[server.url()], false, &config, &[]);
    let lua = RlsRelay::start(&[plain.url()], false, &config, &["--redis-backend", "lua"]);
    wait_health(&module, tonic_health::pb::health_check_response::ServingStatus::Serving).await;
    wait_health(&lua, tonic_health::pb::health_check_response::ServingStatus::Serving).await;
    let (mut m, mut l) = (module.client().await, lua.client().await);
    let mut r = Lcg(36);
    let started = Instant::now();
    let mut held: Vec<(String, String)> = Vec::new();
    let (mut over, mut ok) = (0, 0);
    for i in 0..300 {
        let s = r.pick(&["a", "b"]);
        let mut req = match r.below(6) {
            0 => request("d", &[&[("bucket", s)]]),
            1 => request("d", &[&[("fixed", s)], &[("sliding", s)]]),
            2 => request("d", &[&[("exact", s)], &[("quota", s)]]),
            3 => request("d", &[&[("quota", s)], &[("fixed", s)]]),
            4 => {
                let id = format!("r{i}");
                held.push((s.to_string(), id.clone()));
                request("d", &[&[("user", s), ("request_id", &id)]])
            }
            _ if !held.is_empty() => {
                let (user, id) = held.remove(r.below(held.len() as u64) as usize);
                let mut req = request("d", &[&[("user", &user), ("request_id", &id)]]);
                req.descriptors[0].is_negative_hits = true;
                req.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
                req
            }
            _ => request("d", &[&[("sliding", s)]]),
        };
        if req.descriptors[0].entries[0].key != "user" {
            req.hits_addend = 1 + r.below(3) as u32;
        }
        let what = format!("call {i}: {req:?}");
        let a = ask(&mut m, req.clone()).await;
        let b = ask(&mut l, req).await;
        same_answer(&what, &a, &b, skew_ms(started));
        if a.overall_code == OVER_LIMIT {
            over += 1;
        } else {
            ok += 1;
        }
    }
    assert!(over > 20 && ok > 20, "the traffic must both admit and refuse: {ok} OK, {over} OVER_LIMIT");
    // The counters Redis holds: the same keys on both.
    let keys = |con: &mut redis::Connection| {
        let mut keys: Vec<String> = redis::cmd("KEYS").arg("rl:rls:*").query(con).unwrap();
        keys.sort();
        keys
    };
    let module_keys = keys(&mut server.con());
    assert!(module_keys.len() >= 8, "{module_keys:?}");
    assert_eq!(module_keys, keys(&mut plain.con()));
    assert_eq!(lua.metric("rl_relay_redis_backend{backend=\"lua\"}"), 1.0);
    assert_eq!(module.metric("rl_relay_redis_backend{backend=\"module\"}"), 1.0);
}

#[test]
fn the_documented_acl_user_serves_on_the_scripts() {
    let plain = PlainServer::start();
    let mut admin = plain.con();
    let _: () = common::acl_recipe("security.md", "rl-relay-lua", &mut admin, "pw").query(&mut admin).unwrap();
    let url = format!("redis://rl-relay-lua:pw@127.0.0.1:{}/", plain.port);
    let port = testkit::free_port();
    let metrics = format!("127.0.0.1:{port}");
    let relay = Relay::start(&url, &["--redis-backend", "lua", "--metrics", &metrics]);
    wait_ready(&relay, port, 200, "ready (redis backend: lua)");
    let mut s = relay.raw();
    for (line, granted) in [
        ("RL.TAKE 1 rl:b 10 10 86400000 COST 2", 1),
        ("RL.REFUND 1 rl:b 10 10 86400000 TOKENS 1", 1),
        // Refusals: their scripts look at and may move expiries (PTTL, PEXPIRE).
        ("RL.TAKE 1 rl:b 10 10 86400000 COST 10", 0),
        ("RL.PEEK 1 rl:b 10 10 86400000", 1),
        ("RL.WINDOW 1 rl:w 5 86400000 COST 2 EXACT", 1),
        ("RL.WINDOW 1 rl:w 5 86400000 COST 4 EXACT", 0),
        ("RL.WINDOW 1 rl:f 5 86400000 COST 2 FIXED", 1),
        ("RL.WINDOWPEEK 1 rl:f 5 86400000 COST 4 FIXED", 0),
        ("RL.ACQUIRE 1 rl:i 2 60000 ID r1", 1),
        ("RL.INFLIGHT 1 rl:i 2 60000 COST 2", 0),
    ] {
        let reply = call(&mut s, line);
        assert_eq!(ints(&reply)[0], granted, "{line}: {reply:?}");
    }
    assert_eq!(call(&mut s, "RL.RELEASE 1 rl:i ID r1"), Resp::Int(1));
    // A key outside the recipe's ~rl:* is Redis's refusal, as on the module.
    let e = call(&mut s, "RL.TAKE 1 other 10 10 86400000");
    assert!(e.error().contains("NOPERM") || e.error().contains("no permissions"), "{e:?}");
    let log: Vec<String> = redis::cmd("ACL")
        .arg("LOG")
        .query::<Vec<redis::Value>>(&mut admin)
        .map(|v| v.iter().map(|e| format!("{e:?}")).collect())
        .unwrap();
    assert!(log.iter().all(|e| e.contains("other")), "only the key outside ~rl:* refused: {log:?}");
}

/// In a cluster each script call goes to its key's primary, which is
/// given the script the first time it answers NOSCRIPT. (The nodes carry
/// the module, which the scripts leave alone: testkit's cluster loads it.)
#[test]
fn on_a_cluster_each_script_call_goes_to_its_keys_node() {
    let cluster = testkit::Cluster::start(3);
    let urls = cluster.urls();
    let mut extra: Vec<&str> = vec!["--cluster", "--redis-backend", "lua"];
    for url in &urls[1..] {
        extra.extend(["--redis", url.as_str()]);
    }
    let relay = Relay::start(&urls[0], &extra);
    // One key per node.
    let mut keys: Vec<String> = Vec::new();
    for tag in 0..100 {
        let key = format!("rl:{{t{tag}}}:b");
        let port = cluster.node_for(&key).port;
        if keys.iter().all(|k| cluster.node_for(k).port != port) {
            keys.push(key);
        }
    }
    assert_eq!(keys.len(), 3, "{keys:?}");
    let mut s = relay.raw();
    for key in &keys {
        assert_eq!(ints(&call(&mut s, &format!("RL.TAKE 1 {key} 5 5 86400000 COST 5")))[0], 1, "{key}");
        assert_eq!(ints(&call(&mut s, &format!("RL.TAKE 1 {key} 5 5 86400000")))[0], 0, "{key}: exact");
        let window = key.replace(":b", ":w");
        assert_eq!(ints(&call(&mut s, &format!("RL.WINDOW 1 {window} 3 86400000 COST 3 EXACT")))[0], 1);
        assert_eq!(ints(&call(&mut s, &format!("RL.WINDOW 1 {window} 3 86400000 EXACT")))[0], 0, "{window}");
        let node = cluster.node_for(key);
        let mut con = node.con();
        assert_eq!(redis::cmd("EXISTS").arg(key).arg(&window).query::<i64>(&mut con).unwrap(), 2, "{key} on its node");
        assert!(calls(&mut con, "evalsha") >= 4, "{key}'s node ran the scripts");
    }
}

#[test]
fn a_redis_that_refuses_the_scripts_is_not_ready_and_says_why() {
    let plain = PlainServer::start();
    let mut admin = plain.con();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("noscripts")
        .arg("on")
        .arg(">pw")
        .arg("~rl:*")
        .arg("-@all")
        .arg("+ping")
        .arg("+role")
        .query(&mut admin)
        .unwrap();
    let url = format!("redis://noscripts:pw@127.0.0.1:{}/", plain.port);
    let (relay, port) = metrics_relay(&url, "lua");
    wait_ready(&relay, port, 503, "not ready: Redis refuses the Lua scripts (--redis-backend lua)");
    wait_log(&relay, "Redis refuses the Lua scripts: not ready");
}

/// A config with a limit beyond the scripts' exact range (limit x
/// window_ms above 2^52): a year's limit of a million.
const BEYOND: &str =
    "domain: d\ndescriptors:\n  - key: open\n    rate_limit: { unit: year, requests_per_unit: 1000000 }\n  \
                      - key: closed\n    rate_limit: { unit: year, requests_per_unit: 1000000, failure_mode: deny }\n";

const BEYOND_WHY: &str =
    "descriptors[0].rate_limit.requests_per_unit: requests_per_unit 1000000 with unit year: limit x \
                          period_ms must be at most 2^52 on the Lua scripts: at most 142808 per 31536000000 ms, got \
                          1000000 (--redis-backend lua) (and 1 more limits beyond them)";

/// On `lua`, a config the scripts cannot count is refused as a bad file
/// is: at start, and at a reload (the one in force kept, counted, logged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lua_an_envoy_config_beyond_the_scripts_is_refused_at_start_and_at_reload() {
    let plain = PlainServer::start();
    let (_dir, config) = config_file(BEYOND);
    let rls_port = testkit::free_port().to_string();
    let args = ["--redis", &plain.url(), "--rls-listen", &format!("127.0.0.1:{rls_port}")];
    let args = [&args[..], &["--rls-config", config.to_str().unwrap(), "--redis-backend", "lua"]].concat();
    let mut refused = Relay::spawn(common::Start { no_wait: true, ..common::Start::args(&args) });
    assert_eq!(refused.exit_code(), Some(2), "{}", refused.log());
    assert!(refused.log().contains(BEYOND_WHY), "{}", refused.log());

    // One that fits serves; a reload beyond is refused, and it stays.
    let (_dir, config) =
        config_file("domain: d\ndescriptors:\n  - key: open\n    rate_limit: { unit: year, requests_per_unit: 1 }\n");
    let lua = RlsRelay::start(&[plain.url()], false, &config, &["--redis-backend", "lua"]);
    wait_health(&lua, tonic_health::pb::health_check_response::ServingStatus::Serving).await;
    let mut client = lua.client().await;
    assert_eq!(ask(&mut client, request("d", &[&[("open", "a")]])).await.overall_code, OK);
    // Whole at once (a rename), so no half-written file is read first.
    std::fs::write(config.with_extension("new"), BEYOND).unwrap();
    std::fs::rename(config.with_extension("new"), &config).unwrap();
    wait_log(&lua.relay, &format!("config.yaml:4: {BEYOND_WHY}"));
    assert!(lua.relay.log().contains("RLS config refused, the one in force kept"), "{}", lua.relay.log());
    assert_eq!(lua.metric("ratelimit_service_config_load_error"), 1.0);
    assert_eq!(ask(&mut client, request("d", &[&[("open", "a")]])).await.overall_code, OVER_LIMIT);
    assert_eq!(lua.metric("rl_relay_rls_limits_beyond_backend"), 0.0);
}

/// On `auto` finding no module, a config in force beyond the scripts is
/// kept (it was loaded before the backend was known): logged once with
/// what is beyond, counted by a gauge, and each such limit answered by its
/// failure mode, logged with the script's words, as docs/relay.md says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_auto_a_limit_beyond_the_scripts_is_said_and_follows_its_failure_mode() {
    let plain = PlainServer::start();
    let (_dir, config) = config_file(BEYOND);
    let lua = RlsRelay::start(&[plain.url()], false, &config, &["--redis-backend", "auto"]);
    wait_health(&lua, tonic_health::pb::health_check_response::ServingStatus::Serving).await;
    wait_log(
        &lua.relay,
        "--redis-backend auto chose the Lua scripts, and 2 limits of the config in force are beyond them",
    );
    assert_eq!(lua.metric("rl_relay_rls_limits_beyond_backend"), 2.0);
    let mut client = lua.client().await;
    assert_eq!(ask(&mut client, request("d", &[&[("open", "a")]])).await.overall_code, OK);
    assert_eq!(ask(&mut client, request("d", &[&[("closed", "a")]])).await.overall_code, OVER_LIMIT);
    wait_log(&lua.relay, "must be at most 2^52 for the Lua backend");
    assert_eq!(lua.metric("rl_relay_rls_fallback_total"), 1.0);
    assert_eq!(lua.metric("rl_relay_rls_failure_denied_total"), 1.0);
}
