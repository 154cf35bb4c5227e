//! A fleet of gateways against one real redis-server with the module: how
//! many Redis calls a request costs with and without leases and the deny
//! cache, whether any subject gets more than its limit allows, and what an
//! outage does.
//!
//! ```text
//! make sim                                    # builds the module, runs this, writes client/SIMULATION.md
//! cargo run --release -p rl-client --example fleet_sim -- --help
//! ```
//!
//! Each of `--gateways` (300) gateways is its own `Limiter` (configured with
//! `gateways = 300`), all in one process on tokio, sharing one redis-server
//! that the program starts (testkit). Time is real time. The traffic:
//!
//! - a few hot subjects (`--hot-rate`, 100,000 a second together): one on a
//!   10,000 a second plan, so it presses its limit; the others on a 100,000
//!   a second plan;
//! - many quiet subjects (`--quiet-rate` over `--quiet-subjects`) on a
//!   10 a second plan;
//! - one abuser in a retry loop (`--abuser-rate`) on that same 10 a second plan;
//! - logins (`--login-rate`), 30 a minute each, fail-closed.
//!
//! Every request goes to one gateway, round robin. Three phases: every
//! request one RL.TAKE (`Client::take`: no leases, no deny cache); the
//! `Limiter` (leases and deny cache); the `Limiter` again while the server
//! is killed for `--outage` seconds and restarted. The numbers printed all
//! come from the run: requests and decisions counted by the gateways,
//! Redis calls from the module's counters in the server's `INFO rl`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rl_client::{Bucket, Config, Decision, Event, Limiter, Policy, Rule, Source};
use testkit::Server;

const USAGE: &str = "\
fleet_sim: a fleet of gateways against one redis-server with the module

options (defaults in brackets):
  --gateways N          gateways, each its own Limiter [300]
  --seconds S           length of each steady phase [8]
  --outage S            seconds the server is down in the outage phase [4]
  --hot-subjects N      hot subjects [4]
  --hot-rate R          requests a second, all hot subjects together [100000]
  --quiet-subjects N    quiet subjects [5000]
  --quiet-rate R        requests a second, all quiet subjects together [10000]
  --abuser-rate R       requests a second of the abuser's retry loop [10000]
  --login-subjects N    subjects of the fail-closed login rule [100]
  --login-rate R        login requests a second, all together [200]
  --timeout-ms MS       the limiter's timeout per Redis call [50]
  --out FILE            also write the report (Markdown) to FILE
";

/// A lane wakes about once per request it owes, but not more often than
/// the shortest tick nor less often than the longest.
const SHORTEST_TICK: Duration = Duration::from_millis(10);
const LONGEST_TICK: Duration = Duration::from_millis(100);
/// Length of the outage phase before the kill and after the restart.
const BEFORE_OUTAGE: Duration = Duration::from_secs(3);
const AFTER_OUTAGE: Duration = Duration::from_secs(6);

#[derive(Clone, Debug)]
struct Settings {
    gateways: u32,
    seconds: f64,
    outage: f64,
    hot_subjects: usize,
    hot_rate: f64,
    quiet_subjects: usize,
    quiet_rate: f64,
    abuser_rate: f64,
    login_subjects: usize,
    login_rate: f64,
    timeout_ms: u64,
    out: Option<PathBuf>,
}

