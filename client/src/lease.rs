//! Tokens this gateway leased from Redis for a busy subject, spent from memory.
//!
//! A lease is taken with RL.LEASE before any of its tokens is spent, so the
//! fleet can never admit more than the buckets hold: the error is under,
//! never over. Tokens stranded on a gateway (it stops seeing the subject,
//! the entry is evicted, the process stops) are lost to the subject for a
//! moment; tokens unspent `ttl` after the lease's last refill are dropped,
//! so a lowered limit bites within `ttl`.
//!
//! Dropped, never handed back: the bucket refilled while they were held,
//! so a refund could lift it above what `capacity + refill x elapsed`
//! allows (leased at full, refilled to full meanwhile, drained by another
//! gateway, refunded, drained again: 150 admitted of a bucket of 100 within
//! a few milliseconds).
//!
//! Memory is bounded: at most `entries` subjects hold a lease (quick_cache,
//! CLOCK-Pro eviction).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quick_cache::sync::Cache;

use crate::decision::{Decision, Source};
use crate::SubjectKey;

/// One subject's lease.
#[derive(Debug, Default)]
pub(crate) struct Lease {
    tokens: u64,
    expires_ms: u64,
    /// A background refill is on its way: don't send another.
    refilling: bool,
    /// The buckets' standing at the last grant, for the headers.
    last: Option<Decision>,
}

/// What spending from a lease found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Spend {
    /// Paid from the lease; `refill` asks the caller to top it up in the
    /// background (it reached half of a batch).
    Hit { decision: Decision, refill: bool },
    /// Not enough tokens: `reserved` (fewer than the cost) were taken out
    /// for this request, which needs the rest from Redis.
    Short { reserved: u64 },
}

impl Lease {
    /// Drops the tokens of an expired lease.
    fn expire(&mut self, now_ms: u64) {
        if now_ms >= self.expires_ms {
            self.tokens = 0;
        }
    }

    /// Spends `cost` tokens at `now_ms` if the lease holds them (expired
    /// ones are dropped first).
    pub(crate) fn spend(&mut self, cost: u64, batch: u64, now_ms: u64) -> Spend {
        self.expire(now_ms);
        if self.tokens < cost {
            return Spend::Short { reserved: std::mem::take(&mut self.tokens) };
        }
        self.tokens -= cost;
        let refill = !self.refilling && 2 * self.tokens <= batch;
        self.refilling |= refill;
        let decision = self.estimate();
        Spend::Hit { decision, refill }
    }

    /// Adds granted tokens (dropping expired ones first: they are never
    /// revived).
    pub(crate) fn add(&mut self, tokens: u64, standing: &Decision, now_ms: u64, ttl_ms: u64) {
        self.expire(now_ms);
        self.tokens += tokens;
        self.expires_ms = now_ms.saturating_add(ttl_ms);
        self.last = Some(*standing);
    }

    /// Gives back tokens reserved by a request that did not get the rest,
    /// unless the lease expired meanwhile (then they are dropped).
    pub(crate) fn put_back(&mut self, tokens: u64, now_ms: u64) {
        if now_ms < self.expires_ms {
            self.tokens += tokens;
        }
    }

    pub(crate) fn refill_done(&mut self) {
        self.refilling = false;
    }

    /// The standing a request served from memory reports: the buckets'
    /// remaining at the last grant plus what this gateway still holds.
    pub(crate) fn estimate(&self) -> Decision {
        let last = self.last.unwrap_or(Decision {
            allowed: true,
            remaining: 0,
            retry_after: Some(Duration::ZERO),
            reset_after: Duration::ZERO,
            limit: 0,
            rule: 0,
            source: Source::Lease,
            shadow_refused: None,
        });
        Decision {
            allowed: true,
            remaining: last.remaining.saturating_add(self.tokens),
            retry_after: Some(Duration::ZERO),
            source: Source::Lease,
            shadow_refused: None,
            ..last
        }
    }
}

pub(crate) struct Leases {
    map: Cache<SubjectKey, Arc<Mutex<Lease>>>,
}

impl Leases {
    pub(crate) fn new(entries: usize) -> Leases {
        Leases { map: Cache::new(entries) }
    }

