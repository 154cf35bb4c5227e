//! How fast an in-flight limit's slots were seen to free: a refused
//! request is told to come back when one is likely free again, not when
//! the slots' timeout (set above the endpoint's p99.9) would drop them.

use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "tower")]
use std::sync::Arc;
use std::time::Duration;
#[cfg(feature = "tower")]
use std::time::Instant;

use crate::NoPermit;
#[cfg(feature = "tower")]
use crate::Permit;

#[cfg(feature = "tower")]
use crate::http::headers::InflightHeaders;

/// The mean time this gateway's requests held a slot of one in-flight
/// policy, a moving average (each new hold weighs 1/8).
#[derive(Debug, Default)]
pub struct ReleaseRate {
    /// Microseconds; 0 until a hold was seen.
    mean_us: AtomicU64,
}

impl ReleaseRate {
    /// A slot was held for `held` (from its acquire to its response's end).
    pub fn observe(&self, held: Duration) {
        let us = u64::try_from(held.as_micros()).unwrap_or(u64::MAX).max(1);
        // Concurrent updates may lose one another's weight: an estimate.
        let _ = self.mean_us.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| {
            Some(if mean == 0 { us } else { mean - mean / 8 + us / 8 })
        });
    }

    /// The mean hold seen so far; `None` before the first.
    pub fn mean(&self) -> Option<Duration> {
        match self.mean_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// When a refused request should come back: with `in_flight` slots held
    /// for about the mean each, one frees every mean / in_flight; never
    /// later than the refusal's own bound (the earliest deadline), and that
    /// bound alone before any hold was seen. `None` when the cost never fits.
    pub fn retry_after(&self, refused: &NoPermit) -> Option<Duration> {
        let deadline = refused.retry_after?;
        let Some(mean) = self.mean() else { return Some(deadline) };
        let held = u32::try_from(refused.in_flight.max(1)).unwrap_or(u32::MAX);
        Some((mean / held).min(deadline))
    }
}

/// Slots held for a response: once dropped (or released), each hold is
/// counted toward its policy's release rate and the slot given back (its
/// permit releases it in the background).
#[cfg(feature = "tower")]
#[derive(Default)]
pub(crate) struct Holding(Vec<(Permit, Arc<InflightHeaders>, Instant)>);

#[cfg(feature = "tower")]
impl Holding {
    /// `held`, held since `since`.
    pub(crate) fn new(held: Vec<(Permit, Arc<InflightHeaders>)>, since: Instant) -> Holding {
        Holding(held.into_iter().map(|(permit, headers)| (permit, headers, since)).collect())
    }

    pub(crate) fn permits(&self) -> impl Iterator<Item = &Permit> {
        self.0.iter().map(|(permit, _, _)| permit)
    }

    /// Counts each hold and gives its slots back.
    pub(crate) fn release(&mut self) {
        for (permit, headers, since) in self.0.drain(..) {
            headers.releases().observe(since.elapsed());
            drop(permit);
        }
    }
}

#[cfg(feature = "tower")]
impl Drop for Holding {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Source;

    fn refused(in_flight: u64, retry: Option<Duration>) -> NoPermit {
        NoPermit { rule: 0, in_flight, limit: in_flight, retry_after: retry, source: Source::Redis }
    }

    #[test]
    fn the_wait_follows_what_was_seen_and_never_passes_the_deadline() {
        let rate = ReleaseRate::default();
        let deadline = Some(Duration::from_secs(30));
        assert_eq!(rate.retry_after(&refused(20, deadline)), deadline, "nothing seen yet");
        rate.observe(Duration::from_secs(2));
        assert_eq!(rate.mean(), Some(Duration::from_secs(2)));
        assert_eq!(rate.retry_after(&refused(20, deadline)), Some(Duration::from_millis(100)));
        assert_eq!(rate.retry_after(&refused(1, Some(Duration::from_secs(1)))), Some(Duration::from_secs(1)));
        assert_eq!(rate.retry_after(&refused(20, None)), None, "a cost that never fits");
        for _ in 0..100 {
            rate.observe(Duration::from_millis(400));
        }
        let mean = rate.mean().unwrap();
        assert!(mean > Duration::from_millis(390) && mean < Duration::from_millis(410), "{mean:?}");
    }
}
