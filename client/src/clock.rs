//! The clock an rl-gateway `Limiter` decides from memory by (leases,
//! deny cache, breakers, fallback: whole milliseconds on a monotonic count)
//! and rl-gateway's http headers read (wall time). Calls to Redis keep their
//! real timeouts, and Redis its own clock. A [`ManualClock`] moves only when
//! told: tests wait for expiry without sleeping, and a simulation hands
//! every `Limiter` of a fleet one virtual clock.
//!
//! ```
//! use std::time::Duration;
//! use rl_client::{Clock, Config, ManualClock};
//!
//! let clock = ManualClock::new();
//! let config = Config { clock: Clock::Manual(clock.clone()), ..Config::standalone("redis://127.0.0.1/") };
//! clock.advance(Duration::from_secs(2)); // every limiter made from `config` sees 2 s pass
//! assert_eq!(config.clock.now_ms(), 2000);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// Where a limiter reads the time. An enum rather than a trait object: the
/// system clock, read on every check, costs no indirect call.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The machine's monotonic clock (and its wall clock for headers).
    #[default]
    System,
    /// Moves only when told: shared by every limiter it is handed to.
    Manual(Arc<ManualClock>),
}

impl Clock {
    /// Milliseconds on a monotonic count: the system clock's since the
    /// process first read it, a manual clock's since it was made.
    pub fn now_ms(&self) -> u64 {
        match self {
            Clock::System => {
                static EPOCH: OnceLock<Instant> = OnceLock::new();
                millis(EPOCH.get_or_init(Instant::now).elapsed())
            }
            Clock::Manual(m) => m.now_ms(),
        }
    }

    /// The wall time (for the Unix times of headers).
    pub fn wall(&self) -> SystemTime {
        match self {
            Clock::System => SystemTime::now(),
            Clock::Manual(m) => m.wall_start + Duration::from_millis(m.now_ms()),
        }
    }
}

/// Two clocks are equal when they are the system clock, or the same manual one.
impl PartialEq for Clock {
    fn eq(&self, other: &Clock) -> bool {
        match (self, other) {
            (Clock::System, Clock::System) => true,
            (Clock::Manual(a), Clock::Manual(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// A clock that stands still until advanced; never goes back.
#[derive(Debug)]
pub struct ManualClock {
    ms: AtomicU64,
    /// The wall time at 0 ms.
    wall_start: SystemTime,
}

impl ManualClock {
    /// A clock at 0 ms, whose wall time starts at the system's now.
    pub fn new() -> Arc<ManualClock> {
        Arc::new(ManualClock { ms: AtomicU64::new(0), wall_start: SystemTime::now() })
    }

    /// Milliseconds since it was made, as far as it was advanced.
    pub fn now_ms(&self) -> u64 {
        self.ms.load(Ordering::Acquire)
    }

    /// Moves the clock `by` forward (whole milliseconds).
    pub fn advance(&self, by: Duration) {
        self.ms.fetch_add(millis(by), Ordering::AcqRel);
    }

    /// Moves the clock to `ms` unless it is already past it (a simulation's
    /// next event).
    pub fn advance_to(&self, ms: u64) {
        self.ms.fetch_max(ms, Ordering::AcqRel);
    }
}

/// Whole milliseconds of `d`, saturating (a `Duration` can hold more).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_forward_and_when_told() {
        let m = ManualClock::new();
        let c = Clock::Manual(m.clone());
        assert_eq!(c.now_ms(), 0);
        m.advance(Duration::from_millis(1500));
        m.advance_to(1000);
        assert_eq!(c.now_ms(), 1500, "never back");
        m.advance_to(2000);
        assert_eq!(c.wall().duration_since(m.wall_start).unwrap(), Duration::from_secs(2));
        assert!(c == Clock::Manual(m) && c != Clock::Manual(ManualClock::new()) && Clock::System == Clock::default());
    }
}