impl Settings {
    fn from_args() -> Result<Settings, String> {
        let mut s = Settings {
            gateways: 300,
            seconds: 8.0,
            outage: 4.0,
            hot_subjects: 4,
            hot_rate: 100_000.0,
            quiet_subjects: 5000,
            quiet_rate: 10_000.0,
            abuser_rate: 10_000.0,
            login_subjects: 100,
            login_rate: 200.0,
            timeout_ms: 50,
            out: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            if flag == "--help" || flag == "-h" {
                return Err(String::new());
            }
            let value = args.next().ok_or(format!("{flag} needs a value"))?;
            let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
            let num = |v: &str| v.parse::<f64>().map_err(|e| bad(&e)).and_then(|n| {
                if n.is_finite() && n > 0.0 { Ok(n) } else { Err(bad(&"must be above zero")) }
            });
            match flag.as_str() {
                "--gateways" => s.gateways = num(&value)? as u32,
                "--seconds" => s.seconds = num(&value)?,
                "--outage" => s.outage = num(&value)?,
                "--hot-subjects" => s.hot_subjects = num(&value)? as usize,
                "--hot-rate" => s.hot_rate = num(&value)?,
                "--quiet-subjects" => s.quiet_subjects = num(&value)? as usize,
                "--quiet-rate" => s.quiet_rate = num(&value)?,
                "--abuser-rate" => s.abuser_rate = num(&value)?,
                "--login-subjects" => s.login_subjects = num(&value)? as usize,
                "--login-rate" => s.login_rate = num(&value)?,
                "--timeout-ms" => s.timeout_ms = num(&value)? as u64,
                "--out" => s.out = Some(PathBuf::from(value)),
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        if s.gateways == 0 || s.hot_subjects == 0 || s.quiet_subjects == 0 || s.login_subjects == 0 {
            return Err("counts must be at least 1".into());
        }
        Ok(s)
    }

    fn offered_rate(&self) -> f64 {
        self.hot_rate + self.quiet_rate + self.abuser_rate + self.login_rate
    }
}

/// The plans subjects are on, under one key prefix per phase so that each
/// phase starts from full buckets.
struct Plans {
    /// A big customer's plan: 100,000 a second.
    big: Policy,
    /// A smaller plan the first hot subject is on, below what it sends.
    capped: Policy,
    /// Everyone else, the abuser included.
    standard: Policy,
    /// Login attempts: refused outright while Redis is down.
    login: Policy,
}

impl Plans {
    fn new(phase: &str) -> Plans {
        let plan = |name: &str, rule: Rule| {
            Policy::builder(format!("{phase}-{name}")).rule(rule).build().expect("the plans are valid")
        };
        Plans {
            big: plan("big", Rule::per_second("per_second", 100_000)),
            capped: plan("capped", Rule::per_second("per_second", 10_000)),
            standard: plan("standard", Rule::per_second("per_second", 10)),
            login: plan("login", Rule::per_minute("attempts", 30).fail_closed()),
        }
    }
}

/// Who sends a request: the classes of traffic, each with its own row in
/// the tallies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Hot(usize),
    Quiet,
    Abuser,
    Login,
}

struct Traffic {
    settings: Settings,
    classes: Vec<(Class, f64)>,
    hot: Vec<String>,
    quiet: Vec<String>,
    login: Vec<String>,
}

impl Traffic {
    fn new(s: &Settings) -> Traffic {
        let names = |kind: &str, n: usize| (0..n).map(|i| format!("{kind}-{i}")).collect::<Vec<_>>();
        let mut classes: Vec<(Class, f64)> =
            (0..s.hot_subjects).map(|i| (Class::Hot(i), s.hot_rate / s.hot_subjects as f64)).collect();
        classes.extend([(Class::Quiet, s.quiet_rate), (Class::Abuser, s.abuser_rate), (Class::Login, s.login_rate)]);
        Traffic {
            settings: s.clone(),
            classes,
            hot: names("hot", s.hot_subjects),
            quiet: names("quiet", s.quiet_subjects),
            login: names("login", s.login_subjects),
        }
    }

    /// The row of a class in the tallies.
    fn row(&self, class: Class) -> usize {
        let hot = self.settings.hot_subjects;
        match class {
            Class::Hot(i) => i,
            Class::Quiet => hot,
            Class::Abuser => hot + 1,
            Class::Login => hot + 2,
        }
    }

    fn label(&self, class: Class) -> String {
        match class {
            Class::Hot(i) => self.hot[i].clone(),
            Class::Quiet => format!("quiet ({} subjects)", self.settings.quiet_subjects),
            Class::Abuser => "abuser".into(),
            Class::Login => format!("login ({} subjects)", self.settings.login_subjects),
        }
    }

    fn policy<'a>(&self, plans: &'a Plans, class: Class) -> &'a Policy {
        match class {
            Class::Hot(0) => &plans.capped,
            Class::Hot(_) => &plans.big,
            Class::Quiet | Class::Abuser => &plans.standard,
            Class::Login => &plans.login,
        }
    }

    /// A subject of the class: hot and abuser are one each; quiet and login
    /// subjects are picked at random.
    fn subject(&self, class: Class) -> &str {
        match class {
            Class::Hot(i) => &self.hot[i],
            Class::Quiet => &self.quiet[fastrand::usize(..self.quiet.len())],
            Class::Abuser => "abuser",
            Class::Login => &self.login[fastrand::usize(..self.login.len())],
        }
    }
}

/// How the gateways decide in a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// One RL.TAKE per request (`Client::take`): no leases, no deny cache.
    PerRequest,
    /// `Limiter::check`: leases, deny cache, breaker and fallback.
    Limiter,
}

/// Where the outage phase stands; gateways read it around each request.
mod stage {
    pub const RUNNING: u8 = 0;
    pub const STOPPING: u8 = 1;
    pub const DOWN: u8 = 2;
    pub const RESTARTING: u8 = 3;
    pub const RESTARTED: u8 = 4;
}

/// When a request was decided: while the server ran (the steady phases,
/// and the outage phase before the kill), while it was down, after the
/// restart, or across a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Window {
    Running = 0,
    Down = 1,
    After = 2,
    Changing = 3,
}

fn window(issued: u8, decided: u8) -> Window {
    match (issued, decided) {
        (stage::RUNNING, stage::RUNNING) => Window::Running,
        (stage::DOWN, stage::DOWN) => Window::Down,
        (stage::RESTARTED, stage::RESTARTED) => Window::After,
        _ => Window::Changing,
    }
}

/// What decided a request; `Error` is a failed call of the per-request mode.
const SOURCES: [&str; 6] = ["Redis", "lease", "deny cache", "fallback", "fail-closed", "error"];

