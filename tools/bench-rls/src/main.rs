//! `make bench-rls`: the relay's RLS front (a release `rl-relay`, a child
//! process, asked over gRPC by the generated client of envoy-types) beside
//! envoyproxy/ratelimit's Redis work (its INCRBY + EXPIRE pipeline per
//! descriptor per request, replayed) and Limitador (the `limitador` crate,
//! driven in-process: an `AsyncRateLimiter` on its `AsyncRedisStorage`, then
//! on its `CachedRedisStorage`, its default settings and, on the quiet
//! descriptors, 20,000 cached counters), against one
//! redis-server with the module, on the same machine. Prints a Markdown table.
//!
//! Cases: one hot descriptor; 10,000 quiet descriptors; three descriptors
//! per request. Then exactness: 32 concurrent callers on one descriptor of
//! a limit of 1,000, 2,000 requests: admitted against allowed.
//!
//! Redis calls per decision are counted on the server (INFO commandstats,
//! every command, the INFO calls themselves left out: commands that a
//! script or a module runs inside count too, and a breakdown by command is
//! printed under the table). The cached storage's writes are made in the
//! background: its count is read after one more flushing period, its
//! decisions/s over the decisions alone. CPU per decision: the service's
//! process (the relay's; the bench's own for the replay and Limitador,
//! which run in it, their callers included) from /proc, Redis's from INFO
//! cpu. Latency is each call's, as the
//! caller sees it, with `CALLERS` callers at once (closed loop). Then the
//! relay's hot descriptor alone: one caller, and rounds of an open loop at
//! 10,000 a second beside a probe of the machine's own pauses
//! (`cargo run --release -- paced` runs only these). `cargo run --release
//! -- relay` runs the relay's cases and exactness alone (two builds side by
//! side with RL_RELAY_BIN).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use limitador::limit::{Context, Limit, Predicate};
use limitador::storage::redis::{AsyncRedisStorage, DEFAULT_FLUSHING_PERIOD_SEC, DEFAULT_MAX_CACHED_COUNTERS};
use limitador::AsyncRateLimiter;
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
    /// Decisions per CPU second of the service's process.
    per_cpu_second: f64,
    /// Redis's CPU time per decision.
    redis_cpu: Duration,
    /// Commands per decision by name, most first.
    mix: Vec<(String, f64)>,
    /// Why there are no numbers: the run stopped making progress.
    stopped: Option<String>,
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

/// Commands the server ran, by name, INFO left out.
#[derive(Clone, Default)]
struct Commands(std::collections::BTreeMap<String, u64>);

impl Commands {
    fn total(&self) -> u64 {
        self.0.values().sum()
    }

    fn since(&self, before: &Commands) -> Commands {
        Commands(
            self.0
                .iter()
                .map(|(k, &n)| (k.clone(), n - before.0.get(k).copied().unwrap_or(0)))
                .filter(|&(_, n)| n > 0)
                .collect(),
        )
    }
}

/// What the server and a service's process have spent so far (or, from
/// [`Reading::since`], in a run): commands by name, and CPU seconds
/// (Redis's from INFO, to the µs; the process's from /proc, to 10 ms).
struct Reading {
    commands: Commands,
    redis_cpu: f64,
    service_cpu: f64,
}

impl Reading {
    /// The server's counts and the CPU of the process `service` (the
    /// relay's, or the bench's own for what runs in it).
    fn take(con: &mut redis::Connection, service: u32) -> Reading {
        let info: String = redis::cmd("INFO").arg("commandstats").arg("cpu").query(con).unwrap();
        let commands = Commands(
            info.lines()
                .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
                .filter_map(|l| {
                    let name = l.strip_prefix("cmdstat_")?.split(':').next()?.to_string();
                    Some((name, l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok()?))
                })
                .collect(),
        );
        let redis_cpu = info
            .lines()
            .filter_map(|l| l.strip_prefix("used_cpu_sys:").or_else(|| l.strip_prefix("used_cpu_user:")))
            .map(|v| v.trim().parse::<f64>().unwrap())
            .sum();
        Reading { commands, redis_cpu, service_cpu: process_cpu(service) }
    }

    fn since(&self, before: &Reading) -> Reading {
        Reading {
            commands: self.commands.since(&before.commands),
            redis_cpu: self.redis_cpu - before.redis_cpu,
            service_cpu: self.service_cpu - before.service_cpu,
        }
    }
}

