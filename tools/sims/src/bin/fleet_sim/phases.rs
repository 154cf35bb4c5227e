//! The phases: lanes of requests on every gateway, and the outage.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_gateway::{Bucket, Decision, Event, Limiter, Policy, Source};
use testkit::Server;

use crate::stats::{source_index, Stats};
use crate::traffic::{Class, Plans, Traffic};

/// A lane wakes about once per request it owes, but not more often than
/// the shortest tick nor less often than the longest.
pub const SHORTEST_TICK: Duration = Duration::from_millis(10);
pub const LONGEST_TICK: Duration = Duration::from_millis(100);
/// Length of the outage phase before the kill and after the restart.
pub const BEFORE_OUTAGE: Duration = Duration::from_secs(3);
pub const AFTER_OUTAGE: Duration = Duration::from_secs(6);

/// How the gateways decide in a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One RL.TAKE per request (`Client::take`): no leases, no deny cache.
    PerRequest,
    /// `Limiter::check`: leases, deny cache, breaker and fallback.
    Limiter,
}

/// Where the outage phase stands; gateways read it around each request.
pub mod stage {
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
pub enum Window {
    Running = 0,
    Down = 1,
    After = 2,
    Changing = 3,
}

pub fn window(issued: u8, decided: u8) -> Window {
    match (issued, decided) {
        (stage::RUNNING, stage::RUNNING) => Window::Running,
        (stage::DOWN, stage::DOWN) => Window::Down,
        (stage::RESTARTED, stage::RESTARTED) => Window::After,
        _ => Window::Changing,
    }
}

/// One request as a gateway in `mode` decides it; `None` when the call
/// failed (per-request mode only: the limiter always decides).
pub async fn decide(limiter: &Limiter, mode: Mode, policy: &Policy, subject: &str) -> Option<Decision> {
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
pub struct Lane {
    pub gateway: usize,
    pub limiter: Limiter,
    /// Indexes into `Traffic::classes`.
    pub classes: Vec<usize>,
}

/// Runs a lane from `start` to `end`: every tick it sends the requests that
/// fell due, in random order.
pub async fn run_lane(
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
pub fn redis_calls(server: &Server) -> u64 {
    let count = |field: &str| server.info("rl", field).parse::<u64>().expect("a count in INFO rl");
    tokio::task::block_in_place(|| ["rl_take_calls", "rl_lease_calls", "rl_refund_calls"].into_iter().map(count).sum())
}

/// Every limiter's total of `event`.
pub fn count(fleet: &[Limiter], event: Event) -> u64 {
    fleet.iter().map(|l| l.counters().get(event)).sum()
}

/// What happens to the server during a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disturbance {
    None,
    /// Killed `BEFORE_OUTAGE` in, restarted this much later.
    Outage(Duration),
    /// Write commands paused `pause_ms` once every `every_ms`.
    Slow {
        pause_ms: u64,
        every_ms: u64,
    },
}

pub struct Phase {
    pub name: &'static str,
    pub disturbance: Disturbance,
    pub mode: Mode,
    pub seconds: f64,
    pub stats: Stats,
    pub calls: u64,
    pub errors: u64,
    pub breakers_opened: u64,
    /// For the outage phase: how long the server was down, and when it
    /// answered again.
    pub down: Option<(f64, Instant)>,
}

/// Runs the whole fleet for `length`; with `outage`, kills the server
/// `BEFORE_OUTAGE` in and restarts it `outage` later.
pub async fn run_phase(
    name: &'static str,
    fleet: &[Limiter],
    traffic: &Arc<Traffic>,
    mode: Mode,
    length: Duration,
    server: &mut Server,
    disturbance: Disturbance,
) -> Phase {
    let outage = match disturbance {
        Disturbance::Outage(d) => Some(d),
        _ => None,
    };
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
    let pauser = match disturbance {
        Disturbance::Slow { pause_ms, every_ms } => {
            let mut con = server.con();
            Some(std::thread::spawn(move || {
                std::thread::sleep(start.saturating_duration_since(Instant::now()));
                while Instant::now() + Duration::from_millis(every_ms) < end {
                    let _: () = redis::cmd("CLIENT")
                        .arg("PAUSE")
                        .arg(pause_ms)
                        .arg("WRITE")
                        .query(&mut con)
                        .expect("CLIENT PAUSE");
                    std::thread::sleep(Duration::from_millis(every_ms));
                }
            }))
        }
        _ => None,
    };
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
    if let Some(pauser) = pauser {
        pauser.join().expect("the pausing thread");
        // The last pause ends before the server's counters are read.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seconds = end.duration_since(start).as_secs_f64();
    calls += redis_calls(server) - if outage.is_some() { 0 } else { calls_at_start };
    Phase {
        name,
        disturbance,
        mode,
        seconds,
        stats,
        calls,
        errors: count(fleet, Event::Error) - errors,
        breakers_opened: count(fleet, Event::BreakerOpened) - opened,
        down,
    }
}