fn source_index(source: Option<Source>) -> usize {
    match source {
        Some(Source::Redis) => 0,
        Some(Source::Lease) => 1,
        Some(Source::DenyCache) => 2,
        Some(Source::Fallback) => 3,
        Some(Source::FailClosed) => 4,
        None => 5,
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    requests: u64,
    admitted: u64,
    /// Admitted by the local fallback (its bound is checked apart).
    fallback_admitted: u64,
    by_source: [u64; 6],
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.requests += o.requests;
        self.admitted += o.admitted;
        self.fallback_admitted += o.fallback_admitted;
        for (a, b) in self.by_source.iter_mut().zip(o.by_source) {
            *a += b;
        }
    }

    fn decided_in_memory(&self) -> u64 {
        self.by_source[1] + self.by_source[2]
    }
}

/// Latencies of a decision in ns, in buckets a quarter of a power of two wide.
#[derive(Clone)]
struct Latencies(Vec<u64>);

impl Latencies {
    fn new() -> Latencies {
        Latencies(vec![0; 4 * 40])
    }

    fn bucket(ns: u64) -> usize {
        let v = ns + 1;
        let e = 63 - v.leading_zeros() as usize;
        let m = if e >= 2 { (v >> (e - 2)) & 3 } else { (v << (2 - e)) & 3 } as usize;
        (4 * e + m).min(4 * 40 - 1)
    }

    /// The upper edge of a bucket, in ns.
    fn upper(bucket: usize) -> u64 {
        let (e, m) = (bucket / 4, (bucket % 4) as u64);
        ((4 + m + 1) << e) / 4 - 1
    }

    fn record(&mut self, d: Duration) {
        self.0[Self::bucket(d.as_nanos() as u64)] += 1;
    }

    fn add(&mut self, o: &Latencies) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a += b;
        }
    }

    /// The latency below which `q` of the requests were decided (bucket
    /// edge), in µs.
    fn quantile(&self, q: f64) -> f64 {
        let total: u64 = self.0.iter().sum();
        let mut seen = 0;
        for (i, n) in self.0.iter().enumerate() {
            seen += n;
            if seen as f64 >= q * total as f64 {
                return Self::upper(i) as f64 / 1000.0;
            }
        }
        0.0
    }
}

/// What a lane (or, merged, the fleet) saw in a phase.
#[derive(Clone)]
struct Stats {
    /// Per class row, per window.
    tallies: Vec<[Tally; 4]>,
    /// Admitted per quiet subject by Redis (not the fallback), before any
    /// outage.
    quiet_admitted: Vec<u64>,
    latencies: Latencies,
    /// Requests that fell due but were not sent before the phase ended.
    behind: u64,
    /// Per gateway, its first decision by Redis after the restart.
    back_on_redis: Vec<Option<Instant>>,
}

impl Stats {
    fn new(traffic: &Traffic) -> Stats {
        Stats {
            tallies: vec![[Tally::default(); 4]; traffic.classes.len()],
            quiet_admitted: vec![0; traffic.quiet.len()],
            latencies: Latencies::new(),
            behind: 0,
            back_on_redis: vec![None; traffic.settings.gateways as usize],
        }
    }

