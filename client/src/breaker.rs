//! A circuit breaker for one shard: the limiter keeps one per shard (and
//! one for its relay), and rl-relay's scale model runs the same one on its
//! virtual clock, every time an argument.
//!
//! Closed, it counts consecutive failures and the failure rate: at
//! `trip_after` failures in a row, or once at least `MIN_CALLS` calls of
//! the current `RATE_WINDOW_MS` have reported and `failure_rate` of them
//! failed, it opens and the shard is skipped for `open_for` (paying a
//! timeout on every request would turn a Redis outage into a latency
//! outage; a Redis slow for a fraction of calls has a fraction of them time
//! out, never five in a row). Then it half-opens: exactly one call goes
//! through as a probe, and its result closes the breaker or opens it again.
//! A probe that never reports (its caller gave up) is replaced by another
//! after `open_for`.
//!
//! Every admitted call carries a [`Ticket`] naming the state it was admitted
//! in, and only answers to the current state count: a late reply to a call
//! sent before the breaker opened (or to a probe already replaced) changes
//! nothing, so it can neither skip the open period nor stand in for the probe.
//!
//! The closed path takes no lock: admitting and a success read and add to
//! atomics. Failures and changes of state take the lock.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::lock::lock;

/// The failure rate is counted over windows of this length.
pub(crate) const RATE_WINDOW_MS: u64 = 1000;
/// Fewer calls in a window than this never trip the breaker on the rate.
pub(crate) const MIN_CALLS: u64 = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed,
    Open { until_ms: u64 },
    HalfOpen { probe_sent_ms: u64 },
}

/// What [`Breaker::admit`] hands a call, to report its outcome with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The breaker's epoch when the call was admitted.
    epoch: u64,
}

/// An epoch's low bit: the breaker is closed.
const CLOSED: u64 = 1;

/// The limiter's circuit breaker for one shard (see the module's notes):
/// [`Breaker::admit`] before a call, [`Breaker::success`] or
/// [`Breaker::failure`] with its ticket after. Times are milliseconds on
/// any clock that only moves forward.
#[derive(Debug)]
pub struct Breaker {
    state: Mutex<State>,
    /// Moves by two on every change of state, under the lock; its low bit
    /// says closed, so one load tells a closed call its ticket.
    epoch: AtomicU64,
    /// Until when `admit` refuses every call (0 while closed), written with
    /// each change of state under the lock: a refusal reads it without one.
    refusing_until_ms: AtomicU64,
    /// Consecutive failures while closed.
    in_row: AtomicU32,
    /// The current rate window: its start, and its calls and failures
    /// (packed: failures in the high half).
    window_start_ms: AtomicU64,
    window_counts: AtomicU64,
    trip_after: u32,
    open_for_ms: u64,
    failure_rate: f64,
}

impl Breaker {
    /// Opens for `open_for_ms` at `trip_after` failures in a row, or once
    /// `failure_rate` of a 1 s window's calls failed (20 calls at least).
    pub fn new(trip_after: u32, open_for_ms: u64, failure_rate: f64) -> Breaker {
        Breaker {
            state: Mutex::new(State::Closed),
            epoch: AtomicU64::new(CLOSED),
            refusing_until_ms: AtomicU64::new(0),
            in_row: AtomicU32::new(0),
            window_start_ms: AtomicU64::new(0),
            window_counts: AtomicU64::new(0),
            trip_after,
            open_for_ms,
            failure_rate,
        }
    }

    /// Moves to `state`, a new epoch.
    fn set(&self, current: &mut State, state: State) {
        *current = state;
        let until = match state {
            State::Closed => 0,
            State::Open { until_ms } => until_ms,
            State::HalfOpen { probe_sent_ms } => probe_sent_ms.saturating_add(self.open_for_ms),
        };
        self.refusing_until_ms.store(until, Ordering::Release);
        let closed = if state == State::Closed { CLOSED } else { 0 };
        let next = ((self.epoch.load(Ordering::Acquire) | CLOSED) + 1) | closed;
        if closed == CLOSED {
            self.in_row.store(0, Ordering::Relaxed);
            self.window_counts.store(0, Ordering::Relaxed);
        }
        self.epoch.store(next, Ordering::Release);
    }

    /// Whether `admit` refuses every call at `now_ms` (open, or a probe on
    /// its way), without taking the lock.
    pub fn refuses(&self, now_ms: u64) -> bool {
        now_ms < self.refusing_until_ms.load(Ordering::Acquire)
    }

