//! `make bench-rls`: the relay's RLS front (a release `rl-relay`, a child
//! process, asked over gRPC by the generated client of envoy-types) beside
//! envoyproxy/ratelimit's Redis work (its INCRBY + EXPIRE pipeline per
//! descriptor per request, replayed), against one redis-server with the
//! module, on the same machine. Prints a Markdown table.
//!
//! Cases: one hot descriptor; 10,000 quiet descriptors; three descriptors
//! per request. Then exactness: 32 concurrent callers on one descriptor of
//! a limit of 1,000, 2,000 requests: admitted against allowed.
//! Limitador is not driven: its crate builds only with its RocksDB storage.
//!
//! Redis calls per decision are counted on the server (INFO commandstats,
//! the INFO calls themselves left out). Latency is each call's, as the
//! caller sees it, with `CALLERS` callers at once (closed loop).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use testkit::{free_port, Server};
use tonic::transport::Channel;

const CALLERS: usize = 32;
const DECISIONS: usize = 20_000;
const OK: i32 = 1;

const CONFIG: &str = "\
domain: bench
descriptors:
  - key: hot
    rate_limit: { unit: hour, requests_per_unit: 1000000000 }
  - key: quiet
    rate_limit: { unit: hour, requests_per_unit: 1000 }
  - key: a
    rate_limit: { unit: hour, requests_per_unit: 1000000000 }
  - key: b
    rate_limit: { unit: hour, requests_per_unit: 1000000000 }
  - key: c
    rate_limit: { unit: hour, requests_per_unit: 1000000000 }
  - key: exact
    rate_limit: { unit: hour, requests_per_unit: 1000 }
";

/// A case: the descriptors of request `i` (entries of one key and value).
#[derive(Clone, Copy)]
enum Case {
    Hot,
    Quiet,
    Three,
    /// One descriptor of a limit of 1,000.
    Exact,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Hot => "one hot descriptor",
            Case::Quiet => "10,000 quiet descriptors",
            Case::Three => "three descriptors per request",
            Case::Exact => "exactness",
        }
    }

    fn descriptors(self, i: usize) -> Vec<(String, String)> {
        match self {
            Case::Hot => vec![("hot".into(), "k".into())],
            Case::Quiet => vec![("quiet".into(), format!("u{}", i % 10_000))],
            Case::Three => ["a", "b", "c"].iter().map(|k| (k.to_string(), "k".to_string())).collect(),
            Case::Exact => vec![("exact".into(), "k".into())],
        }
    }
}

struct Row {
    who: &'static str,
    case: &'static str,
    per_second: f64,
    p50: Duration,
    p99: Duration,
    calls_per_decision: f64,
}

struct Relay {
    child: Child,
    rls_port: u16,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn relay_bin() -> PathBuf {
    std::env::var_os("RL_RELAY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/rl-relay")))
}