    fn merge(&mut self, o: Stats) {
        for (a, b) in self.tallies.iter_mut().zip(&o.tallies) {
            for w in 0..4 {
                a[w].add(&b[w]);
            }
        }
        for (a, b) in self.quiet_admitted.iter_mut().zip(&o.quiet_admitted) {
            *a += b;
        }
        self.latencies.add(&o.latencies);
        self.behind += o.behind;
        for (a, b) in self.back_on_redis.iter_mut().zip(o.back_on_redis) {
            *a = match (*a, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
        }
    }

    /// Every class and window together.
    fn total(&self) -> Tally {
        let mut t = Tally::default();
        self.tallies.iter().flatten().for_each(|x| t.add(x));
        t
    }
}

/// One request as a gateway in `mode` decides it; `None` when the call
/// failed (per-request mode only: the limiter always decides).
async fn decide(limiter: &Limiter, mode: Mode, policy: &Policy, subject: &str) -> Option<Decision> {
    match mode {
        Mode::Limiter => Some(limiter.check(policy, subject).await.expect("valid subjects")),
        Mode::PerRequest => {
            let keys = policy.keys(subject).expect("valid subjects");
            let buckets: Vec<Bucket> = keys
                .into_iter()
                .zip(policy.rules())
                .map(|(key, r)| Bucket::new(key, r.capacity(), r.refill(), r.period()).expect("valid rules"))
                .collect();
            limiter.client().take(&buckets, 1).await.ok()
        }
    }
}

/// One gateway's share of some classes of traffic: a lane sends its
/// requests one after another, so a slow call delays only its own lane (a
/// gateway serves its hot, quiet, abuser and login traffic side by side).
struct Lane {
    gateway: usize,
    limiter: Limiter,
    /// Indexes into `Traffic::classes`.
    classes: Vec<usize>,
}

/// Runs a lane from `start` to `end`: every tick it sends the requests that
/// fell due, in random order.
async fn run_lane(
    lane: Lane,
    traffic: Arc<Traffic>,
    plans: Arc<Plans>,
    mode: Mode,
    (start, end): (Instant, Instant),
    progress: Arc<AtomicU8>,
) -> Stats {
    let Lane { gateway, limiter, classes } = lane;
    let mut stats = Stats::new(&traffic);
    let gateways = f64::from(traffic.settings.gateways);
    let rate: f64 = classes.iter().map(|&c| traffic.classes[c].1 / gateways).sum();
    let tick = Duration::from_secs_f64(1.0 / rate).clamp(SHORTEST_TICK, LONGEST_TICK);
    let mut sent = vec![0u64; traffic.classes.len()];
    let mut due = Vec::new();
    // Lanes wake at different points of the tick, as real gateways would.
    let mut next = start + tick.mul_f64(fastrand::f64());
    'phase: loop {
        tokio::time::sleep_until(next.into()).await;
        next += tick;
        let elapsed = Instant::now().min(end).duration_since(start).as_secs_f64();
        due.clear();
        for &c in &classes {
            let (class, rate) = traffic.classes[c];
            let owed = (rate / gateways * elapsed) as u64;
            due.extend((sent[c]..owed).map(|_| (c, class)));
        }
        fastrand::shuffle(&mut due);
        for &(c, class) in &due {
            if Instant::now() >= end {
                break 'phase;
            }
            let policy = traffic.policy(&plans, class);
            let subject = traffic.subject(class);
            let issued = progress.load(Ordering::Acquire);
            let began = Instant::now();
            let decision = decide(&limiter, mode, policy, subject).await;
            stats.latencies.record(began.elapsed());
            let decided = progress.load(Ordering::Acquire);
            let source = decision.map(|d| d.source);
            let admitted = decision.is_some_and(|d| d.allowed);
            let w = window(issued, decided);
            let t = &mut stats.tallies[traffic.row(class)][w as usize];
            t.requests += 1;
            t.admitted += u64::from(admitted);
            t.fallback_admitted += u64::from(admitted && source == Some(Source::Fallback));
            t.by_source[source_index(source)] += 1;
            if class == Class::Quiet && w == Window::Running && admitted && source != Some(Source::Fallback) {
                let i: usize = subject["quiet-".len()..].parse().expect("quiet-N");
                stats.quiet_admitted[i] += 1;
            }
            if w == Window::After && source == Some(Source::Redis) && stats.back_on_redis[gateway].is_none() {
                stats.back_on_redis[gateway] = Some(Instant::now());
            }
            sent[c] += 1;
        }
        if Instant::now() >= end {
            break;
        }
    }
    let owed_at_end = |&c: &usize| (traffic.classes[c].1 / gateways * end.duration_since(start).as_secs_f64()) as u64;
    stats.behind = classes.iter().map(owed_at_end).sum::<u64>().saturating_sub(sent.iter().sum());
    stats
}

/// Calls of the limiter's commands the server has run since it started
/// (the module's own counters in `INFO rl`).
fn redis_calls(server: &Server) -> u64 {
    let count = |field: &str| server.info("rl", field).parse::<u64>().expect("a count in INFO rl");
    tokio::task::block_in_place(|| ["rl_take_calls", "rl_lease_calls", "rl_refund_calls"].into_iter().map(count).sum())
}

/// Every limiter's total of `event`.
fn count(fleet: &[Limiter], event: Event) -> u64 {
    fleet.iter().map(|l| l.counters().get(event)).sum()
}

struct Phase {
    name: &'static str,
    mode: Mode,
    seconds: f64,
    stats: Stats,
    calls: u64,
    errors: u64,
    breakers_opened: u64,
    /// For the outage phase: how long the server was down, and when it
    /// answered again.
    down: Option<(f64, Instant)>,
}

/// Runs the whole fleet for `length`; with `outage`, kills the server
/// `BEFORE_OUTAGE` in and restarts it `outage` later.
async fn run_phase(
    name: &'static str,
    fleet: &[Limiter],
    traffic: &Arc<Traffic>,
    mode: Mode,
    length: Duration,
    server: &mut Server,
    outage: Option<Duration>,
) -> Phase {
    let plans = Arc::new(Plans::new(name));
    let progress = Arc::new(AtomicU8::new(stage::RUNNING));
    let (errors, opened) = (count(fleet, Event::Error), count(fleet, Event::BreakerOpened));
    let calls_at_start = redis_calls(server);
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + length;
    // Per gateway, one lane for the hot subjects and one for each other class.
    let hot: Vec<usize> = (0..traffic.settings.hot_subjects).collect();
    let others = (hot.len()..traffic.classes.len()).map(|c| vec![c]);
    let class_sets: Vec<Vec<usize>> = std::iter::once(hot).chain(others).collect();
    let mut lanes = Vec::new();
    for (gateway, limiter) in fleet.iter().enumerate() {
        for classes in &class_sets {
            let lane = Lane { gateway, limiter: limiter.clone(), classes: classes.clone() };
            let run = run_lane(lane, traffic.clone(), plans.clone(), mode, (start, end), progress.clone());
            lanes.push(tokio::spawn(run));
        }
    }
    let mut calls = 0;
    let mut down = None;
    if let Some(outage) = outage {
        tokio::time::sleep_until((start + BEFORE_OUTAGE).into()).await;
        progress.store(stage::STOPPING, Ordering::Release);
        calls += redis_calls(server) - calls_at_start;
        tokio::task::block_in_place(|| server.kill());
        let killed = Instant::now();
        progress.store(stage::DOWN, Ordering::Release);
        tokio::time::sleep(outage).await;
        progress.store(stage::RESTARTING, Ordering::Release);
        let seconds_down = killed.elapsed().as_secs_f64();
        tokio::task::block_in_place(|| server.restart());
        down = Some((seconds_down, Instant::now()));
        progress.store(stage::RESTARTED, Ordering::Release);
    }
    let mut stats = Stats::new(traffic);
    for lane in lanes {
        stats.merge(lane.await.expect("a lane"));
    }
    let seconds = end.duration_since(start).as_secs_f64();
    calls += redis_calls(server) - if outage.is_some() { 0 } else { calls_at_start };
    Phase {
        name,
        mode,
        seconds,
        stats,
        calls,
        errors: count(fleet, Event::Error) - errors,
        breakers_opened: count(fleet, Event::BreakerOpened) - opened,
        down,
    }
}

