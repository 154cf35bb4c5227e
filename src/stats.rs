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
pub static SET: CommandStats = CommandStats::counting("set", false);
pub static LOGADD: CommandStats = CommandStats::counting("logadd", false);

/// Every command's counters, in INFO order.
pub static ALL: [&CommandStats; 9] = [&TAKE, &PEEK, &LEASE, &REFUND, &WINDOW, &WINDOWPEEK, &THROTTLE, &SET, &LOGADD];
