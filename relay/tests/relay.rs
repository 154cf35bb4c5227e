//! The relay as a real process between real gateways (rl-client Limiters)
//! and a real server with the module: the module's replies, no
//! over-admission through it, and a relay killed mid-traffic.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_core::BucketParams;
use rl_gateway::{Config, Limiter, LimiterConfig, Policy, Rule, Source};
use rl_relay::pool::batch;
use testkit::{free_port, Server};

/// An `rl-relay` child process, killed on drop.
struct Relay {
    child: Child,
    port: u16,
    args: Vec<String>,
}

impl Relay {
    fn start(redis_url: &str, relays: u32, window_ms: u64) -> Relay {
        let port = free_port();
        let args = vec![
            "--listen".to_string(),
            format!("127.0.0.1:{port}"),
            "--redis".to_string(),
            redis_url.to_string(),
            "--relays".to_string(),
            relays.to_string(),
            "--timeout-ms".to_string(),
            "1000".to_string(),
            "--lease-window-ms".to_string(),
            window_ms.to_string(),
        ];
        let mut relay = Relay { child: spawn(&args), port, args };
        relay.wait_listening();
        relay
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "rl-relay did not listen on {}", self.port);
            assert!(self.child.try_wait().unwrap().is_none(), "rl-relay exited");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: the relay's held tokens are lost with it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A new process on the same port (as a supervisor would restart it).
    fn restart(&mut self) {
        self.kill();
        self.child = spawn(&self.args);
        self.wait_listening();
    }

    fn con(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }

    fn info(&self, field: &str) -> u64 {
        let info: String = redis::cmd("INFO").arg("relay").query(&mut self.con()).unwrap();
        let value = info.lines().find_map(|l| l.strip_prefix(&format!("{field}:")));
        value.unwrap_or_else(|| panic!("INFO relay has no {field}: {info}")).parse().unwrap()
    }
}

fn spawn(args: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_rl-relay")).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ints(con: &mut redis::Connection, line: &str) -> redis::RedisResult<Vec<i64>> {
    let mut cmd = redis::Cmd::new();
    for arg in line.split(' ') {
        cmd.arg(arg);
    }
    cmd.query(con)
}

fn err(con: &mut redis::Connection, line: &str) -> String {
    testkit::server_error(&ints(con, line).unwrap_err())
}

#[test]
fn it_answers_as_the_module_does() {
    let s = Server::start(&[]);
    // Batches of a minute of the rate: 10 a minute, the whole bucket.
    let relay = Relay::start(&s.url(), 1, 60_000);
    let mut r = relay.con();
    let first = ints(&mut r, "RL.TAKE 1 rl:{a}:s 10 10 60000").unwrap();
    assert_eq!(first.len(), 6);
    assert_eq!((first[0], first[2], first[4], first[5]), (1, 0, 10, 0));
    assert!(first[1] <= 9, "{first:?}");
    let lease = ints(&mut r, "RL.LEASE 1 rl:{a}:s 10 10 60000 WANT 3").unwrap();
    assert_eq!((lease[0], lease[2], lease[4]), (3, 0, 10));
    // Redis granted the relay the whole bucket: it holds the rest.
    let direct = ints(&mut s.con(), "RL.PEEK 1 rl:{a}:s 10 10 60000").unwrap();
    assert_eq!(direct[0], 0, "the bucket is with the relay: {direct:?}");
    // Drain what the relay holds, then the refusal has the module's shape.
    let mut allowed = 4;
    loop {
        let reply = ints(&mut r, "RL.TAKE 1 rl:{a}:s 10 10 60000").unwrap();
        if reply[0] == 0 {
            assert!(reply[2] > 0 && reply[2] <= 6000, "a token's wait: {reply:?}");
            break;
        }
        allowed += 1;
        assert!(allowed <= 11, "more than the bucket and its refill");
    }
    // What the relay does not serve is Redis's answer, errors word for word.
    for bad in ["RL.TAKE 1 k 0 1 1000", "RL.LEASE 1 k 10 1 1000", "RL.TAKE 2 k k 1 1 1 1 1 1"] {
        assert_eq!(err(&mut r, bad), err(&mut s.con(), bad), "{bad}");
    }
    let peek = "RL.PEEK 1 rl:{b}:s 5 1 1000";
    assert_eq!(ints(&mut r, peek).unwrap(), ints(&mut s.con(), peek).unwrap());
    assert_eq!(ints(&mut r, "RL.REFUND 1 rl:{b}:s 5 1 1000 TOKENS 1").unwrap()[0], 1);
    // Only the module's commands are forwarded; connection state is not
    // relayed (the shared upstream connection would take it).
    for refused in ["SET plain v", "MULTI", "WATCH k", "SUBSCRIBE c"] {
        let e = err(&mut r, refused);
        let name = refused.split(' ').next().unwrap();
        assert_eq!(e, format!("ERR command '{name}' is not served by rl-relay"), "{refused}");
    }
    let plain: Option<String> = redis::cmd("GET").arg("plain").query(&mut s.con()).unwrap();
    assert_eq!(plain, None);
    assert!(relay.info("from_memory") >= 3);
    assert!(relay.info("upstream_leases") >= 1);
    assert!(relay.info("forwarded") >= 5);
}

