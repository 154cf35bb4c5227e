//! A gateway on the Lua backend behind a relay (`--redis-backend lua`) on a
//! Redis without the module: rl-client speaks the module's commands to the
//! relay, and while the relay is down sends each as its script's call to
//! Redis itself. Limits stay exact across the relay's death: what the relay
//! admitted and what Redis admitted directly add up to the limit, with no
//! fallback decision, for buckets, windows, in-flight slots and a pipelined
//! batch of policies, also after Redis forgot its scripts (SCRIPT FLUSH).
//!
//! The limits refill a token in twelve minutes or more and the windows are
//! a day long (sliding): nothing refills within a run.

mod common;

use std::time::{Duration, Instant};

use common::Relay;
use rl_client::internal::{slot_of, Script};
use rl_client::{Backend, Bucket, Client, Inflight, Window, WindowMode};
use rl_core::BucketParams;
use rl_gateway::{Check, Config, Limiter, LimiterConfig, Policy, Rule, Source};
use testkit::PlainServer;

/// A limiter on the Lua backend behind `relay`, asking Redis on every
/// check (a lease of 1 ms: no tokens held locally).
fn limiter(redis: &PlainServer, relay: &Relay) -> Limiter {
    limiter_as(&redis.url(), relay)
}

/// [`limiter`] reaching Redis at `url` (as a user of its own).
fn limiter_as(url: &str, relay: &Relay) -> Limiter {
    Limiter::new(LimiterConfig {
        lease_window: Duration::from_millis(1),
        ..LimiterConfig::new(Config {
            backend: Backend::Lua,
            relay: Some(relay.url()),
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            ..Config::standalone(url)
        })
    })
    .unwrap()
}

