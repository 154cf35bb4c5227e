//! One request's limits decided together, all or nothing: the request is
//! admitted when every enforced limit admits it, and then each took its
//! cost; when one refuses, the others give back what they took where
//! anything can be given back.
//!
//! 1. Memory first: a refusal remembered (the deny cache), a limit of 0 or
//!    a cost above the limit refuses the request before anything is sent;
//!    what the others took from memory goes back. Leased windows and
//!    buckets pay from memory.
//! 2. What memory cannot decide goes to Redis at once, the calls side by
//!    side (one round trip on one server): the windows of one mode and
//!    cost in one `RL.WINDOW` on one server (the module's all or nothing:
//!    a refused call counts nothing anywhere), one per descriptor in a
//!    cluster (each key its own slot); each bucket its own `RL.TAKE` or
//!    lease through the relay's pools.
//! 3. When one refuses, the others' counts go back: to the relay's pools
//!    (memory), to Redis with `RL.REFUND` (buckets) or `RL.WINDOW ...
//!    REFUND at` (a window counted in another call than the refusing one:
//!    `at` is the server's reading that call answered with, `TIME`, so the
//!    module gives back to the window that counted it, or nothing once it
//!    ended). Redis down: each limit follows its failure mode (the local
//!    fallback, or refused).
//!
//! A stall is not an outage: a decision goes to its failure mode only when
//! its own call failed, or its deadline passed (the front's), or the probe
//! found Redis gone (`Health::unreachable`: an error, or no answer within
//! the probe's own second). Every answer Redis gives is also a reading for
//! the fallback, which starts from it (`fallback.rs`). A decision answered
//! past its deadline is finished in the background and not undone: Redis
//! counts what the fallback admitted.
//!
//! Shadow limits are decided each on its own, beside, and never undone.
//!
//! Here: the steps and the calls side by side. Beside it: a leased
//! window's own calls (`window_lease.rs`), usage and negative hits
//! (`usage.rs`), giving back (`undo.rs`), the failure modes (`failure.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::future::join_all;
use rl_core::{BucketParams, Reply, WindowMode};

use super::config::FailureMode;
use super::fallback::{self, Fallback};
use super::slots;
use super::windows::{Plan as WindowPlan, Window, Windows};
use crate::logging::line;
use crate::pool::{Need, Plan};
use crate::relay::{Origin, Relay};

mod failure;
mod undo;
mod usage;
mod window_lease;

/// A limit of a request, ready to decide.
#[derive(Clone, Debug)]
pub struct Item {
    /// Its counter's Redis key.
    pub key: String,
    pub counter: Counter,
    /// 0: asks whether the limit has room, takes nothing.
    pub cost: u64,
    /// Usage reported after the fact (a descriptor's own `hits_addend`):
    /// counted in full whatever the limit answers, never given back.
    pub usage: bool,
    /// A negative hit (`is_negative_hits`): gives `cost` back.
    pub refund: bool,
    /// The slot's id of a `Counter::Slots` limit (the descriptor's last
    /// entry), else empty.
    pub slot: String,
    pub shadow: bool,
    pub failure: FailureMode,
}

#[derive(Clone, Copy, Debug)]
pub enum Counter {
    Window {
        mode: WindowMode,
        window: Window,
    },
    Bucket(BucketParams),
    /// `algorithm: concurrency`: at most `limit` in flight, a slot held at
    /// most `timeout_ms` (`slots.rs`).
    Slots {
        limit: u64,
        timeout_ms: u64,
    },
    /// `requests_per_unit: 0`: refuses everything, as in
    /// envoyproxy/ratelimit; `window_ms` is its unit.
    Closed {
        window_ms: u64,
    },
}

impl Counter {
    /// The most one request may cost, and the most a reply shows left.
    fn limit(&self) -> u64 {
        match self {
            Counter::Window { window, .. } => window.limit,
            Counter::Bucket(p) => p.capacity(),
            Counter::Slots { limit, .. } => *limit,
            Counter::Closed { .. } => 0,
        }
    }
}

/// Where an answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Redis,
    Memory,
    /// A refusal remembered.
    DenyCache,
    /// Refused by the limit itself: 0, or below the cost.
    Limit,
    /// Redis could not answer: the local fallback.
    Fallback,
    /// Redis could not answer and the limit fails closed.
    FailureDenied,
    /// Not asked: another limit refused the request first.
    NotAsked,
    /// A shadow limit Redis did not answer in time: nothing known.
    Unanswered,
}