/// Checks `policy` for `subject` on every gateway from `tasks` tasks each,
/// `per_task` times; (admitted by Redis or leases, admitted by the fallback,
/// decided by the fallback).
async fn traffic(gateways: &[Limiter], policy: &Arc<Policy>, tasks: usize, per_task: usize) -> (u64, u64, u64) {
    let mut handles = Vec::new();
    for l in gateways {
        for _ in 0..tasks {
            let (l, p) = (l.clone(), policy.clone());
            handles.push(tokio::spawn(async move {
                let mut counts = (0, 0, 0);
                for _ in 0..per_task {
                    let d = l.check(&p, "shared").await.expect("a check always decides");
                    match d.source {
                        Source::Fallback => {
                            counts.1 += u64::from(d.allowed);
                            counts.2 += 1;
                        }
                        _ => counts.0 += u64::from(d.allowed),
                    }
                }
                counts
            }));
        }
    }
    let mut total = (0, 0, 0);
    for h in handles {
        let (a, b, c) = h.await.unwrap();
        total = (total.0 + a, total.1 + b, total.2 + c);
    }
    total
}

fn gateways(url: &str, n: u32) -> Vec<Limiter> {
    fleet(n, Config::standalone(url))
}

/// `n` gateways on `target`, with quick breakers.
fn fleet(n: u32, target: Config) -> Vec<Limiter> {
    (0..n)
        .map(|_| {
            Limiter::new(LimiterConfig {
                gateways: n,
                ..LimiterConfig::new(Config {
                    timeout: Duration::from_millis(500),
                    connect_timeout: Duration::from_millis(500),
                    breaker_trip_after: 3,
                    breaker_open_for: Duration::from_millis(200),
                    ..target.clone()
                })
            })
            .unwrap()
        })
        .collect()
}

