//! A circuit breaker for one shard.
//!
//! Closed, it counts consecutive failures; at `trip_after` it opens and the
//! shard is skipped for `open_for` (paying a timeout on every request would
//! turn a Redis outage into a latency outage). Then it half-opens: exactly
//! one call goes through as a probe, and its result closes the breaker or
//! opens it again. A probe that never reports (its caller gave up) is
//! replaced by another after `open_for`.
//!
//! Every admitted call carries a [`Ticket`] naming the state it was admitted
//! in, and only answers to the current state count: a late reply to a call
//! sent before the breaker opened (or to a probe already replaced) changes
//! nothing, so it can neither skip the open period nor stand in for the probe.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::lock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until_ms: u64 },
    HalfOpen { probe_sent_ms: u64 },
}

/// What [`Breaker::admit`] hands a call, to report its outcome with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    /// The breaker's epoch when the call was admitted.
    epoch: u64,
}

#[derive(Debug)]
struct Inner {
    state: State,
    /// Moves on every change of state: a ticket of an older epoch is stale.
    epoch: u64,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    inner: Mutex<Inner>,
    /// Until when `admit` refuses every call (0 while closed), written with
    /// each change of state under the lock: a refusal reads it without one.
    refusing_until_ms: AtomicU64,
    trip_after: u32,
    open_for_ms: u64,
}

impl Breaker {
    pub(crate) fn new(trip_after: u32, open_for_ms: u64) -> Breaker {
        Breaker {
            inner: Mutex::new(Inner { state: State::Closed { failures: 0 }, epoch: 0 }),
            refusing_until_ms: AtomicU64::new(0),
            trip_after,
            open_for_ms,
        }
    }

    /// Moves to `state`, a new epoch.
    fn set(&self, b: &mut Inner, state: State) {
        b.state = state;
        b.epoch += 1;
        let until = match state {
            State::Closed { .. } => 0,
            State::Open { until_ms } => until_ms,
            State::HalfOpen { probe_sent_ms } => probe_sent_ms.saturating_add(self.open_for_ms),
        };
        self.refusing_until_ms.store(until, Ordering::Release);
    }

    /// Whether `admit` refuses every call at `now_ms` (open, or a probe on
    /// its way), without taking the lock.
    pub(crate) fn refuses(&self, now_ms: u64) -> bool {
        now_ms < self.refusing_until_ms.load(Ordering::Acquire)
    }

    /// Whether a call may go to the shard at `now_ms`: a ticket to report
    /// its outcome with, or `None`.
    pub(crate) fn admit(&self, now_ms: u64) -> Option<Ticket> {
        if self.refuses(now_ms) {
            return None;
        }
        let mut b = lock(&self.inner);
        match b.state {
            State::Closed { .. } => {}
            State::Open { until_ms } if now_ms < until_ms => return None,
            State::HalfOpen { probe_sent_ms } if now_ms < probe_sent_ms.saturating_add(self.open_for_ms) => {
                return None
            }
            // The probe: the only call of its epoch.
            State::Open { .. } | State::HalfOpen { .. } => self.set(&mut b, State::HalfOpen { probe_sent_ms: now_ms }),
        }
        Some(Ticket { epoch: b.epoch })
    }

    /// The shard answered the call admitted with `ticket`.
    pub(crate) fn success(&self, ticket: Ticket) {
        let mut b = lock(&self.inner);
        if ticket.epoch != b.epoch {
            return;
        }
        match b.state {
            // Consecutive failures only: keep the epoch, calls in flight stay current.
            State::Closed { .. } => b.state = State::Closed { failures: 0 },
            State::HalfOpen { .. } => self.set(&mut b, State::Closed { failures: 0 }),
            // Opening moves the epoch: no ticket of this one exists.
            State::Open { .. } => {}
        }
    }