/// CPU seconds (user and system, of every thread, those ended too) of the
/// process `pid`, from /proc: ticks of USER_HZ, which Linux fixes at 100.
fn process_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()) as f64 / 100.0
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

/// The callers' latencies, together, and how many they admitted.
async fn gather(callers: Vec<tokio::task::JoinHandle<(Vec<Duration>, usize)>>, total: usize) -> (Vec<Duration>, usize) {
    let (mut lat, mut admitted) = (Vec::with_capacity(total), 0);
    for c in callers {
        let (l, a) = c.await.unwrap();
        lat.extend(l);
        admitted += a;
    }
    (lat, admitted)
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
    let (lat, admitted) = gather(callers, total).await;
    (lat, admitted, started.elapsed())
}

/// The hot case from one caller, a request at a time: the round trip
/// alone, nothing queued.
async fn run_relay_one_caller(channel: Channel) -> Vec<Duration> {
    let mut client = RateLimitServiceClient::new(channel);
    let mut lat = Vec::with_capacity(3_000);
    for _ in 0..3_000 {
        let t = Instant::now();
        client.should_rate_limit(request(&Case::Hot.descriptors(0))).await.expect("ShouldRateLimit");
        lat.push(t.elapsed());
    }
    lat.sort();
    lat
}

/// Rounds of the open-loop run: a shared machine's neighbours make one
/// round's tail differ from the next's, so each is shown.
const PACED_ROUNDS: usize = 10;
/// How often the open loop's ticker wakes its sender: requests go out one
/// or two at a time, as from many independent callers (tokio's timer has
/// a 1 ms grain: a burst of ten every ms queues the tenth behind nine).
const PACED_GRAIN: Duration = Duration::from_micros(100);
/// A sleep of the pause probe, and how much longer one must take to count
/// as the machine's own pause.
const PROBE_SLEEP: Duration = Duration::from_micros(500);
const PAUSE: Duration = Duration::from_millis(2);

/// One open-loop round: its latencies, sorted, and the machine's own
/// pauses meanwhile.
struct Round {
    lat: Vec<Duration>,
    pauses: Vec<Duration>,
}

fn paced_rounds(port: u16) -> Vec<Round> {
    (0..PACED_ROUNDS).map(|_| run_relay_paced(port, 10_000, 2)).collect()
}

fn print_paced(one_caller: &[Duration], rounds: &[Round]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "rl-relay, one hot descriptor, one caller a request at a time: p50 {:.3} ms, p99 {:.3} ms",
        ms(percentile(one_caller, 0.50)),
        ms(percentile(one_caller, 0.99))
    );
    println!(
        "rl-relay, one hot descriptor at 10,000 decisions a second, {} rounds of 2 s (open loop, sent every {} µs, \
         from each send; the machine's pauses: sleeps of {} ms by an idle thread that took {} ms more):",
        rounds.len(),
        PACED_GRAIN.as_micros(),
        ms(PROBE_SLEEP),
        ms(PAUSE)
    );
    for (i, round) in rounds.iter().enumerate() {
        let longest = round.pauses.iter().max().copied().unwrap_or_default();
        println!(
            "- round {}: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; the machine paused {} times, {:.1} ms in all, the \
             longest {:.1} ms",
            i + 1,
            ms(percentile(&round.lat, 0.50)),
            ms(percentile(&round.lat, 0.99)),
            ms(round.lat.last().copied().unwrap_or_default()),
            round.pauses.len(),
            ms(round.pauses.iter().sum()),
            ms(longest)
        );
    }
    let within = |r: &Round| percentile(&r.lat, 0.99) <= Duration::from_millis(1);
    let quiet = rounds.iter().filter(|r| r.pauses.is_empty());
    println!(
        "p99 within 1 ms: {} of {} rounds; {} of the {} rounds in which the machine did not pause",
        rounds.iter().filter(|r| within(r)).count(),
        rounds.len(),
        quiet.clone().filter(|r| within(r)).count(),
        quiet.count()
    );
    let mut all: Vec<Duration> = rounds.iter().flat_map(|r| r.lat.iter().copied()).collect();
    all.sort_unstable();
    println!(
        "all {} rounds together, {} requests: p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms",
        rounds.len(),
        all.len(),
        ms(percentile(&all, 0.50)),
        ms(percentile(&all, 0.99)),
        ms(percentile(&all, 0.999))
    );
}