    /// The subject's lease, created empty if it has none.
    pub(crate) fn entry(&self, key: &SubjectKey) -> Arc<Mutex<Lease>> {
        match self.map.get_or_insert_with(key, || Ok::<_, std::convert::Infallible>(Arc::default())) {
            Ok(lease) => lease,
            Err(never) => match never {},
        }
    }
}

/// This gateway's share of `window_ms` of the slowest rule's rate: the
/// tokens one RL.LEASE asks for. 1 means a quiet subject, checked call by
/// call. Never more than the smallest capacity.
pub(crate) fn batch(rules: &[rl_core::BucketParams], window_ms: u64, gateways: u32) -> u64 {
    let share = |p: &rl_core::BucketParams| {
        let per_window = p.refill() as u128 * window_ms as u128 / (p.period_ms() as u128 * gateways.max(1) as u128);
        per_window.min(p.capacity() as u128) as u64
    };
    rules.iter().map(share).min().unwrap_or(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rl_core::BucketParams;

    fn standing(remaining: u64) -> Decision {
        Decision {
            allowed: true,
            remaining,
            retry_after: Some(Duration::ZERO),
            reset_after: Duration::from_millis(40),
            limit: 1000,
            rule: 1,
            source: Source::Redis,
            shadow_refused: None,
        }
    }

    #[test]
    fn spends_from_memory_and_refills_at_half_empty_once() {
        let mut l = Lease::default();
        l.add(9, &standing(500), 0, 1000);
        let hits: Vec<bool> = (0..5)
            .map(|_| match l.spend(1, 10, 0) {
                Spend::Hit { refill, .. } => refill,
                short => panic!("{short:?}"),
            })
            .collect();
        // 8, 7, 6 left: no refill; 5 is half of 10: refill once, not again.
        assert_eq!(hits, [false, false, false, true, false]);
        l.refill_done();
        let Spend::Hit { decision, refill } = l.spend(1, 10, 0) else { panic!() };
        assert!(refill, "a finished refill lets the next one go");
        assert_eq!((decision.remaining, decision.limit, decision.rule, decision.source), (503, 1000, 1, Source::Lease));
    }

    #[test]
    fn a_short_lease_reserves_what_it_has() {
        let mut l = Lease::default();
        l.add(2, &standing(0), 0, 1000);
        assert_eq!(l.spend(3, 10, 0), Spend::Short { reserved: 2 });
        assert_eq!(l.spend(1, 10, 0), Spend::Short { reserved: 0 });
        l.put_back(2, 500);
        assert!(matches!(l.spend(2, 10, 500), Spend::Hit { .. }));
    }

    #[test]
    fn expired_tokens_are_dropped_never_revived() {
        let mut l = Lease::default();
        l.add(5, &standing(0), 0, 1000);
        assert!(matches!(l.spend(1, 10, 999), Spend::Hit { .. }));
        assert_eq!(l.spend(1, 10, 1000), Spend::Short { reserved: 0 }, "the 4 left expired");
        // Tokens reserved before expiry and put back after it are dropped too.
        l.add(3, &standing(0), 2000, 1000);
        assert_eq!(l.spend(4, 10, 2000), Spend::Short { reserved: 3 });
        l.put_back(3, 3000);
        assert_eq!(l.spend(1, 10, 3000), Spend::Short { reserved: 0 });
        // A refill after expiry does not revive what was left.
        l.add(4, &standing(0), 4000, 1000);
        l.add(2, &standing(0), 5000, 1000);
        assert_eq!(l.spend(3, 10, 5000), Spend::Short { reserved: 2 });
    }

    #[test]
    fn batch_is_a_share_of_100_ms_of_the_slowest_rule() {
        let p = |c, r, ms| BucketParams::new(c, r, ms).unwrap();
        // 100,000/s on 10 gateways: 1,000 per 100 ms.
        assert_eq!(batch(&[p(200_000, 100_000, 1000)], 100, 10), 1000);
        // The slowest rule sets it; never above the smallest capacity.
        assert_eq!(batch(&[p(200_000, 100_000, 1000), p(300, 6000, 1000)], 100, 1), 300);
        // 100/s on 300 gateways: a quiet key, batch 1.
        assert_eq!(batch(&[p(100, 100, 1000)], 100, 300), 1);
        assert_eq!(batch(&[p(5, 5, 60_000)], 100, 1), 1);
    }
}