/// A limit's answer.
#[derive(Clone, Copy, Debug)]
pub struct LimitAnswer {
    /// This limit refuses the request.
    pub over: bool,
    pub reply: Reply,
    pub source: Source,
}

/// What a limit took, to give back if the request is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Took {
    Nothing,
    /// Memory of a leased window.
    WindowMemory,
    /// A bucket's pool at the relay.
    Pool,
    /// A bucket in Redis: RL.REFUND.
    Redis,
    /// A slot in flight: RL.RELEASE.
    Slot,
    /// A window's count in Redis, by a call the server decided at `at_ms`
    /// (None: a reply without it; the count is kept).
    Counted {
        at_ms: Option<u64>,
    },
}

/// Counters of the decisions (the stats module reports them).
#[derive(Debug, Default)]
pub struct DecisionCounters {
    pub from_memory: AtomicU64,
    pub from_deny_cache: AtomicU64,
    pub redis_calls: AtomicU64,
    pub window_leases: AtomicU64,
    pub fallback: AtomicU64,
    pub failure_denied: AtomicU64,
    pub refunds: AtomicU64,
    pub window_refunds: AtomicU64,
    /// Refunds Redis did not take (the counts stand: under, never over).
    pub refund_errors: AtomicU64,
    pub given_back: AtomicU64,
    pub window_counts_kept: AtomicU64,
    /// Window counts Redis made that paid for what the fallback admitted
    /// (a lease's tokens fewer, or a request refused).
    pub fallback_repaid: AtomicU64,
}

pub struct Engine {
    pub relay: Arc<Relay>,
    windows: Mutex<Windows>,
    fallback: Mutex<Fallback>,
    /// Redis is a cluster: one key per call.
    cluster: bool,
    started: Instant,
    pub counters: DecisionCounters,
    /// Told whenever a window's lease call is answered (or failed): the
    /// requests waiting for it decide then.
    lease_done: tokio::sync::Notify,
    /// `--rls-stop-increment-when-overlimit`: usage on a limit already over
    /// counts nothing (envoyproxy/ratelimit's
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
    stop_increment: bool,
    /// Until when (`mono_ms`) RL.WINDOW goes without TIME, 0 while it takes
    /// it: a module older than the option refused it; windows are then
    /// counted without the server's reading, and not given back across
    /// calls. Tried again every [`TIME_RETRY_MS`] (the module upgraded).
    time_off_until: AtomicU64,
    /// The line saying a request was refused to pay for the fallback's.
    repaid_log: crate::logging::Throttled,
    /// Background Redis calls not yet answered (refunds, releases,
    /// leases): a SIGTERM's drain waits for them.
    pub background: AtomicU64,
}

/// How long window calls go without TIME after a module refused it.
const TIME_RETRY_MS: u64 = 60_000;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A refusal made here (not by Redis): nothing left, `retry_ms` to wait.
fn refused(limit: u64, retry_ms: i64, reset_ms: u64) -> Reply {
    Reply { granted: 0, remaining: 0, retry_after_ms: retry_ms, reset_after_ms: reset_ms, limit, binding: 0 }
}

/// What the fallback keeps for a counter (a closed one needs nothing).
fn fallback_kind(counter: Counter) -> Option<fallback::Kind> {
    match counter {
        Counter::Window { window, .. } => {
            Some(fallback::Kind::Window { limit: window.limit, window_ms: window.window_ms })
        }
        Counter::Bucket(p) => Some(fallback::Kind::Bucket(p)),
        Counter::Slots { .. } | Counter::Closed { .. } => None,
    }
}

/// Until the epoch-aligned window holding `now_ms` ends.
fn window_end_in(window_ms: u64, now_ms: u64) -> u64 {
    window_ms - now_ms % window_ms
}

/// The room a peek of `cost` saw: a peek answers what taking it would
/// leave, so a granted one left `cost` more.
fn room(peek: &Reply, cost: u64) -> u64 {
    if peek.granted > 0 {
        peek.remaining.saturating_add(cost)
    } else {
        peek.remaining
    }
}

