//! Full-jitter exponential backoff for callers that retry.
//!
//! Retry `n` (from 0) waits a uniformly random time in `[0, min(cap, base x
//! 2^n)]`: clients refused together do not come back together. After a
//! refusal that named a retry time, wait that long first.
//!
//! ```
//! use std::time::Duration;
//! use rl_gateway::http::Backoff;
//!
//! let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
//! for attempt in 0..5 {
//!     let wait = backoff.delay(attempt);
//!     assert!(wait <= Duration::from_millis(100) * 2u32.pow(attempt));
//! }
//! ```

use std::time::Duration;

use crate::Decision;

/// Full-jitter exponential backoff: see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
}

impl Backoff {
    /// Retries start around `base` and never wait longer than `cap`.
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff { base, cap: cap.max(base) }
    }

    /// The wait before retry number `attempt` (0 for the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.base.saturating_mul(2u32.saturating_pow(attempt.min(31))).min(self.cap);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(fastrand::u64(0..=nanos))
    }

    /// The wait before retrying a refused `decision`: its retry time plus a
    /// jittered delay, or `None` when retrying cannot succeed (the cost
    /// exceeds a capacity). An allowed decision needs no wait.
    pub fn delay_after(&self, attempt: u32, decision: &Decision) -> Option<Duration> {
        if decision.allowed {
            return Some(Duration::ZERO);
        }
        decision.retry_after.map(|r| r.saturating_add(self.delay(attempt)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Source;

    #[test]
    fn delays_stay_under_a_doubling_ceiling_and_the_cap() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
        for attempt in 0..40 {
            let ceiling =
                (Duration::from_millis(10) * 2u32.saturating_pow(attempt.min(20))).min(Duration::from_millis(500));
            for _ in 0..50 {
                assert!(b.delay(attempt) <= ceiling);
            }
        }
    }

    #[test]
    fn delays_are_spread_over_the_whole_range() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let waits: Vec<Duration> = (0..1000).map(|_| b.delay(3)).collect();
        let low = waits.iter().filter(|w| **w < Duration::from_millis(200)).count();
        let high = waits.iter().filter(|w| **w > Duration::from_millis(600)).count();
        // Uniform on [0, 800 ms]: a quarter below 200 ms, a quarter above 600.
        assert!((150..350).contains(&low) && (150..350).contains(&high), "{low} low, {high} high");
    }

    #[test]
    fn a_refusal_waits_its_retry_time_first() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(10));
        let refused = Decision {
            allowed: false,
            remaining: 0,
            retry_after: Some(Duration::from_secs(2)),
            reset_after: Duration::from_secs(2),
            limit: 1,
            rule: 0,
            source: Source::Redis,
            shadow_refused: None,
        };
        let wait = b.delay_after(0, &refused).unwrap();
        assert!(wait >= Duration::from_secs(2) && wait <= Duration::from_millis(2010));
        assert_eq!(b.delay_after(0, &Decision { retry_after: None, ..refused }), None);
        assert_eq!(b.delay_after(0, &Decision { allowed: true, ..refused }), Some(Duration::ZERO));
    }
}