/// Most a bucket of `capacity` refilled at `rate` a second admits in `seconds`.
fn allowance(policy: &Policy, seconds: f64) -> f64 {
    let r = &policy.rules()[0];
    r.capacity() as f64 + r.refill() as f64 * seconds / r.period().as_secs_f64()
}

fn pass(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "FAIL"
    }
}

fn per_second(n: u64, seconds: f64) -> String {
    thousands((n as f64 / seconds).round() as u64)
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The report: Markdown tables, then the PASS/FAIL lines of the checks.
fn report(settings: &Settings, traffic: &Traffic, phases: &[Phase], header: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{header}");
    calls_table(&mut out, settings, phases);
    let mut checks = allowance_table(&mut out, settings, traffic, phases);
    if let Some(p) = phases.iter().find(|p| p.down.is_some()) {
        checks.extend(outage_table(&mut out, settings, traffic, p));
    }
    let _ = writeln!(out, "\n### Checks\n\n```text");
    calls_summary(&mut out, traffic, phases);
    for line in checks {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out, "```");
    out
}

/// The phases side by side: requests, Redis calls, latency.
fn calls_table(w: &mut String, settings: &Settings, phases: &[Phase]) {
    let _ = writeln!(w, "### Redis calls per request\n");
    let _ = writeln!(
        w,
        "| phase | decisions by | offered req/s | sent req/s | requests | Redis calls | calls / request | decided in memory | failed calls | breakers opened | p50 | p99 |"
    );
    let _ = writeln!(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in phases {
        let t = p.stats.total();
        let by = match p.mode {
            Mode::PerRequest => "one RL.TAKE each",
            Mode::Limiter => "Limiter (leases, deny cache)",
        };
        let failed = if p.mode == Mode::PerRequest { t.by_source[5] } else { p.errors };
        let _ = writeln!(
            w,
            "| {} | {by} | {} | {} | {} | {} | {:.3} | {:.1}% | {} | {} | {:.1} µs | {:.1} µs |",
            p.name,
            thousands(settings.offered_rate() as u64),
            per_second(t.requests, p.seconds),
            thousands(t.requests),
            thousands(p.calls),
            p.calls as f64 / t.requests.max(1) as f64,
            100.0 * t.decided_in_memory() as f64 / t.requests.max(1) as f64,
            thousands(failed),
            p.breakers_opened,
            p.stats.latencies.quantile(0.5),
            p.stats.latencies.quantile(0.99),
        );
    }
    let behind: Vec<String> = phases.iter().map(|p| format!("{} {}", p.name, thousands(p.stats.behind))).collect();
    let _ = writeln!(w, "\nRequests that fell due but were not sent before their phase ended (the machine could not keep up): {}.", behind.join(", "));
}

/// Per subject, admitted against the allowance in the steady phases, and
/// what decided its requests. Returns the check lines.
fn allowance_table(w: &mut String, settings: &Settings, traffic: &Traffic, phases: &[Phase]) -> Vec<String> {
    let plans = Plans::new("report");
    let _ = writeln!(w, "\n### Admitted against what the limit allows, and what decided\n");
    let _ = writeln!(
        w,
        "Allowance = capacity + rate × the phase's length (buckets start full). What Redis and the leases admitted \
         is checked against it (the local fallback answers only when a call fails, and has its own bound: see the \
         outage). Quiet subjects are checked one by one (the row shows the busiest); the logins' allowance is all \
         their subjects' together. The last columns count requests by what decided them: Redis (the request waited \
         for a call), the lease or the deny cache (memory), the fallback.\n"
    );
    let _ = writeln!(w, "| subject | limit | phase | requests | admitted | by Redis and leases | allowance | by Redis and leases / allowance | Redis | lease | deny cache | fallback |");
    let _ = writeln!(w, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut never_over = true;
    let mut exact = true;
    let mut fallbacks = 0;
    for p in phases.iter().filter(|p| p.down.is_none()) {
        for &(class, _) in &traffic.classes {
            let policy = traffic.policy(&plans, class);
            let limit = &policy.rules()[0];
            let t = p.stats.tallies[traffic.row(class)][Window::Running as usize];
            let by_redis = t.admitted - t.fallback_admitted;
            let (checked, allowed) = match class {
                Class::Quiet => {
                    let busiest = p.stats.quiet_admitted.iter().copied().max().unwrap_or(0);
                    (busiest, allowance(policy, p.seconds))
                }
                Class::Login => (by_redis, allowance(policy, p.seconds) * settings.login_subjects as f64),
                _ => (by_redis, allowance(policy, p.seconds)),
            };
            let within = checked as f64 <= allowed;
            match p.mode {
                Mode::Limiter => {
                    never_over &= within;
                    fallbacks += t.by_source[3];
                }
                Mode::PerRequest => exact &= within,
            }
            let (checked_text, allowed_text) = if class == Class::Quiet {
                (format!("{} (busiest: {})", thousands(by_redis), thousands(checked)), format!("{} each", thousands(allowed as u64)))
            } else {
                (thousands(checked), thousands(allowed as u64))
            };
            let _ = writeln!(
                w,
                "| {} | {} / {:?} | {} | {} | {} | {checked_text} | {allowed_text} | {:.3} | {} | {} | {} | {} |",
                traffic.label(class),
                thousands(limit.refill()),
                limit.period(),
                p.name,
                thousands(t.requests),
                thousands(t.admitted),
                checked as f64 / allowed,
                thousands(t.by_source[0]),
                thousands(t.by_source[1]),
                thousands(t.by_source[2]),
                thousands(t.by_source[3]),
            );
        }
    }
    vec![
        format!("per-request RL.TAKE never admits over the allowance: {}", pass(exact)),
        format!("leases and the deny cache never admit over the allowance: {}", pass(never_over)),
        format!("  (the fallback decided {} requests of the steady leases phase, after failed calls)", thousands(fallbacks)),
    ]
}

/// The outage phase by window: before the kill, server down, after the
/// restart; and how soon each gateway went back to Redis. Returns the
/// check lines.
fn outage_table(w: &mut String, settings: &Settings, traffic: &Traffic, p: &Phase) -> Vec<String> {
    let plans = Plans::new("report");
    let mut checks = Vec::new();
    let (seconds_down, restarted) = p.down.expect("an outage phase");
    let gateways = settings.gateways as usize;
    let slack = Config::standalone("").fallback_slack;
    let _ = writeln!(w, "\n### Outage: the server killed for {seconds_down:.1} s, then restarted (empty: no persistence)\n");
    let _ = writeln!(
        w,
        "While the server is down a fail-open rule should admit at most max({slack} × capacity, {gateways}) + \
         {slack} × rate × {seconds_down:.1} s fleet-wide (the outage bound: {slack} × (capacity + rate × time), the \
         design's promise, when each gateway's share of the capacity is a token or more; one token per gateway at \
         once when it is less); and traffic within its limit should still get through (the API stays up). The \
         fallback's own bound is what its local buckets hold: per gateway capacity × {slack} / {gateways} tokens, \
         rounded down but one at least, to start with, and {slack} × rate over the fleet. Fail-closed rules should \
         admit nothing. Before the kill, what Redis and the leases admitted against the allowance of a full bucket \
         over {} s. Rows of several subjects add their subjects' bounds; a subject is within its limit when it \
         sends less than its rate.\n",
        BEFORE_OUTAGE.as_secs(),
    );
    let _ = writeln!(w, "| traffic | rule | window | requests | admitted | outage bound | admitted / bound | admitted / (2 × limit) | admitted by the fallback | fallback's bound | decided by |");
    let _ = writeln!(w, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut over_bound = Vec::new();
    let mut over_twice = Vec::new();
    let mut over_fallback = Vec::new();
    let mut shut_out = Vec::new();
    let mut before_within = true;
    let mut closed_refused = true;
    for &(class, _) in &traffic.classes {
        let policy = traffic.policy(&plans, class);
        let rule = &policy.rules()[0];
        let fail_closed = class == Class::Login;
        let subjects = match class {
            Class::Quiet => settings.quiet_subjects as f64,
            Class::Login => settings.login_subjects as f64,
            _ => 1.0,
        };
        // A share below one token is one token per gateway.
        let per_gateway = (rule.capacity() as f64 * slack / gateways as f64).floor().max(1.0);
        let refill = rule.refill() as f64 / rule.period().as_secs_f64();
        let fallback_bound = (gateways as f64 * per_gateway + slack * refill * seconds_down) * subjects;
        let offered = traffic.classes[traffic.row(class)].1 / subjects;
        let within_limit = offered < refill;
        for window in [Window::Running, Window::Down, Window::After] {
            let t = p.stats.tallies[traffic.row(class)][window as usize];
            let sources: Vec<String> = SOURCES
                .iter()
                .zip(t.by_source)
                .filter(|(_, n)| *n > 0)
                .map(|(s, n)| format!("{s} {}", thousands(n)))
                .collect();
            let (name, bound, ratio, twice, by_fallback, fallback_text) = match window {
                Window::Running => {
                    let bound = allowance(policy, BEFORE_OUTAGE.as_secs_f64()) * subjects;
                    let by_redis = (t.admitted - t.fallback_admitted) as f64;
                    before_within &= by_redis <= bound;
                    let ratio = format!("{:.3} by Redis and leases", by_redis / bound);
                    let bound = format!("{} (1 × limit)", thousands(bound as u64));
                    ("before the kill", bound, ratio, "-".into(), thousands(t.fallback_admitted), "-".into())
                }
                Window::Down if fail_closed => {
                    closed_refused &= t.admitted == 0;
                    ("server down", "0".into(), "-".into(), "-".into(), thousands(t.fallback_admitted), "0".into())
                }
                Window::Down => {
                    let capacity = rule.capacity() as f64;
                    let bound = ((slack * capacity).max(gateways as f64) + slack * refill * seconds_down) * subjects;
                    if t.admitted as f64 > bound {
                        over_bound.push(format!("{} {:.2}x the bound", traffic.label(class), t.admitted as f64 / bound));
                    }
                    let twice = 2.0 * allowance(policy, seconds_down) * subjects;
                    if t.admitted as f64 > twice {
                        over_twice.push(format!("{} {:.1}x its limit", traffic.label(class), 2.0 * t.admitted as f64 / twice));
                    }
                    if t.fallback_admitted as f64 > fallback_bound {
                        over_fallback.push(format!("{} over", traffic.label(class)));
                    }
                    // Within its limit: at least 90% should pass (the slack covers uneven spreading).
                    if within_limit && (t.admitted as f64) < 0.9 * t.requests as f64 {
                        let share = 100.0 * t.admitted as f64 / t.requests.max(1) as f64;
                        shut_out.push(format!("{} {share:.1}% admitted", traffic.label(class)));
                    }
                    let ratio = format!("{:.3}", t.admitted as f64 / bound);
                    let twice = format!("{:.3}", t.admitted as f64 / twice);
                    let fallback_text = thousands(fallback_bound as u64);
                    ("server down", thousands(bound as u64), ratio, twice, thousands(t.fallback_admitted), fallback_text)
                }
                _ => ("after the restart", "-".into(), "-".into(), "-".into(), thousands(t.fallback_admitted), "-".into()),
            };
            let _ = writeln!(
                w,
                "| {} | {} | {name} | {} | {} | {bound} | {ratio} | {twice} | {by_fallback} | {fallback_text} | {} |",
                traffic.label(class),
                if fail_closed { "fail-closed" } else { "fail-open" },
                thousands(t.requests),
                thousands(t.admitted),
                sources.join(", "),
            );
        }
    }
    let mut back: Vec<f64> =
        p.stats.back_on_redis.iter().flatten().map(|t| t.duration_since(restarted).as_secs_f64()).collect();
    back.sort_by(f64::total_cmp);
    let median = back.get(back.len() / 2).copied().unwrap_or(f64::NAN);
    let last = back.last().copied().unwrap_or(f64::NAN);
    let _ = writeln!(
        w,
        "\nBack on Redis decisions after the restart: \
         {} of {gateways} gateways; the median after {median:.2} s, the last after {last:.2} s (a breaker stays open \
         {:?}, then one call probes).",
        back.len(),
        Config::standalone("").breaker_open_for,
    );
    checks.push(format!(
        "before the kill, leases and the deny cache never admit over the allowance: {}",
        pass(before_within)
    ));
    let listed = |v: &[String]| if v.is_empty() { String::new() } else { format!(" ({})", v.join(", ")) };
    checks.push(format!(
        "fail-open rules within max({slack} × capacity, {gateways}) + {slack} × rate × time while the server was down: {}{}",
        pass(over_bound.is_empty()),
        listed(&over_bound)
    ));
    if !over_twice.is_empty() {
        checks.push(format!(
            "  over 2x their limit (shares below one token: one request per gateway at once): {}",
            over_twice.join(", ")
        ));
    }
    checks.push(format!(
        "fail-open rules within the fallback's own bound while the server was down: {}{}",
        pass(over_fallback.is_empty()),
        listed(&over_fallback)
    ));
    checks.push(format!(
        "fail-open traffic within its limit still admitted (90% or more) while the server was down: {}{}",
        pass(shut_out.is_empty()),
        listed(&shut_out)
    ));
    checks.push(format!("fail-closed rule refused every request while the server was down: {}", pass(closed_refused)));
    checks.push(format!(
        "every gateway back on Redis decisions after the restart: {} ({} of {gateways})",
        pass(back.len() == gateways),
        back.len()
    ));
    checks
}

/// Redis calls per request with and without leases, and without the
/// subject that presses its limit.
fn calls_summary(w: &mut String, traffic: &Traffic, phases: &[Phase]) {
    let steady = |mode: Mode| phases.iter().find(|p| p.mode == mode && p.down.is_none());
    if let (Some(plain), Some(leased)) = (steady(Mode::PerRequest), steady(Mode::Limiter)) {
        let per_request = |p: &Phase| p.calls as f64 / p.stats.total().requests.max(1) as f64;
        let (plain_ratio, leased_ratio) = (per_request(plain), per_request(leased));
        let _ = writeln!(
            w,
            "Redis calls per request: {plain_ratio:.3} with one RL.TAKE each, {leased_ratio:.3} with leases and the deny cache ({:.1}x fewer)",
            plain_ratio / leased_ratio
        );
        // The subject pressing its limit, apart: its own requests and the
        // calls they waited for (its background top-ups stay in).
        let pressing = leased.stats.tallies[traffic.row(Class::Hot(0))][Window::Running as usize];
        let rest = leased.stats.total().requests - pressing.requests;
        let request_path: u64 = leased.stats.tallies.iter().map(|row| row[Window::Running as usize].by_source[0]).sum();
        let _ = writeln!(
            w,
            "  with leases: {} calls on the request path, {} in the background (lease top-ups, hand-backs)",
            thousands(request_path),
            thousands(leased.calls.saturating_sub(request_path))
        );
        let _ = writeln!(
            w,
            "  of which {} by {} requests waiting for a call; without them: {:.3} per request",
            thousands(pressing.by_source[0]),
            traffic.label(Class::Hot(0)),
            (leased.calls - pressing.by_source[0]) as f64 / rest.max(1) as f64
        );
    }
}

/// `YYYY-MM-DD HH:MM UTC` from the system clock.
fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", rest / 3600, rest % 3600 / 60)
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name")).map_or("unknown CPU", |m| m.trim_start_matches([' ', '\t', ':']));
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!("{cores} cores ({model}), load average {} at the start", load.join(" "))
}

fn server_version() -> String {
    let out = std::process::Command::new(testkit::server_binary()).arg("--version").output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown server".into())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let settings = match Settings::from_args() {
        Ok(s) => s,
        Err(e) => {
            eprint!("{}{USAGE}", if e.is_empty() { String::new() } else { format!("{e}\n\n") });
            std::process::exit(if e.is_empty() { 0 } else { 2 });
        }
    };
    let command = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let started = utc_now();
    let machine = machine();
    let mut server = Server::start(&[]);
    let config = Config {
        gateways: settings.gateways,
        timeout: Duration::from_millis(settings.timeout_ms),
        ..Config::standalone(server.url())
    };
    let fleet: Vec<Limiter> =
        (0..settings.gateways).map(|_| Limiter::new(config.clone()).expect("a valid config")).collect();
    // Connect every gateway before measuring (RL.PEEK is not counted); the
    // first call also connects, which can take longer than the timeout.
    let warm = Bucket::new("warm-up", 1, 1, Duration::from_secs(1)).expect("a bucket");
    for l in &fleet {
        let deadline = Instant::now() + Duration::from_secs(5);
        while l.client().peek(std::slice::from_ref(&warm), 1).await.is_err() {
            assert!(Instant::now() < deadline, "the server does not answer");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let traffic = Arc::new(Traffic::new(&settings));
    let steady = Duration::from_secs_f64(settings.seconds);
    let outage = Duration::from_secs_f64(settings.outage);
    eprintln!("{} gateways; phases of {:?}; the outage phase {:?}", settings.gateways, steady, BEFORE_OUTAGE + outage + AFTER_OUTAGE);
    let mut phases = Vec::new();
    for (name, mode, length, down) in [
        ("per-request", Mode::PerRequest, steady, None),
        ("leases", Mode::Limiter, steady, None),
        ("outage", Mode::Limiter, BEFORE_OUTAGE + outage + AFTER_OUTAGE, Some(outage)),
    ] {
        eprintln!("phase {name}...");
        phases.push(run_phase(name, &fleet, &traffic, mode, length, &mut server, down).await);
    }
    let header = format!(
        "## Fleet simulation\n\n{started}; {machine}; {}; module from this tree (release build).\n\n\
         Command: `make sim` (`cargo run --release -p rl-client --example fleet_sim --{}{command}`).\n\n\
         {} gateways (each a `Limiter` with `gateways = {}`, timeout {} ms, other settings default) in one process, \
         one server. Offered: {} hot subjects at {} req/s together (hot-0 on a 10,000/s plan, the others on 100,000/s), \
         {} quiet subjects at {} req/s together (10/s plan), an abuser at {} req/s (10/s plan), logins at {} req/s \
         (30/min, fail-closed). Phases of {} s; the outage phase runs {} s before the kill and {} s after the restart.\n",
        server_version(),
        if command.is_empty() { "" } else { " " },
        settings.gateways,
        settings.gateways,
        settings.timeout_ms,
        settings.hot_subjects,
        thousands(settings.hot_rate as u64),
        thousands(settings.quiet_subjects as u64),
        thousands(settings.quiet_rate as u64),
        thousands(settings.abuser_rate as u64),
        thousands(settings.login_rate as u64),
        settings.seconds,
        BEFORE_OUTAGE.as_secs(),
        AFTER_OUTAGE.as_secs(),
    );
    let text = report(&settings, &traffic, &phases, &header);
    println!("{text}");
    if let Some(path) = &settings.out {
        std::fs::write(path, format!("# Fleet simulation results\n\nWritten by `client/examples/fleet_sim.rs`; see the client README.\n\n{text}"))
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("written to {}", path.display());
    }
}