/// The machine's own pauses until `stop`: a thread that only sleeps
/// [`PROBE_SLEEP`] at a time, each sleep that took [`PAUSE`] longer (the
/// virtual machine's host, or a core held by another thread, kept it
/// from running).
fn probe_pauses(stop: Arc<std::sync::atomic::AtomicBool>) -> Vec<Duration> {
    let mut pauses = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let t = Instant::now();
        std::thread::sleep(PROBE_SLEEP);
        let late = t.elapsed().saturating_sub(PROBE_SLEEP);
        if late > PAUSE {
            pauses.push(late);
        }
    }
    pauses
}

/// The hot case at `rate` requests a second for `seconds`, open loop, from
/// a runtime of one thread of its own: a ticker thread wakes it every
/// [`PACED_GRAIN`], the requests due by then are sent, whatever is still
/// unanswered, and each latency runs from its send (so queueing counts).
fn run_relay_paced(port: u16, rate: u64, seconds: u64) -> Round {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let stop = stop.clone();
        std::thread::spawn(move || probe_pauses(stop))
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let lat = std::thread::spawn(move || {
        rt.block_on(async move {
            let channel = Channel::from_shared(format!("http://127.0.0.1:{port}")).unwrap().connect().await.unwrap();
            let (tx, mut ticks) = tokio::sync::mpsc::unbounded_channel::<()>();
            let ticker = std::thread::spawn(move || {
                while tx.send(()).is_ok() {
                    std::thread::sleep(PACED_GRAIN);
                }
            });
            let started = Instant::now();
            let total = rate * seconds;
            let mut calls = Vec::with_capacity(total as usize);
            let mut sent = 0;
            while sent < total {
                ticks.recv().await;
                let due = (started.elapsed().as_nanos() as u64 * rate / 1_000_000_000 + 1).min(total);
                for _ in sent..due {
                    let mut client = RateLimitServiceClient::new(channel.clone());
                    let at = Instant::now();
                    calls.push(tokio::spawn(async move {
                        client.should_rate_limit(request(&Case::Hot.descriptors(0))).await.expect("ShouldRateLimit");
                        at.elapsed()
                    }));
                }
                sent = sent.max(due);
            }
            drop(ticks);
            let mut lat = Vec::with_capacity(calls.len());
            for c in calls {
                lat.push(c.await.unwrap());
            }
            ticker.join().unwrap();
            lat.sort();
            lat
        })
    })
    .join()
    .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    Round { lat, pauses: probe.join().unwrap() }
}

/// CONFIG's limits for Limitador, in `namespace`: one per descriptor key,
/// counted per value (the key a variable of the limit), same limit, same
/// window (an hour).
fn limitador_limits(namespace: &'static str) -> Vec<Limit> {
    [
        ("hot", 1_000_000_000),
        ("quiet", 1_000),
        ("a", 1_000_000_000),
        ("b", 1_000_000_000),
        ("c", 1_000_000_000),
        ("exact", 1_000),
    ]
    .into_iter()
    .map(|(key, max)| Limit::new(namespace, max, 3600, Vec::<Predicate>::new(), [key.try_into().unwrap()]))
    .collect()
}

