//! Counters shown by `INFO rl`.
//!
//! Commands run on the server's main thread; atomics with relaxed ordering
//! cost the same as plain adds there and keep the statics safe.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What one call ended as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    Allowed,
    Denied,
    /// A command that does not decide (the internal effect commands).
    Done,
}

pub struct CommandStats {
    pub name: &'static str,
    /// Whether its calls decide (allowed/denied); the internal effect
    /// commands only count calls and errors.
    decides: bool,
    calls: AtomicU64,
    allowed: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
}

impl CommandStats {
    pub const fn new(name: &'static str) -> Self {
        Self::counting(name, true)
    }

    const fn counting(name: &'static str, decides: bool) -> Self {
        Self {
            name,
            decides,
            calls: AtomicU64::new(0),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    pub fn record(&self, outcome: Result<Counted, ()>) {
        self.calls.fetch_add(1, Relaxed);
        match outcome {
            Ok(Counted::Allowed) => self.allowed.fetch_add(1, Relaxed),
            Ok(Counted::Denied) => self.denied.fetch_add(1, Relaxed),
            Ok(Counted::Done) => 0,
            Err(()) => self.errors.fetch_add(1, Relaxed),
        };
    }

    /// (field suffix, value) pairs for INFO: calls, allowed, denied,
    /// errors; calls and errors only for a command that does not decide.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
        let all = [
            ("calls", self.calls.load(Relaxed)),
            ("allowed", self.allowed.load(Relaxed)),
            ("denied", self.denied.load(Relaxed)),
            ("errors", self.errors.load(Relaxed)),
        ];
        let decides = self.decides;
        all.into_iter().filter(move |(what, _)| decides || matches!(*what, "calls" | "errors"))
    }
}

pub static TAKE: CommandStats = CommandStats::new("take");
pub static PEEK: CommandStats = CommandStats::new("peek");
pub static LEASE: CommandStats = CommandStats::new("lease");
pub static REFUND: CommandStats = CommandStats::new("refund");
pub static WINDOW: CommandStats = CommandStats::new("window");
pub static WINDOWPEEK: CommandStats = CommandStats::new("windowpeek");
pub static THROTTLE: CommandStats = CommandStats::new("throttle");
pub static ACQUIRE: CommandStats = CommandStats::new("acquire");
pub static RELEASE: CommandStats = CommandStats::counting("release", false);
pub static INFLIGHT: CommandStats = CommandStats::new("inflight");
pub static INSPECT: CommandStats = CommandStats::counting("inspect", false);
pub static SET: CommandStats = CommandStats::counting("set", false);
pub static LOGADD: CommandStats = CommandStats::counting("logadd", false);
pub static SLOT: CommandStats = CommandStats::counting("slot", false);

/// Every command's counters, in INFO order.
pub static ALL: [&CommandStats; 13] = [
    &TAKE,
    &PEEK,
    &LEASE,
    &REFUND,
    &WINDOW,
    &WINDOWPEEK,
    &THROTTLE,
    &ACQUIRE,
    &RELEASE,
    &INFLIGHT,
    &SET,
    &LOGADD,
    &SLOT,
];

/// A count of something other than calls.
pub struct Counter {
    pub name: &'static str,
    value: AtomicU64,
}

impl Counter {
    pub const fn new(name: &'static str) -> Self {
        Self { name, value: AtomicU64::new(0) }
    }

    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.value.load(Relaxed)
    }
}

/// RL.RELEASE of an id that held nothing (unknown, released, or expired).
pub static RELEASE_UNKNOWN: Counter = Counter::new("release_unknown");
/// In-flight slots dropped at their deadline, never released: the lost
/// releases (a holder that crashed or timed out) an operator alarms on.
pub static INFLIGHT_HEALED: Counter = Counter::new("inflight_healed");

/// The other counters, in INFO order.
pub static COUNTERS: [&Counter; 2] = [&RELEASE_UNKNOWN, &INFLIGHT_HEALED];
