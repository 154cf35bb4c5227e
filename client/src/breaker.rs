//! A circuit breaker for one shard.
//!
//! Closed, it counts consecutive failures; at `trip_after` it opens and the
//! shard is skipped for `open_for` (paying a timeout on every request would
//! turn a Redis outage into a latency outage). Then it half-opens: exactly
//! one call goes through as a probe, and its result closes the breaker or
//! opens it again. A probe that never reports (its caller gave up) is
//! replaced by another after `open_for`.

use std::sync::Mutex;

use crate::lock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until_ms: u64 },
    HalfOpen { probe_sent_ms: u64 },
}

#[derive(Debug)]
pub(crate) struct Breaker {
    state: Mutex<State>,
    trip_after: u32,
    open_for_ms: u64,
}

impl Breaker {
    pub(crate) fn new(trip_after: u32, open_for_ms: u64) -> Breaker {
        Breaker { state: Mutex::new(State::Closed { failures: 0 }), trip_after, open_for_ms }
    }

    /// Whether a call may go to the shard at `now_ms`.
    pub(crate) fn admit(&self, now_ms: u64) -> bool {
        let mut state = lock(&self.state);
        match *state {
            State::Closed { .. } => true,
            State::Open { until_ms } if now_ms < until_ms => false,
            State::HalfOpen { probe_sent_ms } if now_ms < probe_sent_ms.saturating_add(self.open_for_ms) => false,
            State::Open { .. } | State::HalfOpen { .. } => {
                *state = State::HalfOpen { probe_sent_ms: now_ms };
                true
            }
        }
    }

    /// The shard answered.
    pub(crate) fn success(&self) {
        *lock(&self.state) = State::Closed { failures: 0 };
    }

    /// The shard failed a call; true when this failure opened the breaker.
    pub(crate) fn failure(&self, now_ms: u64) -> bool {
        let mut state = lock(&self.state);
        let open = State::Open { until_ms: now_ms.saturating_add(self.open_for_ms) };
        match *state {
            State::Closed { failures } if failures + 1 < self.trip_after => {
                *state = State::Closed { failures: failures + 1 };
                false
            }
            State::Closed { .. } | State::HalfOpen { .. } => {
                *state = open;
                true
            }
            // A call sent before the breaker opened: it is open already.
            State::Open { .. } => false,
        }
    }

    /// Whether calls are being skipped at `now_ms`.
    pub(crate) fn is_open(&self, now_ms: u64) -> bool {
        match *lock(&self.state) {
            State::Closed { .. } => false,
            State::Open { until_ms } => now_ms < until_ms,
            State::HalfOpen { .. } => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_after_consecutive_failures_only() {
        let b = Breaker::new(3, 2000);
        assert!(!b.failure(0) && !b.failure(1));
        b.success(); // a success in between resets the count
        assert!(!b.failure(2) && !b.failure(3));
        assert!(b.admit(3));
        assert!(b.failure(4), "the third in a row opens it");
        assert!(!b.admit(5) && b.is_open(5));
        assert!(!b.failure(6), "late failures of calls already sent change nothing");
        assert!(!b.admit(2003));
    }

    #[test]
    fn half_opens_with_a_single_probe() {
        let b = Breaker::new(1, 2000);
        assert!(b.failure(0));
        assert!(b.admit(2000), "the probe");
        assert!(!b.admit(2001) && !b.admit(2500), "one probe at a time");
        b.success();
        assert!(b.admit(2501) && !b.is_open(2501));
    }

    #[test]
    fn a_failed_probe_opens_it_again() {
        let b = Breaker::new(5, 2000);
        for t in 0..5 {
            b.failure(t);
        }
        assert!(b.admit(2004));
        assert!(b.failure(2005));
        assert!(!b.admit(4004));
        assert!(b.admit(4005));
    }

    #[test]
    fn a_probe_that_never_reports_is_replaced() {
        let b = Breaker::new(1, 100);
        b.failure(0);
        assert!(b.admit(100));
        assert!(!b.admit(199));
        assert!(b.admit(200), "the lost probe's slot is given to another call");
    }
}