    /// The shard failed the call admitted with `ticket`; true when this
    /// failure opened the breaker.
    pub(crate) fn failure(&self, ticket: Ticket, now_ms: u64) -> bool {
        let mut b = lock(&self.inner);
        if ticket.epoch != b.epoch {
            return false;
        }
        let open = State::Open { until_ms: now_ms.saturating_add(self.open_for_ms) };
        match b.state {
            State::Closed { failures } if failures + 1 < self.trip_after => {
                b.state = State::Closed { failures: failures + 1 };
                false
            }
            State::Closed { .. } | State::HalfOpen { .. } => {
                self.set(&mut b, open);
                true
            }
            State::Open { .. } => false,
        }
    }

    /// Whether calls are being skipped at `now_ms`.
    pub(crate) fn is_open(&self, now_ms: u64) -> bool {
        match lock(&self.inner).state {
            State::Closed { .. } => false,
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
        let b = Breaker::new(3, 2000);
        assert!(!fail(&b, 0) && !fail(&b, 1));
        b.success(b.admit(1).unwrap()); // a success in between resets the count
        assert!(!fail(&b, 2) && !fail(&b, 3));
        let late = b.admit(3).unwrap();
        assert!(fail(&b, 4), "the third in a row opens it");
        assert!(b.admit(5).is_none() && b.is_open(5));
        assert!(!b.failure(late, 6), "late failures of calls already sent change nothing");
        assert!(b.admit(2003).is_none());
    }

    #[test]
    fn half_opens_with_a_single_probe() {
        let b = Breaker::new(1, 2000);
        assert!(fail(&b, 0));
        let probe = b.admit(2000).expect("the probe");
        assert!(b.admit(2001).is_none() && b.admit(2500).is_none(), "one probe at a time");
        b.success(probe);
        assert!(b.admit(2501).is_some() && !b.is_open(2501));
    }

    #[test]
    fn a_failed_probe_opens_it_again() {
        let b = Breaker::new(5, 2000);
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
        let b = Breaker::new(1, 100);
        fail(&b, 0);
        let lost = b.admit(100).unwrap();
        assert!(b.admit(199).is_none());
        let probe = b.admit(200).expect("the lost probe's slot is given to another call");
        b.success(lost);
        assert!(b.is_open(201), "the replaced probe's late answer does not count");
        b.success(probe);
        assert!(!b.is_open(202));
    }

    #[test]
    fn refuses_without_the_lock_exactly_when_admit_would() {
        let b = Breaker::new(1, 100);
        assert!(!b.refuses(0));
        fail(&b, 0);
        assert!(b.refuses(0) && b.refuses(99) && !b.refuses(100), "open until 100");
        let probe = b.admit(100).expect("the probe");
        assert!(b.refuses(100) && b.refuses(199) && !b.refuses(200), "a probe on its way until 200");
        b.success(probe);
        assert!(!b.refuses(101), "closed by the probe");
        for now in [0, 150, 250] {
            assert_eq!(b.refuses(now), b.admit(now).is_none());
        }
    }

    #[test]
    fn only_the_probe_closes_it() {
        let b = Breaker::new(2, 1000);
        // Two calls sent while closed; the breaker trips before they answer.
        let (slow_ok, slow_err) = (b.admit(0).unwrap(), b.admit(0).unwrap());
        assert!(!fail(&b, 1));
        assert!(fail(&b, 2), "open until 1002");
        // Their late answers skip neither the open period nor the probe.
        b.success(slow_ok);
        assert!(b.is_open(3) && b.admit(3).is_none(), "a call sent before the trip does not close it");
        let probe = b.admit(1002).expect("the probe");
        b.success(slow_ok);
        assert!(b.admit(1003).is_none(), "still one probe at a time");
        assert!(!b.failure(slow_err, 1003), "nor does a late failure reopen it");
        b.success(probe);
        assert!(!b.is_open(1004) && b.admit(1004).is_some(), "the probe's answer closes it");
    }
}