fn start_relay(redis: &str, config: &std::path::Path) -> Relay {
    let (port, rls_port) = (free_port(), free_port());
    let child = Command::new(relay_bin())
        .args(["--listen", &format!("127.0.0.1:{port}"), "--redis", redis])
        .args(["--rls-listen", &format!("127.0.0.1:{rls_port}"), "--rls-config"])
        .arg(config)
        .args(["--rls-timeout-ms", "1000", "--timeout-ms", "1000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (make bench-rls builds it)", relay_bin().display()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", rls_port)).is_err() {
        assert!(Instant::now() < deadline, "rl-relay did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    Relay { child, rls_port }
}

/// Commands the server ran, INFO left out.
fn commands(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn request(descriptors: &[(String, String)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: descriptors
            .iter()
            .map(|(k, v)| RateLimitDescriptor {
                entries: vec![Entry { key: k.clone(), value: v.clone() }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 1,
    }
}

/// `total` requests of `case` from `CALLERS` callers: latencies, admitted, wall time.
async fn run_relay(channel: Channel, case: Case, total: usize) -> (Vec<Duration>, usize, Duration) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let mut client = RateLimitServiceClient::new(channel.clone());
            let next = next.clone();
            tokio::spawn(async move {
                let (mut lat, mut admitted) = (Vec::new(), 0);
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= total {
                        return (lat, admitted);
                    }
                    let r = request(&case.descriptors(i));
                    let t = Instant::now();
                    let answer = client.should_rate_limit(r).await.expect("ShouldRateLimit").into_inner();
                    lat.push(t.elapsed());
                    admitted += usize::from(answer.overall_code == OK);
                }
            })
        })
        .collect();
    let (mut lat, mut admitted) = (Vec::with_capacity(total), 0);
    for c in callers {
        let (l, a) = c.await.unwrap();
        lat.extend(l);
        admitted += a;
    }
    (lat, admitted, started.elapsed())
}

/// The hot case at `rate` requests a second for `seconds`, open loop:
/// latencies from when each request was due (queueing counted).
async fn run_relay_paced(channel: Channel, rate: u64, seconds: u64) -> Vec<Duration> {
    let started = Instant::now();
    let total = rate * seconds;
    let mut calls = Vec::with_capacity(total as usize);
    for n in 0..total {
        let due = started + Duration::from_nanos(n * 1_000_000_000 / rate);
        tokio::time::sleep_until(due.into()).await;
        let mut client = RateLimitServiceClient::new(channel.clone());
        calls.push(tokio::spawn(async move {
            client.should_rate_limit(request(&Case::Hot.descriptors(0))).await.expect("ShouldRateLimit");
            due.elapsed()
        }));
    }
    let mut lat = Vec::with_capacity(calls.len());
    for c in calls {
        lat.push(c.await.unwrap());
    }
    lat.sort();
    lat
}

/// envoyproxy/ratelimit's work for `total` requests of `case`: per request
/// one pipeline of INCRBY + EXPIRE per descriptor, admitted when every
/// count is within its limit (it counts them all either way).
fn run_envoyproxy(url: &str, case: Case, total: usize, limit: u64) -> (Vec<Duration>, usize, Duration) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let window = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 3600 * 3600;
    let threads: Vec<_> = (0..CALLERS)
        .map(|_| {
            let next = next.clone();
            let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
            std::thread::spawn(move || {
                let (mut lat, mut admitted) = (Vec::new(), 0);
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= total {
                        return (lat, admitted);
                    }
                    let t = Instant::now();
                    let mut pipe = redis::pipe();
                    for (k, v) in case.descriptors(i) {
                        let key = format!("bench_{k}_{v}_{window}");
                        pipe.cmd("INCRBY").arg(&key).arg(1).cmd("EXPIRE").arg(&key).arg(3600).ignore();
                    }
                    let counts: Vec<u64> = pipe.query(&mut con).unwrap();
                    lat.push(t.elapsed());
                    admitted += usize::from(counts.iter().all(|&c| c <= limit));
                }
            })
        })
        .collect();
    let (mut lat, mut admitted) = (Vec::with_capacity(total), 0);
    for t in threads {
        let (l, a) = t.join().unwrap();
        lat.extend(l);
        admitted += a;
    }
    (lat, admitted, started.elapsed())
}

fn row(who: &'static str, case: &'static str, mut lat: Vec<Duration>, wall: Duration, calls: u64) -> Row {
    lat.sort();
    Row {
        who,
        case,
        per_second: lat.len() as f64 / wall.as_secs_f64(),
        p50: percentile(&lat, 0.50),
        p99: percentile(&lat, 0.99),
        calls_per_decision: calls as f64 / lat.len() as f64,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = Server::start(&[]);
    let dir = std::env::temp_dir().join(format!("bench-rls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("bench.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let relay = start_relay(&server.url(), &config);
    let channel =
        Channel::from_shared(format!("http://127.0.0.1:{}", relay.rls_port)).unwrap().connect().await.unwrap();
    let mut con = server.con();
    let mut rows = Vec::new();
    for case in [Case::Hot, Case::Quiet, Case::Three] {
        // Warm up (connections, the first lease), then measure.
        run_relay(channel.clone(), case, 2_000).await;
        let before = commands(&mut con);
        let (lat, _, wall) = run_relay(channel.clone(), case, DECISIONS).await;
        rows.push(row("rl-relay", case.name(), lat, wall, commands(&mut con) - before));
        let url = server.url();
        let before = commands(&mut con);
        let (lat, _, wall) =
            tokio::task::spawn_blocking(move || run_envoyproxy(&url, case, DECISIONS, u64::MAX)).await.unwrap();
        rows.push(row("envoyproxy/ratelimit's pipeline", case.name(), lat, wall, commands(&mut con) - before));
    }
    let paced = run_relay_paced(channel.clone(), 10_000, 2).await;
    // Exactness: 2,000 requests on a limit of 1,000, on keys not used yet.
    let (_, relay_admitted, _) = run_relay(channel.clone(), Case::Exact, 2_000).await;
    let url = server.url();
    let (_, replay_admitted, _) =
        tokio::task::spawn_blocking(move || run_envoyproxy(&url, Case::Exact, 2_000, 1_000)).await.unwrap();
    let exactness = [("rl-relay", relay_admitted), ("envoyproxy/ratelimit's pipeline", replay_admitted)];
    println!("| service | case | decisions/s | p50 | p99 | Redis calls per decision |");
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {:.3} ms | {:.3} ms | {:.4} |",
            r.who,
            r.case,
            r.per_second,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.calls_per_decision
        );
    }
    println!();
    println!(
        "rl-relay, one hot descriptor at 10,000 decisions a second for 2 s (open loop, from when each was due): \
         p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        percentile(&paced, 0.50).as_secs_f64() * 1e3,
        percentile(&paced, 0.99).as_secs_f64() * 1e3,
        paced.last().map_or(0.0, |d| d.as_secs_f64() * 1e3)
    );
    println!();
    println!("| service | admitted of 2,000 requests, {CALLERS} callers, limit 1,000 |");
    println!("|---|---|");
    for (who, admitted) in exactness {
        println!("| {who} | {admitted} |");
    }
    println!();
    println!("Limitador: not run (its crate builds only with its RocksDB storage: about 50 minutes of this machine).");
    let _ = std::fs::remove_dir_all(&dir);
}