/// At most `capacity + refill x elapsed / period`, rounded up.
fn allowance(p: BucketParams, elapsed: Duration) -> u64 {
    p.capacity() + (u128::from(p.refill()) * elapsed.as_millis()).div_ceil(u128::from(p.period_ms())) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_through_one_relay_never_admit_more_than_the_bucket() {
    let s = Server::start(&[]);
    let relay = Relay::start(&s.url(), 1, 1000);
    // A slow rule (200 a minute): gateways send RL.TAKE, the relay serves
    // it from batches of 3. A fast one (500 a second): gateways lease 125
    // from the relay, the relay leases 500 from Redis.
    for (name, params) in
        [("slow", BucketParams::new(200, 200, 60_000).unwrap()), ("fast", BucketParams::new(500, 500, 1000).unwrap())]
    {
        let rule = Rule::new("r", params.capacity(), params.refill(), Duration::from_millis(params.period_ms()));
        let policy = Arc::new(Policy::builder(name).rule(rule).build().unwrap());
        let fleet = gateways(&relay.url(), 4);
        let started = Instant::now();
        let (admitted, by_fallback, fallback_decisions) = traffic(&fleet, &policy, 4, 400).await;
        let bound = allowance(params, started.elapsed());
        assert_eq!(fallback_decisions, 0, "{name}: every call answered (fallback admitted {by_fallback})");
        assert!(admitted <= bound, "{name}: {admitted} admitted through the relay, the bucket allows {bound}");
        assert!(6400 > 2 * bound, "{name}: the traffic presses the limit ({bound} allowed)");
        // Under only by what the relay and the gateways held when traffic
        // stopped: a relay's pool (two batches and a cost at most) and a
        // gateway's lease (two batches) each.
        let held = 2 * batch(&[params], 1000, 1) + 1 + 4 * 2 * batch(&[params], 1000, 4);
        assert!(admitted + held >= params.capacity(), "{name}: {admitted} admitted, more lost than held ({held})");
    }
    let requests = relay.info("requests");
    let upstream = relay.info("upstream_leases");
    assert!(upstream * 3 < requests, "{upstream} lease calls for {requests} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_mid_traffic_never_over_admits_and_gateways_go_on() {
    let s = Server::start(&[]);
    let mut relay = Relay::start(&s.url(), 1, 1000);
    let params = BucketParams::new(300, 300, 60_000).unwrap();
    let policy = Arc::new(Policy::builder("api").rule(Rule::per_minute("m", 300)).build().unwrap());
    let fleet = gateways(&relay.url(), 4);
    let started = Instant::now();
    let before = traffic(&fleet, &policy, 2, 100).await;
    assert_eq!(before.2, 0, "no fallback before the kill");
    relay.kill();
    // Refusals cached before the kill answer until their retry time (a
    // paced relay names up to its batch's refill, 1 s here); then the
    // gateways' fallback decides.
    let mut down = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while down.2 == 0 && Instant::now() < deadline {
        let round = traffic(&fleet, &policy, 2, 25).await;
        down = (down.0 + round.0, down.1 + round.1, down.2 + round.2);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What gateways still held (a lease of one token each) is spent.
    assert!(down.0 <= 4, "{} admitted through the dead relay", down.0);
    assert!(down.2 > 0, "the gateways' fallback decided");
    relay.restart();
    let back = Instant::now() + Duration::from_secs(20);
    let mut after = (0, 0, 0);
    while Instant::now() < back {
        let round = traffic(&fleet, &policy, 1, 20).await;
        after = (after.0 + round.0, after.1 + round.1, after.2 + round.2);
        if round.2 == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last = traffic(&fleet, &policy, 1, 20).await;
    assert_eq!(last.2, 0, "every gateway back on Redis decisions through the restarted relay");
    let bound = allowance(params, started.elapsed());
    let through_relay = before.0 + after.0 + last.0;
    assert!(through_relay <= bound, "{through_relay} admitted through the relay, the bucket allows {bound}");
    // The fallback's own bound: 2 x (capacity + rate x time) fleet-wide.
    let by_fallback = down.1 + after.1;
    assert!(by_fallback <= 2 * bound, "the fallback admitted {by_fallback}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_go_to_redis_directly_while_their_relay_is_down_and_back_after() {
    let s = Server::start(&[]);
    let mut relay = Relay::start(&s.url(), 1, 1000);
    let params = BucketParams::new(300, 300, 60_000).unwrap();
    let policy = Arc::new(Policy::builder("api").rule(Rule::per_minute("m", 300)).build().unwrap());
    let fleet = fleet(4, Config { relay: Some(relay.url()), ..Config::standalone(s.url()) });
    let started = Instant::now();
    let before = traffic(&fleet, &policy, 2, 100).await;
    assert_eq!(before.2, 0, "no fallback before the kill");
    assert!(relay.info("requests") > 0, "the gateways called the relay");
    relay.kill();
    let calls_at_kill = rl_calls(&s);
    // Redis answers in the relay's place: a call in flight on the dropped
    // connection may fall to the fallback (it may have been served), the
    // rest go to Redis directly once refusals cached before the kill (held
    // up to a second here) have run out.
    let killed = Instant::now();
    let mut down = (0, 0, 0);
    let mut checks = 0;
    while killed.elapsed() < Duration::from_secs(2) {
        let round = traffic(&fleet, &policy, 2, 25).await;
        down = (down.0 + round.0, down.1 + round.1, down.2 + round.2);
        checks += 200;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // At most the calls in flight on the dropped connections: 2 tasks x 4.
    assert!(down.2 <= 8, "{} of {checks} checks fell to the fallback with Redis up", down.2);
    assert!(rl_calls(&s) > calls_at_kill, "no gateway called Redis directly");
    let bucket_left = params.capacity().saturating_sub(before.0);
    assert!(down.0 > 0 || bucket_left == 0, "Redis admitted nothing directly ({bucket_left} left)");
    let down_for = killed.elapsed();
    relay.restart();
    // The relay's breaker probes it in the background and calls go back.
    let back = Instant::now() + Duration::from_secs(10);
    let mut after = (0, 0, 0);
    while relay.info("requests") == 0 && Instant::now() < back {
        let round = traffic(&fleet, &policy, 1, 10).await;
        after = (after.0 + round.0, after.1 + round.1, after.2 + round.2);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(relay.info("requests") > 0, "no gateway came back to the relay ({down_for:?} down)");
    assert_eq!(after.2, 0, "no fallback once the relay is back");
    let bound = allowance(params, started.elapsed());
    let admitted = before.0 + down.0 + after.0;
    assert!(admitted <= bound, "{admitted} admitted through the relay and directly, the bucket allows {bound}");
    let by_fallback = down.1;
    assert!(by_fallback <= down.2, "the fallback admitted {by_fallback}");
}

/// RL.TAKE and RL.LEASE calls the server has served.
fn rl_calls(s: &Server) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut s.con()).unwrap();
    let calls = |line: &str| line.split(['=', ',']).nth(1).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    info.lines().filter(|l| l.starts_with("cmdstat_rl.take:") || l.starts_with("cmdstat_rl.lease:")).map(calls).sum()
}

/// One request's several policies (`Limiter::check_batch`, the layer's path)
/// go through the relay as one pipeline: each decided as the module would,
/// all or nothing, never more than each bucket allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_policies_goes_through_the_relay_all_or_nothing() {
    let s = Server::start(&[]);
    let relay = Relay::start(&s.url(), 1, 1000);
    let limiter = Limiter::new(LimiterConfig {
        // Exact calls: each check reaches the relay.
        lease_window: Duration::from_millis(1),
        ..LimiterConfig::new(Config { relay: Some(relay.url()), ..Config::standalone(s.url()) })
    })
    .unwrap();
    let per_key = Policy::builder("key").rule(Rule::per_minute("m", 5)).build().unwrap();
    let per_ip = Policy::builder("ip").rule(Rule::per_minute("m", 8)).build().unwrap();
    let mut allowed = 0;
    for _ in 0..12 {
        let checks = [
            rl_gateway::Check { policy: &per_key, subject: "k1", cost: 1 },
            rl_gateway::Check { policy: &per_ip, subject: "10.0.0.1", cost: 1 },
        ];
        let decisions = limiter.check_batch(&checks).await.unwrap();
        let decided: Vec<bool> = decisions.iter().flatten().map(|d| d.allowed).collect();
        assert!(decisions.iter().flatten().all(|d| d.source != Source::Fallback), "{decisions:?}");
        if decided.len() == 2 && decided.iter().all(|&a| a) {
            allowed += 1;
        } else {
            assert!(decided.iter().any(|&a| !a), "a partial answer refuses: {decisions:?}");
        }
    }
    assert_eq!(allowed, 5, "the key's 5 a minute binds both");
    // Refused requests were refunded to the address's bucket: 3 of 8 left.
    let d = limiter.check(&per_ip, "10.0.0.1").await.unwrap();
    assert!(d.allowed && d.remaining == 2, "{d:?}");
    assert!(relay.info("requests") > 0, "the batch went through the relay");
}