/// Limitador's work for `total` requests of `case`, in-process, from
/// `CALLERS` tasks: one `check_rate_limited_and_update` a request, its
/// context the request's descriptors (key: value), admitted when not limited.
async fn run_limitador(
    limiter: Arc<AsyncRateLimiter>,
    namespace: &'static str,
    case: Case,
    total: usize,
    done: Arc<std::sync::atomic::AtomicUsize>,
) -> (Vec<Duration>, usize, Duration) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (limiter, next, done) = (limiter.clone(), next.clone(), done.clone());
            tokio::spawn(async move {
                let (mut lat, mut admitted) = (Vec::new(), 0);
                let namespace = namespace.into();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= total {
                        return (lat, admitted);
                    }
                    let values: std::collections::HashMap<String, String> = case.descriptors(i).into_iter().collect();
                    let ctx: Context = values.into();
                    let t = Instant::now();
                    let result =
                        limiter.check_rate_limited_and_update(&namespace, &ctx, 1).await.expect("Limitador check");
                    lat.push(t.elapsed());
                    admitted += usize::from(!result.limited);
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    let (lat, admitted) = gather(callers, total).await;
    (lat, admitted, started.elapsed())
}

/// What a run of Limitador's cached storage on a runtime of its own tells.
enum CachedEvent {
    Warmed,
    Measured(Vec<Duration>, usize, Duration),
}

/// Limitador's cached storage (a new one, `max_cached` counters, its other
/// settings its defaults) on a runtime and threads of its own, for `case`:
/// `warmup` requests and a flushing period, then, once `go` says so,
/// `total` requests and another flushing period. Apart because it can stop
/// making progress for good: on many descriptors (10,000 quiet ones) it did
/// here within its warm-up, its CPU idle, with 10,000 cached counters or
/// 20,000. From its source, a likely cause: `Batcher::add` holds a DashMap
/// entry (a lock of a shard) across the await of a semaphore, which
/// tokio's cooperative budget can make yield; a worker that then locks the
/// same shard blocks its thread. The bench gives up on it after
/// `CACHED_PATIENCE` without progress and goes on, leaving those threads.
fn spawn_cached(
    url: String,
    namespace: &'static str,
    max_cached: usize,
    case: Case,
    warmup: usize,
    total: usize,
    done: Arc<std::sync::atomic::AtomicUsize>,
) -> (std::sync::mpsc::Receiver<CachedEvent>, std::sync::mpsc::Sender<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let limiter = rt.block_on(async {
            let storage = limitador::storage::redis::CachedRedisStorageBuilder::new(&url)
                .max_cached_counters(max_cached)
                .build()
                .await
                .expect("Limitador's cached Redis storage");
            let limiter = Arc::new(AsyncRateLimiter::new_with_storage(Box::new(storage)));
            for limit in limitador_limits(namespace) {
                limiter.add_limit(limit);
            }
            if warmup > 0 {
                run_limitador(limiter.clone(), namespace, case, warmup, done.clone()).await;
                after_flush().await;
            }
            limiter
        });
        let _ = tx.send(CachedEvent::Warmed);
        if go_rx.recv().is_err() {
            return;
        }
        let (lat, admitted, wall) = rt.block_on(async {
            let measured = run_limitador(limiter, namespace, case, total, done).await;
            after_flush().await;
            measured
        });
        let _ = tx.send(CachedEvent::Measured(lat, admitted, wall));
    });
    (rx, go_tx)
}

/// How long a run of the cached storage may take before the bench gives up on it.
const CACHED_PATIENCE: Duration = Duration::from_secs(30);

/// A row of Limitador's cached storage for `case` (`None`: it stopped, and why).
fn cached_row(
    who: &'static str,
    url: &str,
    namespace: &'static str,
    max_cached: usize,
    case: Case,
    con: &mut redis::Connection,
) -> Row {
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (rx, go) = spawn_cached(url.to_string(), namespace, max_cached, case, 2_000, DECISIONS, done.clone());
    let stopped = |what: String| Row {
        who,
        case: case.name(),
        per_second: 0.0,
        p50: Duration::ZERO,
        p99: Duration::ZERO,
        calls_per_decision: 0.0,
        per_cpu_second: 0.0,
        redis_cpu: Duration::ZERO,
        mix: Vec::new(),
        stopped: Some(what),
    };
    if !matches!(rx.recv_timeout(CACHED_PATIENCE), Ok(CachedEvent::Warmed)) {
        return stopped(format!(
            "stopped in its warm-up: {} of 2,000 decisions, none more in {} s",
            done.load(std::sync::atomic::Ordering::Relaxed),
            CACHED_PATIENCE.as_secs()
        ));
    }
    let before = Reading::take(con, std::process::id());
    go.send(()).unwrap();
    match rx.recv_timeout(CACHED_PATIENCE) {
        Ok(CachedEvent::Measured(lat, _, wall)) => {
            row(who, case.name(), lat, wall, Reading::take(con, std::process::id()).since(&before))
        }
        _ => stopped(format!(
            "stopped: {} of {DECISIONS} decisions, none more in {} s",
            done.load(std::sync::atomic::Ordering::Relaxed).saturating_sub(2_000),
            CACHED_PATIENCE.as_secs()
        )),
    }
}

/// Admitted of `total` requests of `case` by a new cached storage of default settings (`None`: it stopped).
fn cached_admitted(url: &str, namespace: &'static str, case: Case, total: usize) -> Option<usize> {
    let (rx, go) =
        spawn_cached(url.to_string(), namespace, DEFAULT_MAX_CACHED_COUNTERS, case, 0, total, Arc::default());
    rx.recv_timeout(CACHED_PATIENCE).ok()?;
    go.send(()).ok()?;
    match rx.recv_timeout(CACHED_PATIENCE) {
        Ok(CachedEvent::Measured(_, admitted, _)) => Some(admitted),
        _ => None,
    }
}