    /// Whether a call may go to the shard at `now_ms`: a ticket to report
    /// its outcome with, or `None`.
    pub fn admit(&self, now_ms: u64) -> Option<Ticket> {
        if self.refuses(now_ms) {
            return None;
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        if epoch & CLOSED == CLOSED {
            return Some(Ticket { epoch });
        }
        let mut state = lock(&self.state);
        match *state {
            State::Closed => {}
            State::Open { until_ms } if now_ms < until_ms => return None,
            State::HalfOpen { probe_sent_ms } if now_ms < probe_sent_ms.saturating_add(self.open_for_ms) => {
                return None
            }
            // The probe: the only call of its epoch.
            State::Open { .. } | State::HalfOpen { .. } => {
                self.set(&mut state, State::HalfOpen { probe_sent_ms: now_ms })
            }
        }
        Some(Ticket { epoch: self.epoch.load(Ordering::Acquire) })
    }

    /// Counts a call of a closed epoch in the rate window at `now_ms`; the
    /// window's (calls, failures) after it.
    fn count(&self, now_ms: u64, failed: bool) -> (u64, u64) {
        let start = self.window_start_ms.load(Ordering::Relaxed);
        if now_ms >= start.saturating_add(RATE_WINDOW_MS)
            && self.window_start_ms.compare_exchange(start, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            self.window_counts.store(0, Ordering::Relaxed);
        }
        let add = 1 + (u64::from(failed) << 32);
        let counts = self.window_counts.fetch_add(add, Ordering::Relaxed) + add;
        (counts & u64::from(u32::MAX), counts >> 32)
    }

    /// The shard answered the call admitted with `ticket` at `now_ms`.
    pub fn success(&self, ticket: Ticket, now_ms: u64) {
        if ticket.epoch != self.epoch.load(Ordering::Acquire) {
            return;
        }
        if ticket.epoch & CLOSED == CLOSED {
            // Keep the epoch: calls in flight stay current.
            self.in_row.store(0, Ordering::Relaxed);
            self.count(now_ms, false);
            return;
        }
        let mut state = lock(&self.state);
        if ticket.epoch == self.epoch.load(Ordering::Acquire) && matches!(*state, State::HalfOpen { .. }) {
            self.set(&mut state, State::Closed);
        }
    }

    /// The shard failed the call admitted with `ticket`; true when this
    /// failure opened the breaker.
    pub fn failure(&self, ticket: Ticket, now_ms: u64) -> bool {
        let mut state = lock(&self.state);
        if ticket.epoch != self.epoch.load(Ordering::Acquire) {
            return false;
        }
        let open = State::Open { until_ms: now_ms.saturating_add(self.open_for_ms) };
        match *state {
            State::Closed => {
                let in_row = self.in_row.fetch_add(1, Ordering::Relaxed) + 1;
                let (calls, failures) = self.count(now_ms, true);
                let rate_trips = calls >= MIN_CALLS && failures as f64 >= self.failure_rate * calls as f64;
                if in_row >= self.trip_after || rate_trips {
                    self.set(&mut state, open);
                    return true;
                }
                false
            }
            State::HalfOpen { .. } => {
                self.set(&mut state, open);
                true
            }
            // Opening moves the epoch: no ticket of this one exists.
            State::Open { .. } => false,
        }
    }

    /// Whether calls are being skipped at `now_ms`.
    pub fn is_open(&self, now_ms: u64) -> bool {
        match *lock(&self.state) {
            State::Closed => false,
            State::Open { until_ms } => now_ms < until_ms,
            State::HalfOpen { .. } => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Admits a call at `now` and fails it there.
    fn fail(b: &Breaker, now: u64) -> bool {
        let t = b.admit(now).expect("admitted");
        b.failure(t, now)
    }

    #[test]
    fn trips_after_consecutive_failures_only() {
        let b = Breaker::new(3, 2000, 1.0);
        assert!(!fail(&b, 0) && !fail(&b, 1));
        b.success(b.admit(1).unwrap(), 1); // a success in between resets the count
        assert!(!fail(&b, 2) && !fail(&b, 3));
        let late = b.admit(3).unwrap();
        assert!(fail(&b, 4), "the third in a row opens it");
        assert!(b.admit(5).is_none() && b.is_open(5));
        assert!(!b.failure(late, 6), "late failures of calls already sent change nothing");
        assert!(b.admit(2003).is_none());
    }

    #[test]
    fn half_opens_with_a_single_probe() {
        let b = Breaker::new(1, 2000, 1.0);
        assert!(fail(&b, 0));
        let probe = b.admit(2000).expect("the probe");
        assert!(b.admit(2001).is_none() && b.admit(2500).is_none(), "one probe at a time");
        b.success(probe, 0);
        assert!(b.admit(2501).is_some() && !b.is_open(2501));
    }

    #[test]
    fn a_failed_probe_opens_it_again() {
        let b = Breaker::new(5, 2000, 1.0);
        for t in 0..5 {
            fail(&b, t);
        }
        let probe = b.admit(2004).unwrap();
        assert!(b.failure(probe, 2005));
        assert!(b.admit(4004).is_none());
        assert!(b.admit(4005).is_some());
    }

    #[test]
    fn a_probe_that_never_reports_is_replaced() {
        let b = Breaker::new(1, 100, 1.0);
        fail(&b, 0);
        let lost = b.admit(100).unwrap();
        assert!(b.admit(199).is_none());
        let probe = b.admit(200).expect("the lost probe's slot is given to another call");
        b.success(lost, 0);
        assert!(b.is_open(201), "the replaced probe's late answer does not count");
        b.success(probe, 0);
        assert!(!b.is_open(202));
    }

    #[test]
    fn refuses_without_the_lock_exactly_when_admit_would() {
        let b = Breaker::new(1, 100, 1.0);
        assert!(!b.refuses(0));
        fail(&b, 0);
        assert!(b.refuses(0) && b.refuses(99) && !b.refuses(100), "open until 100");
        let probe = b.admit(100).expect("the probe");
        assert!(b.refuses(100) && b.refuses(199) && !b.refuses(200), "a probe on its way until 200");
        b.success(probe, 0);
        assert!(!b.refuses(101), "closed by the probe");
        for now in [0, 150, 250] {
            assert_eq!(b.refuses(now), b.admit(now).is_none());
        }
    }

    #[test]
    fn trips_on_the_failure_rate_without_failures_in_a_row() {
        // One call in three fails, never two in a row: consecutive failures
        // would never trip it; a rate of a third does, once MIN_CALLS report.
        let b = Breaker::new(5, 2000, 0.3);
        let mut opened_at = None;
        for call in 0..MIN_CALLS {
            let t = b.admit(call).expect("closed");
            if call % 3 == 2 {
                if b.failure(t, call) {
                    opened_at = Some(call);
                    break;
                }
            } else {
                b.success(t, call);
            }
        }
        assert_eq!(opened_at, None, "fewer than MIN_CALLS calls never trip it");
        let t = b.admit(100).unwrap();
        b.success(t, 100);
        let t = b.admit(101).unwrap();
        assert!(b.failure(t, 101), "22 calls, 7 failed: a third");
        assert!(b.admit(102).is_none());
    }

    #[test]
    fn the_rate_is_counted_per_window() {
        let b = Breaker::new(100, 2000, 0.5);
        // A window of successes, then one of one failure in ten: no trip.
        for now in 0..50 {
            b.success(b.admit(now).unwrap(), now);
        }
        for now in RATE_WINDOW_MS..RATE_WINDOW_MS + 30 {
            let t = b.admit(now).unwrap();
            if now % 10 == 0 {
                assert!(!b.failure(t, now));
            } else {
                b.success(t, now);
            }
        }
        // The next window: half fail.
        let mut opened = false;
        for now in 2 * RATE_WINDOW_MS..2 * RATE_WINDOW_MS + 40 {
            let Some(t) = b.admit(now) else { break };
            if now % 2 == 0 {
                opened |= b.failure(t, now);
            } else {
                b.success(t, now);
            }
        }
        assert!(opened);
    }

    #[test]
    fn the_closed_path_is_shared_by_threads() {
        // Many threads admit and succeed at once: all admitted, and one
        // failure rate trip opens it for everyone.
        let b = std::sync::Arc::new(Breaker::new(1000, 10_000, 0.5));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let b = b.clone();
                s.spawn(move || {
                    for now in 0..10_000 {
                        let t = b.admit(now % 500).expect("closed");
                        b.success(t, now % 500);
                    }
                });
            }
        });
        for now in 1000..1100 {
            if let Some(t) = b.admit(now) {
                b.failure(t, now);
            }
        }
        assert!(b.is_open(1100) && b.admit(1100).is_none());
    }

    #[test]
    fn only_the_probe_closes_it() {
        let b = Breaker::new(2, 1000, 1.0);
        // Two calls sent while closed; the breaker trips before they answer.
        let (slow_ok, slow_err) = (b.admit(0).unwrap(), b.admit(0).unwrap());
        assert!(!fail(&b, 1));
        assert!(fail(&b, 2), "open until 1002");
        // Their late answers skip neither the open period nor the probe.
        b.success(slow_ok, 0);
        assert!(b.is_open(3) && b.admit(3).is_none(), "a call sent before the trip does not close it");
        let probe = b.admit(1002).expect("the probe");
        b.success(slow_ok, 0);
        assert!(b.admit(1003).is_none(), "still one probe at a time");
        assert!(!b.failure(slow_err, 1003), "nor does a late failure reopen it");
        b.success(probe, 0);
        assert!(!b.is_open(1004) && b.admit(1004).is_some(), "the probe's answer closes it");
    }
}