/// Args of the module's window command (`name`: RL.WINDOW or RL.WINDOWPEEK).
fn window_args(name: &'static str, items: &[&Item], cost: u64, mode: WindowMode) -> Vec<Bytes> {
    let mut args = Vec::with_capacity(4 + items.len() * 3 + 3);
    args.push(Bytes::from_static(name.as_bytes()));
    args.push(items.len().to_string().into());
    for item in items {
        args.push(Bytes::copy_from_slice(item.key.as_bytes()));
    }
    for item in items {
        if let Counter::Window { window, .. } = item.counter {
            args.push(window.limit.to_string().into());
            args.push(window.window_ms.to_string().into());
        }
    }
    args.push(Bytes::from_static(b"COST"));
    args.push(cost.to_string().into());
    args.push(Bytes::from_static(mode.name().as_bytes()));
    args
}

fn bucket_args(name: &'static str, key: &str, p: &BucketParams, option: &'static str, n: u64) -> Vec<Bytes> {
    let mut args = vec![Bytes::from_static(name.as_bytes()), Bytes::from_static(b"1")];
    args.push(Bytes::copy_from_slice(key.as_bytes()));
    for n in [p.capacity(), p.refill(), p.period_ms()] {
        args.push(n.to_string().into());
    }
    args.push(Bytes::from_static(option.as_bytes()));
    args.push(n.to_string().into());
    args
}

/// A limit decided by a call of its own.
#[derive(Clone, Copy)]
enum Single {
    WithLease(u64),
    AfterLease,
    Slot,
}

/// What step 2 sends for a limit.
enum Step {
    Decided(LimitAnswer, Took),
    Window,
    Bucket(Plan),
    Peek,
    /// A leased window memory cannot pay, with the lease it claimed: one
    /// call counts both.
    WindowLease(u64),
    /// A leased window memory cannot pay while a lease call is on its way:
    /// decided once it is answered.
    AfterLease,
    /// Usage to count in Redis (what memory did not pay of it).
    Usage(u64),
    /// A negative hit to give back in Redis.
    Refund,
    /// A slot to take (or look at) in Redis.
    Slot,
}

/// An EXACT log's default ceiling (the module's `max-log-limit`): usage is
/// counted against it, as the log cannot hold more.
const DEFAULT_MAX_LOG_LIMIT: u64 = 10_000;

impl Engine {
    pub fn new(relay: Arc<Relay>, cluster: bool, stop_increment: bool) -> Engine {
        let settings = relay.pools().settings();
        Engine {
            windows: Mutex::new(Windows::new(settings)),
            fallback: Mutex::new(Fallback::new(settings.relays, settings.max_subjects)),
            relay,
            cluster,
            started: Instant::now(),
            counters: DecisionCounters::default(),
            lease_done: tokio::sync::Notify::new(),
            stop_increment,
            time_off_until: AtomicU64::new(0),
            repaid_log: crate::logging::Throttled::new(std::time::Duration::from_secs(10)),
            background: AtomicU64::new(0),
        }
    }