/// One more flushing period of the cached storage (its writes to Redis are
/// in the background), and a little.
async fn after_flush() {
    tokio::time::sleep(Duration::from_millis(DEFAULT_FLUSHING_PERIOD_SEC * 1000 + 500)).await;
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

fn row(who: &'static str, case: &'static str, mut lat: Vec<Duration>, wall: Duration, spent: Reading) -> Row {
    lat.sort();
    let n = lat.len() as f64;
    let calls = &spent.commands;
    let mut mix: Vec<_> = calls.0.iter().map(|(k, &c)| (k.clone(), c as f64 / n)).collect();
    mix.sort_by(|a, b| b.1.total_cmp(&a.1));
    Row {
        mix,
        stopped: None,
        who,
        case,
        per_second: lat.len() as f64 / wall.as_secs_f64(),
        p50: percentile(&lat, 0.50),
        p99: percentile(&lat, 0.99),
        calls_per_decision: calls.total() as f64 / n,
        per_cpu_second: n / spent.service_cpu,
        redis_cpu: Duration::from_secs_f64(spent.redis_cpu / n),
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
    if std::env::args().nth(1).as_deref() == Some("paced") {
        // `cargo run --release -- paced`: the open-loop run alone.
        run_relay(channel.clone(), Case::Hot, 2_000).await;
        let one_caller = run_relay_one_caller(channel.clone()).await;
        print_paced(&one_caller, &tokio::task::block_in_place(|| paced_rounds(relay.rls_port)));
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("relay") {
        // `cargo run --release -- relay`: the relay's three cases and its
        // exactness alone, to set two builds side by side (RL_RELAY_BIN).
        let mut rows = Vec::new();
        for case in [Case::Hot, Case::Quiet, Case::Three] {
            run_relay(channel.clone(), case, 2_000).await;
            let before = Reading::take(&mut con, relay.child.id());
            let (lat, _, wall) = run_relay(channel.clone(), case, DECISIONS).await;
            rows.push(row("rl-relay", case.name(), lat, wall, Reading::take(&mut con, relay.child.id()).since(&before)));
        }
        let (_, admitted, _) = run_relay(channel.clone(), Case::Exact, 2_000).await;
        println!("| case | decisions/s | decisions per CPU second | p50 | p99 | Redis calls per decision |");
        println!("|---|---|---|---|---|---|");
        for r in &rows {
            println!(
                "| {} | {:.0} | {:.0} | {:.3} ms | {:.3} ms | {:.4} |",
                r.case,
                r.per_second,
                r.per_cpu_second,
                r.p50.as_secs_f64() * 1e3,
                r.p99.as_secs_f64() * 1e3,
                r.calls_per_decision
            );
        }
        println!("\nexactness: {admitted} admitted of 2,000 requests, {CALLERS} callers, limit 1,000");
        return;
    }
    // Limitador: the same limits in a namespace of each storage's own, so
    // that their counters are apart; the cached storage a new one for each
    // case (see spawn_cached).
    let (redis_ns, cached_ns) = ("limitador-redis", "limitador-cached");
    let limitador_redis = Arc::new(AsyncRateLimiter::new_with_storage(Box::new(
        AsyncRedisStorage::new(&server.url()).await.expect("Limitador's Redis storage"),
    )));
    for limit in limitador_limits(redis_ns) {
        limitador_redis.add_limit(limit);
    }
    let mut rows = Vec::new();
    for case in [Case::Hot, Case::Quiet, Case::Three] {
        // Warm up (connections, the first lease), then measure.
        run_relay(channel.clone(), case, 2_000).await;
        let (relay_pid, bench_pid) = (relay.child.id(), std::process::id());
        let before = Reading::take(&mut con, relay_pid);
        let (lat, _, wall) = run_relay(channel.clone(), case, DECISIONS).await;
        rows.push(row("rl-relay", case.name(), lat, wall, Reading::take(&mut con, relay_pid).since(&before)));
        eprintln!("rl-relay, {}: done", case.name());
        let url = server.url();
        let before = Reading::take(&mut con, bench_pid);
        let (lat, _, wall) =
            tokio::task::spawn_blocking(move || run_envoyproxy(&url, case, DECISIONS, u64::MAX)).await.unwrap();
        let spent = Reading::take(&mut con, bench_pid).since(&before);
        rows.push(row("envoyproxy/ratelimit's pipeline", case.name(), lat, wall, spent));
        eprintln!("envoyproxy/ratelimit's pipeline, {}: done", case.name());
        run_limitador(limitador_redis.clone(), redis_ns, case, 2_000, Arc::default()).await;
        let before = Reading::take(&mut con, bench_pid);
        let (lat, _, wall) = run_limitador(limitador_redis.clone(), redis_ns, case, DECISIONS, Arc::default()).await;
        let spent = Reading::take(&mut con, bench_pid).since(&before);
        rows.push(row("Limitador, Redis storage", case.name(), lat, wall, spent));
        eprintln!("Limitador, Redis storage, {}: done", case.name());
        let url = server.url();
        let who = "Limitador, cached Redis storage";
        rows.push(tokio::task::block_in_place(|| {
            cached_row(who, &url, cached_ns, DEFAULT_MAX_CACHED_COUNTERS, case, &mut con)
        }));
        if matches!(case, Case::Quiet) {
            // Its default of cached counters is this case's number of
            // descriptors; twice as many, one setting apart from the defaults.
            let who = "Limitador, cached Redis storage, 20,000 cached counters";
            rows.push(tokio::task::block_in_place(|| {
                cached_row(who, &url, "limitador-cached-20k", 20_000, case, &mut con)
            }));
        }
        eprintln!("Limitador, cached Redis storage, {}: done", case.name());
    }
    let one_caller = run_relay_one_caller(channel.clone()).await;
    let paced = tokio::task::block_in_place(|| paced_rounds(relay.rls_port));
    // Exactness: 2,000 requests on a limit of 1,000, on keys not used yet.
    let (_, relay_admitted, _) = run_relay(channel.clone(), Case::Exact, 2_000).await;
    let url = server.url();
    let (_, replay_admitted, _) =
        tokio::task::spawn_blocking(move || run_envoyproxy(&url, Case::Exact, 2_000, 1_000)).await.unwrap();
    let (_, redis_admitted, _) =
        run_limitador(limitador_redis.clone(), redis_ns, Case::Exact, 2_000, Arc::default()).await;
    let url = server.url();
    let cached = tokio::task::block_in_place(|| cached_admitted(&url, cached_ns, Case::Exact, 2_000));
    let exactness = [
        ("rl-relay", relay_admitted.to_string()),
        ("envoyproxy/ratelimit's pipeline", replay_admitted.to_string()),
        ("Limitador, Redis storage", redis_admitted.to_string()),
        ("Limitador, cached Redis storage", cached.map_or("stopped (no progress)".to_string(), |n| n.to_string())),
    ];
    println!(
        "| service | case | decisions/s | decisions per CPU second of the service | p50 | p99 | Redis calls per \
         decision | Redis CPU per decision |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        if let Some(why) = &r.stopped {
            println!("| {} | {} | {why} | – | – | – | – | – |", r.who, r.case);
            continue;
        }
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.3} ms | {:.3} ms | {:.4} | {:.1} µs |",
            r.who,
            r.case,
            r.per_second,
            r.per_cpu_second,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.calls_per_decision,
            r.redis_cpu.as_secs_f64() * 1e6
        );
    }
    println!();
    println!("Commands per decision, by command:");
    println!();
    for r in rows.iter().filter(|r| r.stopped.is_none()) {
        let mix: Vec<_> = r.mix.iter().map(|(k, c)| format!("{k} {c:.4}")).collect();
        println!("- {}, {}: {}", r.who, r.case, mix.join(", "));
    }
    println!();
    print_paced(&one_caller, &paced);
    println!();
    println!("| service | admitted of 2,000 requests, {CALLERS} callers, limit 1,000 |");
    println!("|---|---|");
    for (who, admitted) in exactness {
        println!("| {who} | {admitted} |");
    }
    println!();
    println!(
        "Limitador 0.14.0: AsyncRateLimiter in-process; cached storage with its defaults (flushing period {} s, \
         batch size {}, {} cached counters, response timeout {} ms).",
        DEFAULT_FLUSHING_PERIOD_SEC,
        limitador::storage::redis::DEFAULT_BATCH_SIZE,
        DEFAULT_MAX_CACHED_COUNTERS,
        limitador::storage::redis::DEFAULT_RESPONSE_TIMEOUT_MS
    );
    let _ = std::fs::remove_dir_all(&dir);
}