/// The relay killed (dropped): waits until a call through the client
/// answers again, from Redis directly (a call sent on the relay's dropped
/// connection before the client saw it close fails, and is a PING here).
async fn kill(relay: Relay, client: &Client) {
    drop(relay);
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.connection().send(&redis::cmd("PING"), None).await.is_err() {
        assert!(Instant::now() < deadline, "the client never reached Redis directly");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` checks of `policy` for `subject`: how many were admitted; none may
/// be the fallback's.
async fn admitted(limiter: &Limiter, policy: &Policy, subject: &str, n: usize) -> usize {
    let mut allowed = 0;
    for _ in 0..n {
        let d = limiter.check(policy, subject).await.unwrap();
        assert_ne!(d.source, Source::Fallback, "{d:?}");
        allowed += usize::from(d.allowed);
    }
    allowed
}

/// The number of windowed calls admitted out of `n`.
async fn counted(client: &Client, window: &Window, n: usize) -> usize {
    let mut allowed = 0;
    for _ in 0..n {
        allowed +=
            usize::from(client.window(std::slice::from_ref(window), 1, WindowMode::Sliding).await.unwrap().allowed);
    }
    allowed
}

fn script_flush(redis: &PlainServer) {
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut redis.con()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_stay_exact_when_the_relay_dies() {
    let redis = PlainServer::start();
    let relay = Relay::start(&redis.url(), &["--redis-backend", "lua"]);
    let limiter = limiter(&redis, &relay);
    let client = limiter.client().clone();
    let bucket = Policy::builder("api").rule(Rule::per_hour("h", 5)).build().unwrap();
    let window = Window::new("rl:{w}:day", 4, Duration::from_secs(86_400)).unwrap();
    let slots = [Inflight::new("rl:{c}:slots", 2, Duration::from_secs(600)).unwrap()];

    // Through the relay: it speaks the module's commands.
    assert_eq!(admitted(&limiter, &bucket, "u1", 3).await, 3);
    assert_eq!(counted(&client, &window, 2).await, 2);
    let held = client.acquire(&slots, None, 1).await.unwrap();
    assert!(held.allowed, "{held:?}");
    assert_eq!(relay.info_field("forwarded"), 6, "every call went through the relay: {}", relay.info());

    kill(relay, &client).await;
    // Redis directly, as the scripts' calls: what is left, exactly.
    assert_eq!(admitted(&limiter, &bucket, "u1", 4).await, 2, "5 in all: 3 through the relay, 2 directly");
    assert_eq!(counted(&client, &window, 3).await, 2, "4 in all");
    let second = client.acquire(&slots, None, 1).await.unwrap();
    assert!(second.allowed && second.in_flight == 2, "{second:?}");
    let third = client.acquire(&slots, None, 1).await.unwrap();
    assert!(!third.allowed && third.in_flight == 2, "{third:?}");
    assert_eq!(client.release(&["rl:{c}:slots"], &held.id).await.unwrap(), 1, "the relay's slot, released directly");

    // Redis forgot the scripts: loaded again, the call answered once.
    script_flush(&redis);
    let d = limiter.check(&bucket, "u2").await.unwrap();
    assert!(d.allowed && d.source == Source::Redis && d.remaining == 4, "{d:?}");
    script_flush(&redis);
    assert_eq!(counted(&client, &window, 1).await, 0, "the window is still full");
    script_flush(&redis);
    assert!(client.acquire(&slots, None, 1).await.unwrap().allowed, "the released slot is free");

    // What the scripts do not serve is refused by name, as the relay does.
    let mut throttle = redis::cmd("CL.THROTTLE");
    throttle.arg("k").arg(10).arg(1).arg(60).arg(1);
    let e = client.connection().send(&throttle, Some(b"k")).await.unwrap().extract_error().unwrap_err().to_string();
    assert!(e.contains("CL.THROTTLE needs the redis-rl module"), "{e}");
}

/// One request's several policies go to Redis as one pipeline of script
/// calls while the relay is down: all or nothing, never more than each
/// bucket allows, also when every call of the pipeline meets NOSCRIPT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_policies_goes_to_redis_directly_all_or_nothing() {
    let redis = PlainServer::start();
    let relay = Relay::start(&redis.url(), &["--redis-backend", "lua"]);
    let limiter = limiter(&redis, &relay);
    let per_key = Policy::builder("key").rule(Rule::per_hour("h", 5)).build().unwrap();
    let per_ip = Policy::builder("ip").rule(Rule::per_hour("h", 8)).build().unwrap();
    let checks =
        [Check { policy: &per_key, subject: "k1", cost: 1 }, Check { policy: &per_ip, subject: "10.0.0.1", cost: 1 }];
    let mut allowed = 0;
    let mut batch = async |flush: bool| {
        if flush {
            script_flush(&redis);
        }
        let decisions = limiter.check_batch(&checks).await.unwrap();
        assert!(decisions.iter().flatten().all(|d| d.source != Source::Fallback), "{decisions:?}");
        let decided: Vec<bool> = decisions.iter().flatten().map(|d| d.allowed).collect();
        if decided.len() == 2 && decided.iter().all(|&a| a) {
            allowed += 1;
        } else {
            assert!(decided.iter().any(|&a| !a), "a partial answer refuses: {decisions:?}");
        }
    };
    batch(false).await;
    batch(false).await;
    kill(relay, limiter.client()).await;
    for n in 0..10 {
        batch(n % 3 == 0).await;
    }
    assert_eq!(allowed, 5, "the key's 5 an hour binds both");
    // Refused requests were refunded to the address's bucket: 3 of 8 left.
    let d = limiter.check(&per_ip, "10.0.0.1").await.unwrap();
    assert!(d.allowed && d.remaining == 2, "{d:?}");
}

/// A pipeline of the module's commands on the direct path (rl-gateway's
/// batches: RL.TAKE and RL.WINDOW on one slot) after Redis forgot the
/// window script: its calls answered NOSCRIPT and did not run, so they
/// alone are sent once more after it is loaded; every call runs once, each
/// reply in its command's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_that_meets_noscript_runs_each_call_once() {
    let redis = PlainServer::start();
    let relay = Relay::start(&redis.url(), &["--redis-backend", "lua"]);
    let limiter = limiter(&redis, &relay);
    let client = limiter.client().clone();
    kill(relay, &client).await;
    // Redis holds the bucket script, not the window script: the buckets'
    // calls run at once, the windows' are answered NOSCRIPT.
    script_flush(&redis);
    let _: String = redis::cmd("SCRIPT").arg("LOAD").arg(Script::Bucket.source()).query(&mut redis.con()).unwrap();
    let bucket = (["rl:{p}:b".to_string()], [BucketParams::new(3, 1, 3_600_000).unwrap()]);
    let window = (["rl:{p}:w".to_string()], [BucketParams::new(2, 2, 86_400_000).unwrap()]);
    let mut cmds = Vec::new();
    for _ in 0..4 {
        cmds.push((client.take_command(None, &bucket.0, &bucket.1, 1).unwrap(), 1));
    }
    // A command the scripts do not serve, answered in its place, unsent.
    let mut throttle = redis::cmd("CL.THROTTLE");
    throttle.arg("rl:{p}:t").arg(10).arg(1).arg(60).arg(1);
    cmds.push((throttle, 1));
    for _ in 0..3 {
        cmds.push((client.take_command(Some(WindowMode::Sliding), &window.0, &window.1, 1).unwrap(), 1));
    }
    let mut decisions = client.pipeline(cmds, slot_of("rl:{p}:b")).await.unwrap();
    let refused = decisions.remove(4).unwrap_err().to_string();
    assert!(refused.contains("CL.THROTTLE needs the redis-rl module"), "{refused}");
    let got: Vec<(bool, u64)> =
        decisions.iter().map(|d| d.as_ref().map(|d| (d.allowed, d.remaining)).unwrap()).collect();
    assert_eq!(got, [(true, 2), (true, 1), (true, 0), (false, 0), (true, 1), (true, 0), (false, 0)]);
    let left = client.peek(&[Bucket::new("rl:{p}:b", 3, 1, Duration::from_secs(3600)).unwrap()], 1).await.unwrap();
    assert!(!left.allowed && left.remaining == 0, "{left:?}");
}

/// The direct path as docs/security.md's `rl-gateway-lua` user (the relay
/// runs as another): the scripts, loaded again after a flush, and their
/// calls on the gateway's keys, one by one and pipelined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_gateway_user_serves_the_direct_path() {
    let redis = PlainServer::start();
    let mut admin = redis.con();
    let _: () = common::acl_recipe("security.md", "rl-gateway-lua", &mut admin, "pw").query(&mut admin).unwrap();
    let relay = Relay::start(&redis.url(), &["--redis-backend", "lua"]);
    let limiter = limiter_as(&format!("redis://rl-gateway-lua:pw@127.0.0.1:{}/", redis.port), &relay);
    let client = limiter.client().clone();
    kill(relay, &client).await;
    script_flush(&redis);
    let bucket = Policy::builder("gw:api").rule(Rule::per_hour("h", 2)).build().unwrap();
    assert_eq!(admitted(&limiter, &bucket, "u", 3).await, 2);
    let window = Window::new("gw:{w}:day", 1, Duration::from_secs(86_400)).unwrap();
    assert_eq!(counted(&client, &window, 2).await, 1);
    let slots = [Inflight::new("gw:{c}:slots", 1, Duration::from_secs(600)).unwrap()];
    let held = client.acquire(&slots, None, 1).await.unwrap();
    assert!(held.allowed, "{held:?}");
    assert!(!client.acquire(&slots, None, 1).await.unwrap().allowed);
    assert_eq!(client.release(&["gw:{c}:slots"], &held.id).await.unwrap(), 1);
    script_flush(&redis);
    let other = Policy::builder("gw:ip").rule(Rule::per_hour("h", 4)).build().unwrap();
    let checks = [Check { policy: &bucket, subject: "v", cost: 1 }, Check { policy: &other, subject: "v", cost: 1 }];
    let decisions = limiter.check_batch(&checks).await.unwrap();
    assert!(decisions.iter().flatten().all(|d| d.allowed && d.source == Source::Redis), "{decisions:?}");
    let log: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query(&mut admin).unwrap();
    assert!(log.is_empty(), "nothing refused: {log:?}");
}

/// The example gateway as a reader runs it on a managed-like Redis:
/// `RL_BACKEND=lua`, `RL_RELAY` naming a relay on `--redis-backend lua`.
/// Its calls go through the relay; once the relay is killed they go to
/// Redis directly as the scripts' calls, and the limit holds: 5 an hour,
/// 5 admitted of 8 across both, the rest 429. A call made on the relay's
/// connection before the gateway saw it close is answered by its fallback
/// (it may have been served, so it is never sent again: docs/error-bounds.md,
/// one per gateway): another subject's calls take that turn here, until
/// the gateway's own script calls reach Redis.
#[test]
fn the_example_gateway_behind_a_relay_keeps_its_limit_when_the_relay_dies() {
    use std::io::{Read, Write};
    let redis = PlainServer::start();
    let relay = Relay::start(&redis.url(), &["--redis-backend", "lua"]);
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[rules]]\nid = \"default\"\nreason = \"r\"\nlimits = [{ name = \"h\", rate = 5, per = \"1h\" }]\n",
    )
    .unwrap();
    let port = testkit::free_port();
    let _gateway = KillOnDrop(
        std::process::Command::new(testkit::example_gateway())
            .env("REDIS_URL", redis.url())
            .env_remove("REDIS_SENTINELS")
            .env("RL_BACKEND", "lua")
            .env("RL_RELAY", relay.url())
            .env("RULES_FILE", &rules)
            .env("GATEWAY_PORT", port.to_string())
            .env("BACKEND_PORT", testkit::free_port().to_string())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status_of = |key: &str| -> u16 {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET /hello HTTP/1.1\r\nHost: x\r\nx-api-key: {key}\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the gateway did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = |_: usize| status_of("ann");
    let mut codes: Vec<u16> = (0..3).map(status).collect();
    assert_eq!(codes, [200, 200, 200]);
    assert!(relay.info_field("requests") > 0, "through the relay: {}", relay.info());
    drop(relay);
    let evalsha = || -> u64 {
        let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut redis.con()).unwrap();
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls=")?.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let before = evalsha();
    let deadline = Instant::now() + Duration::from_secs(20);
    while evalsha() == before {
        assert!(Instant::now() < deadline, "the gateway's own script calls never reached Redis");
        assert_ne!(status_of("probe"), 0, "the gateway answers");
    }
    codes.extend((0..5).map(status));
    assert_eq!(codes, [200, 200, 200, 200, 200, 429, 429, 429], "exact across the relay's death");
}

/// A child process stopped when the test ends, passed or not.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