    /// Runs `call` in the background, counted in `background` until it ends.
    fn background(self: &Arc<Self>, call: impl std::future::Future<Output = ()> + Send + 'static) {
        /// Uncounts the call however it ends (done, or dropped).
        struct Done(Arc<Engine>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.background.fetch_sub(1, Relaxed);
            }
        }
        self.background.fetch_add(1, Relaxed);
        let done = Done(self.clone());
        tokio::spawn(async move {
            let _done = done;
            call.await;
        });
    }

    /// Whether a window call built now carries TIME (see `time_off_until`),
    /// and the state it was decided on (non-zero: a retry while off).
    fn window_time(&self) -> (bool, u64) {
        let off_until = self.time_off_until.load(Relaxed);
        (off_until == 0 || self.mono_ms() >= off_until, off_until)
    }

    /// Whether RL.WINDOW takes TIME as far as the relay knows: false since
    /// a module refused it, until a retry with it is answered.
    pub fn window_time_taken(&self) -> bool {
        self.time_off_until.load(Relaxed) == 0
    }

    /// `reply` to a call sent with TIME while the state was `seen`: a
    /// module's refusal of the option (it predates it; logged when TIME
    /// goes off), and calls go without it for [`TIME_RETRY_MS`]. Only a
    /// retry (`seen` non-zero) answered by a module turns it back on: calls
    /// already on their way when another node refused do not (mixed
    /// versions would flip it on every call).
    fn refuses_time(&self, reply: &crate::reply::Reply, seen: u64) -> bool {
        let refused = matches!(reply, crate::reply::Reply::Error(e) if e.contains("unknown option 'TIME'"));
        if !refused {
            let answered = reply.module_reply().is_some();
            if seen != 0 && answered && self.time_off_until.compare_exchange(seen, 0, Relaxed, Relaxed).is_ok() {
                line(format_args!("RL.WINDOW takes TIME again: refunds across calls are back"));
            }
            return false;
        }
        if self.time_off_until.swap(self.mono_ms() + TIME_RETRY_MS, Relaxed) == 0 {
            line(format_args!(
                "RL.WINDOW refuses TIME: the module predates it (upgrade it to this release's); windows are counted \
                 without the server's reading, so a refused request's windows counted in other calls are not given \
                 back (under, never over; rl_relay_rls_window_time 0); TIME is tried again every minute"
            ));
        }
        true
    }

    fn mono_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn windows(&self) -> MutexGuard<'_, Windows> {
        lock(&self.windows)
    }

    /// Each limit's answer, in `items`' order. `late` is set once the front
    /// answered without it (its deadline passed): then what Redis counted
    /// stands, for the failure modes' answers to be counted.
    pub async fn decide(self: &Arc<Self>, items: &[Item], late: &AtomicBool) -> Vec<LimitAnswer> {
        let now = now_ms();
        let mut steps = Vec::with_capacity(items.len());
        let mut leases = Vec::new();
        for item in items {
            steps.push(self.in_memory(item, now, &mut leases));
        }
        for (key, window, want) in leases {
            self.spawn_lease(key, window, want);
        }
        let refused_early =
            steps.iter().zip(items).any(|(s, i)| !i.shadow && matches!(s, Step::Decided(o, _) if o.over));
        let mut outcomes: Vec<Option<(LimitAnswer, Took)>> = Vec::with_capacity(items.len());
        let mut pending = Vec::new();
        for (i, (step, item)) in steps.into_iter().zip(items).enumerate() {
            match step {
                Step::Decided(outcome, took) => outcomes.push(Some((outcome, took))),
                step if refused_early && !item.shadow && !item.usage && !item.refund => {
                    if let Step::WindowLease(_) = step {
                        self.windows().lease_failed(&item.key);
                        self.lease_done.notify_waiters();
                    }
                    if let Step::Bucket(plan) = step {
                        if let Plan::Answer { reply, .. } = plan {
                            if reply.granted > 0 {
                                self.relay.give_back(&[Bytes::copy_from_slice(item.key.as_bytes())], item.cost);
                            }
                        }
                        self.relay.cancel(&[Bytes::copy_from_slice(item.key.as_bytes())], plan);
                    }
                    // Not asked: what memory knows of it, else its limit.
                    let known = match item.counter {
                        Counter::Window { window, .. } => self.windows().known(&item.key, window, now),
                        _ => None,
                    };
                    let reply = Reply {
                        granted: 0,
                        remaining: known.map_or(item.counter.limit(), |r| r.remaining),
                        retry_after_ms: 0,
                        reset_after_ms: known.map_or(0, |r| r.reset_after_ms),
                        limit: item.counter.limit(),
                        binding: 0,
                    };
                    outcomes.push(Some((LimitAnswer { over: false, reply, source: Source::NotAsked }, Took::Nothing)));
                }
                step => {
                    outcomes.push(None);
                    pending.push((i, step));
                }
            }
        }
        if !pending.is_empty() {
            let answered = self.ask_redis(items, pending).await;
            for (i, outcome, took) in answered {
                outcomes[i] = Some((outcome, took));
            }
        }
        let outcomes: Vec<(LimitAnswer, Took)> =
            outcomes.into_iter().map(|o| o.expect("every limit answered")).collect();
        let refused = outcomes.iter().zip(items).any(|((o, _), i)| o.over && !i.shadow);
        if refused && !late.load(Relaxed) {
            let mut counted = Vec::new();
            for ((_, took), item) in outcomes.iter().zip(items).filter(|(_, i)| !i.shadow) {
                match *took {
                    Took::Counted { at_ms: Some(at) } => counted.push((item, at)),
                    took => self.undo(item, took, now),
                }
            }
            self.refund_windows(&counted);
        }
        if late.load(Relaxed) {
            self.settle_late(items, &outcomes);
        }
        outcomes.into_iter().map(|(o, _)| o).collect()
    }

    /// A decision finished past its deadline (the fallback answered it):
    /// what it admitted nobody saw. Its own fallback admissions are not
    /// owed; tokens it took from memory (counted by Redis) pay what is.
    fn settle_late(&self, items: &[Item], outcomes: &[(LimitAnswer, Took)]) {
        let now = now_ms();
        let mut windows = self.windows();
        for ((o, took), item) in outcomes.iter().zip(items) {
            if item.shadow || o.over || !matches!(item.counter, Counter::Window { .. }) {
                continue;
            }
            match (o.source, took) {
                (Source::Fallback, _) => windows.forgive(&item.key, item.cost),
                (_, Took::WindowMemory) => {
                    let paid = windows.repay(&item.key, item.cost, now);
                    self.counters.fallback_repaid.fetch_add(paid, Relaxed);
                }
                _ => {}
            }
        }
    }

    /// A count of `item`'s window Redis granted: when it pays for what the
    /// fallback admitted, the request's refusal (the count stands).
    fn repaid(&self, windows: &mut Windows, item: &Item, reply: Reply, now: u64) -> Option<LimitAnswer> {
        let paid = windows.repay(&item.key, item.cost, now);
        if paid == 0 {
            return None;
        }
        self.counters.fallback_repaid.fetch_add(paid, Relaxed);
        self.repaid_log.log(|| {
            format!(
                "a request Redis granted refused: its count pays for what the local fallback admitted while Redis \
                 stalled (rl_relay_rls_fallback_repaid_total; key {})",
                item.key
            )
        });
        let reply = Reply { granted: 0, remaining: 0, retry_after_ms: 1000, ..reply };
        Some(LimitAnswer { over: true, reply, source: Source::Redis })
    }

    /// Step 1 for one limit.
    fn in_memory(&self, item: &Item, now: u64, leases: &mut Vec<(String, Window, u64)>) -> Step {
        let limit = item.counter.limit();
        if item.refund {
            return Step::Refund;
        }
        if let Counter::Closed { window_ms } = item.counter {
            let end = window_end_in(window_ms, now);
            return Step::Decided(
                LimitAnswer { over: true, reply: refused(0, end as i64, end), source: Source::Limit },
                Took::Nothing,
            );
        }
        if let Counter::Slots { .. } = item.counter {
            return Step::Slot;
        }
        if item.usage {
            return self.usage_in_memory(item, now);
        }
        if item.cost > item.counter.limit() {
            let reset = match item.counter {
                Counter::Window { window, .. } => window_end_in(window.window_ms, now),
                _ => 0,
            };
            return Step::Decided(
                LimitAnswer { over: true, reply: refused(limit, -1, reset), source: Source::Limit },
                Took::Nothing,
            );
        }
        if item.cost == 0 {
            return Step::Peek;
        }
        match item.counter {
            Counter::Window { window, .. } => {
                let plan = self.windows().plan(&item.key, window, item.cost, now);
                match plan {
                    WindowPlan::Exact { lease: Some(want) } if !item.shadow => return Step::WindowLease(want),
                    plan => {
                        if let Some(want) = plan.lease() {
                            leases.push((item.key.clone(), window, want));
                        }
                    }
                }
                match plan {
                    WindowPlan::Paid { reply, .. } => {
                        self.counters.from_memory.fetch_add(1, Relaxed);
                        Step::Decided(LimitAnswer { over: false, reply, source: Source::Memory }, Took::WindowMemory)
                    }
                    WindowPlan::Refused { reply } => {
                        self.counters.from_deny_cache.fetch_add(1, Relaxed);
                        Step::Decided(LimitAnswer { over: true, reply, source: Source::DenyCache }, Took::Nothing)
                    }
                    WindowPlan::Exact { .. } => Step::Window,
                    WindowPlan::Wait => Step::AfterLease,
                }
            }
            Counter::Bucket(params) => {
                let keys = [Bytes::copy_from_slice(item.key.as_bytes())];
                let need = Need { want: item.cost, min: item.cost };
                match self.relay.plan(&keys, &[params], need) {
                    Plan::Answer { reply, top_up: None } if reply.granted == 0 => {
                        self.counters.from_deny_cache.fetch_add(1, Relaxed);
                        Step::Decided(LimitAnswer { over: true, reply, source: Source::DenyCache }, Took::Nothing)
                    }
                    plan => Step::Bucket(plan),
                }
            }
            Counter::Slots { .. } | Counter::Closed { .. } => unreachable!("decided above"),
        }
    }

    /// Step 2: what memory could not decide, to Redis side by side.
    async fn ask_redis(
        self: &Arc<Self>,
        items: &[Item],
        pending: Vec<(usize, Step)>,
    ) -> Vec<(usize, LimitAnswer, Took)> {
        let mut out = Vec::with_capacity(pending.len());
        if self.relay.health.unreachable() {
            for (i, step) in pending {
                if let Step::Bucket(plan) = step {
                    self.relay.cancel(&[Bytes::copy_from_slice(items[i].key.as_bytes())], plan);
                }
                out.push((i, self.failed(&items[i]), Took::Nothing));
            }
            return out;
        }
        let mut windows = Vec::new();
        let mut buckets = Vec::new();
        let mut peeks = Vec::new();
        let mut usages = Vec::new();
        let mut refunds = Vec::new();
        let mut with_leases = Vec::new();
        let mut waits = Vec::new();
        let mut slots = Vec::new();
        for (i, step) in pending {
            let item = &items[i];
            match step {
                Step::Window => {
                    let Counter::Window { mode, .. } = item.counter else { continue };
                    // A shadow (or quota) limit goes alone: counted whatever the others say.
                    windows.push(((mode, item.cost, item.shadow.then_some(i)), i));
                }
                Step::Bucket(plan) => buckets.push((i, plan)),
                Step::Peek => peeks.push(i),
                Step::Usage(cost) => usages.push((i, cost)),
                Step::Refund => refunds.push(i),
                Step::WindowLease(want) => with_leases.push((i, want)),
                Step::AfterLease => waits.push(i),
                Step::Slot => slots.push(i),
                Step::Decided(..) => unreachable!("decided in memory"),
            }
        }
        // Windows grouped by (mode, cost), shadow ones alone.
        let groups = self.window_calls(windows, |&j| items[j].key.as_str());
        let sent = now_ms();
        let window_calls = groups.iter().map(|((mode, cost, _), members)| {
            let group: Vec<&Item> = members.iter().map(|&j| &items[j]).collect();
            let mut take = window_args("RL.WINDOW", &group, *cost, *mode);
            // The server's reading, to refund this call's counts by.
            let (time, seen) = self.window_time();
            if time {
                take.push(Bytes::from_static(b"TIME"));
            }
            // The call answers for its binding key only: each key's own
            // numbers come from a peek sent once it is answered (sent at
            // once, the connection may put a peek before the take).
            let peeks: Vec<Vec<Bytes>> = match group.len() {
                1 => Vec::new(),
                _ => group.iter().map(|item| window_args("RL.WINDOWPEEK", &[item], *cost, *mode)).collect(),
            };
            self.counters.redis_calls.fetch_add(1 + peeks.len() as u64, Relaxed);
            for item in &group {
                self.sending(item, *cost);
            }
            async move {
                let key = Some(group[0].key.as_bytes());
                let mut reply = self.relay.send(&take, key).await;
                if time && self.refuses_time(&reply, seen) {
                    // Refused before counting anything: sent again without.
                    self.counters.redis_calls.fetch_add(1, Relaxed);
                    reply = self.relay.send(&take[..take.len() - 1], key).await;
                }
                let peeks = join_all(peeks.iter().map(|args| self.relay.send(args, key))).await;
                (reply, peeks)
            }
        });
        let bucket_calls = buckets.into_iter().map(|(i, plan)| {
            let item = &items[i];
            let Counter::Bucket(params) = item.counter else { unreachable!("a bucket") };
            let keys = vec![Bytes::copy_from_slice(item.key.as_bytes())];
            let args = bucket_args("RL.TAKE", &item.key, &params, "COST", item.cost);
            let sent = match plan {
                Plan::Answer { .. } => 0,
                Plan::Lease { want, .. } => want,
                Plan::Forward => item.cost,
            };
            if sent > 0 {
                self.counters.redis_calls.fetch_add(1, Relaxed);
                self.sending(item, sent);
            }
            let need = Need { want: item.cost, min: item.cost };
            async move { (i, sent, self.relay.answer(plan, false, keys, vec![params], need, &args).await) }
        });
        let peek_calls = peeks.iter().map(|&i| {
            let item = &items[i];
            let args = match item.counter {
                Counter::Window { mode, .. } => window_args("RL.WINDOWPEEK", &[item], 1, mode),
                Counter::Bucket(p) => bucket_args("RL.PEEK", &item.key, &p, "COST", 1),
                Counter::Slots { .. } | Counter::Closed { .. } => unreachable!("decided in memory"),
            };
            self.counters.redis_calls.fetch_add(1, Relaxed);
            async move { self.relay.send(&args, Some(item.key.as_bytes())).await }
        });
        let usage_calls = usages.iter().map(|&(i, cost)| async move { (i, self.charge(&items[i], cost).await) });
        let refund_calls = refunds.iter().map(|&i| async move { (i, self.give_hits_back(&items[i]).await) });
        // Calls of one limit each, answered with what they took.
        let single = with_leases
            .iter()
            .map(|&(i, want)| (i, Single::WithLease(want)))
            .chain(waits.iter().map(|&i| (i, Single::AfterLease)))
            .chain(slots.iter().map(|&i| (i, Single::Slot)));
        let lease_calls = single.map(|(i, single)| async move {
            match single {
                Single::WithLease(want) => (i, self.with_lease(&items[i], want).await),
                Single::AfterLease => (i, self.after_lease(&items[i]).await),
                Single::Slot => (i, self.slot(&items[i]).await),
            }
        });
        let (window_replies, bucket_replies, peek_replies, (usage_answers, refund_answers, leased_answers)) =
            futures_util::future::join4(
                join_all(window_calls),
                join_all(bucket_calls),
                join_all(peek_calls),
                futures_util::future::join3(join_all(usage_calls), join_all(refund_calls), join_all(lease_calls)),
            )
            .await;
        for (i, answer) in usage_answers.into_iter().chain(refund_answers) {
            out.push((i, answer, Took::Nothing));
        }
        for (i, (answer, took)) in leased_answers {
            out.push((i, answer, took));
        }
        let done = now_ms();
        for (((mode, cost, _), members), (reply, peeks)) in groups.into_iter().zip(window_replies) {
            let Some(r) = reply.module_reply() else {
                self.relay.health.failed("RL.WINDOW", &format!("{reply:?}"));
                for i in members {
                    self.came_back(&items[i], cost, None);
                    out.push((i, self.failed(&items[i]), Took::Nothing));
                }
                continue;
            };
            let at_ms = reply.module_time();
            let mut readings = Vec::with_capacity(members.len());
            let mut windows = self.windows();
            for (n, &i) in members.iter().enumerate() {
                let Counter::Window { window, .. } = items[i].counter else { continue };
                let binding = n == r.binding;
                // The key's own numbers: its peek's (the call's if alone).
                let own = match peeks.get(n).and_then(|p| p.module_reply()) {
                    Some(peek) => Reply { remaining: room(&peek, cost), ..peek },
                    None => r,
                };
                let reset = match mode {
                    WindowMode::Fixed => window_end_in(window.window_ms, done),
                    _ => own.reset_after_ms,
                };
                readings.push((i, own.remaining, reset));
                let held = windows.held(&items[i].key, done);
                if r.granted > 0 {
                    let reply =
                        Reply { granted: 1, remaining: own.remaining, reset_after_ms: reset, limit: window.limit, ..r };
                    windows.answered(&items[i].key, cost, reply, sent, done);
                    if let Some(answer) = self.repaid(&mut windows, &items[i], reply, done) {
                        out.push((i, answer, Took::Nothing));
                        continue;
                    }
                    // Never above the truth: the lowest room Redis said
                    // (a lease landing first is counted in it), with what
                    // is held.
                    let room = windows.room(&items[i].key).map_or(reply.remaining, |r| r.min(reply.remaining));
                    let reply = Reply { remaining: (room + held).min(window.limit), ..reply };
                    out.push((i, LimitAnswer { over: false, reply, source: Source::Redis }, Took::Counted { at_ms }));
                } else if let Some(reply) =
                    (members.len() == 1).then(|| windows.pay(&items[i].key, cost, done)).flatten()
                {
                    // Refused because this relay's own lease took the last
                    // room meanwhile: paid from it (Redis counted it).
                    out.push((i, LimitAnswer { over: false, reply, source: Source::Memory }, Took::WindowMemory));
                } else {
                    // Refused: this key if it is the binding one, or if its
                    // own peek refuses too; the others were not charged.
                    let over = binding || own.granted == 0;
                    let reply = Reply { reset_after_ms: reset, limit: window.limit, ..own };
                    if over {
                        windows.answered(&items[i].key, cost, Reply { granted: 0, ..reply }, sent, done);
                    }
                    out.push((i, LimitAnswer { over, reply, source: Source::Redis }, Took::Nothing));
                }
            }
            drop(windows);
            for (i, room, reset) in readings {
                self.came_back(&items[i], cost, Some((room, reset)));
            }
        }
        for (i, sent, (reply, origin)) in bucket_replies {
            let answered = reply.module_reply().filter(|_| origin == Origin::Redis);
            self.came_back(&items[i], sent, answered.map(|r| (r.remaining, r.reset_after_ms)));
            match (reply.module_reply(), origin) {
                (Some(r), origin) if origin != Origin::Failed => {
                    let took = match (r.granted > 0, origin) {
                        (false, _) => Took::Nothing,
                        (true, Origin::Pool) => Took::Pool,
                        (true, _) => Took::Redis,
                    };
                    let source = if origin == Origin::Pool { Source::Memory } else { Source::Redis };
                    if origin == Origin::Pool {
                        self.counters.from_memory.fetch_add(1, Relaxed);
                    }
                    out.push((i, LimitAnswer { over: r.granted == 0, reply: r, source }, took));
                }
                _ => out.push((i, self.failed(&items[i]), Took::Nothing)),
            }
        }
        for (i, reply) in peeks.into_iter().zip(peek_replies) {
            match reply.module_reply() {
                // Asked with a cost of 0: the room as it is, over when none
                // is left (spent, or past the limit by usage), as the next
                // request would be refused.
                Some(r) => {
                    let room = room(&r, 1);
                    self.came_back(&items[i], 0, Some((room, r.reset_after_ms)));
                    let reply = Reply { granted: u64::from(room > 0), remaining: room, ..r };
                    out.push((i, LimitAnswer { over: room == 0, reply, source: Source::Redis }, Took::Nothing))
                }
                None => out.push((i, self.failed(&items[i]), Took::Nothing)),
            }
        }
        out
    }

    /// A slot taken (`RL.ACQUIRE ... ID slot COST cost`), or looked at
    /// (`RL.INFLIGHT`, a cost of 0: over when none is free).
    async fn slot(&self, item: &Item) -> (LimitAnswer, Took) {
        let Counter::Slots { limit, timeout_ms } = item.counter else { unreachable!("slots") };
        let args = slots::acquire_args(&item.key, limit, timeout_ms, &item.slot, item.cost);
        self.counters.redis_calls.fetch_add(1, Relaxed);
        let resp = self.relay.send(&args, Some(item.key.as_bytes())).await;
        let Some(r) = slots::reply(&resp) else {
            self.relay.health.failed("RL.ACQUIRE", &format!("{resp:?}"));
            return (self.failed(item), Took::Nothing);
        };
        let took = if r.granted > 0 && item.cost > 0 { Took::Slot } else { Took::Nothing };
        (LimitAnswer { over: r.granted == 0, reply: r, source: Source::Redis }, took)
    }

    /// Window limits gathered into calls: those of one `kind` (mode, cost
    /// and what else must match) share a call on one server, at most
    /// MAX_KEYS and no key twice (the module refuses that); each its own
    /// call in a cluster (each key its own slot).
    fn window_calls<'k, K: PartialEq, T>(
        &self,
        members: impl IntoIterator<Item = (K, T)>,
        key: impl Fn(&T) -> &'k str,
    ) -> Vec<(K, Vec<T>)> {
        let mut calls: Vec<(K, Vec<T>)> = Vec::new();
        for (kind, member) in members {
            let joins = |c: &&mut (K, Vec<T>)| {
                !self.cluster
                    && c.0 == kind
                    && c.1.len() < rl_core::limits::MAX_KEYS
                    && !c.1.iter().any(|other| key(other) == key(&member))
            };
            match calls.iter_mut().find(joins) {
                Some(call) => call.1.push(member),
                None => calls.push((kind, vec![member])),
            }
        }
        calls
    }
}
