//! Subjects Redis refused, refused again from memory for a while (the
//! arithmetic is rl-core's `deny::Denial`, which the relay and the scale
//! model keep too).
//!
//! Only refusals are cached, so the cache can never admit anything: its
//! error is under, never over (a request that would have passed because
//! someone refunded tokens meanwhile waits instead). A refusal for a cost
//! also refuses larger costs, never smaller ones, which still ask Redis.
//!
//! An entry is held until the retry time Redis named, at least `hold_ms`:
//! the limiter passes this gateway's share of the rule's refill of the
//! cost (`gateways x cost x period / refill`), so a subject refused
//! everywhere costs about one call per token of refill, not one per
//! gateway per retry time. Either is cut to `hold_max_ms`
//! (`LimiterConfig::deny_hold_max`): then Redis is asked again, so a subject whose
//! keys were cleared, or whose limit was raised, is never held out longer.
//! A refusal answered from memory names the module's retry time counted
//! down, never the hold: the share is this gateway's, and another may
//! admit the subject as soon as the module would.
//!
//! Memory is bounded in bytes, not entries: each entry weighs its fixed
//! size plus its subject's length, and the cache holds at most
//! `entries x ENTRY_BUDGET` bytes of them, the least useful evicted first
//! (quick_cache's CLOCK-Pro); an evicted subject just asks Redis again.

use std::time::Duration;

use quick_cache::sync::Cache;
use rl_client::internal::millis;
use rl_client::{Decision, Source};

use crate::subject::{Subject, SubjectKey};

/// rl-core's refusal arithmetic, with the refusal to answer from.
#[derive(Clone, Copy, Debug)]
struct Denial {
    held: rl_core::deny::Denial,
    /// When the module said the request could pass, and every bucket be full.
    retry_until_ms: u64,
    reset_until_ms: u64,
    refused: Decision,
}

/// What one entry costs besides its subject: the key's fixed part, the
/// denial, and quick_cache's slot for it.
pub(crate) const ENTRY_BYTES: u64 = 160;
/// The bytes each of `entries` may take on average: an entry with a subject
/// of 48 bytes; longer subjects make room for fewer entries.
pub(crate) const ENTRY_BUDGET: u64 = ENTRY_BYTES + 48;

#[derive(Clone)]
struct Bytes;

impl quick_cache::Weighter<SubjectKey, Denial> for Bytes {
    fn weight(&self, key: &SubjectKey, _: &Denial) -> u64 {
        ENTRY_BYTES + key.2.len() as u64
    }
}

pub(crate) struct DenyCache {
    map: Cache<SubjectKey, Denial, Bytes>,
    /// The longest an entry is held.
    hold_max_ms: u64,
}

impl DenyCache {
    pub(crate) fn new(entries: usize, hold_max_ms: u64) -> DenyCache {
        let bytes = (entries as u64).saturating_mul(ENTRY_BUDGET);
        DenyCache { map: Cache::with_weighter(entries, bytes, Bytes), hold_max_ms: hold_max_ms.max(1) }
    }

    /// The weight of every entry held, in bytes.
    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.map.weight()
    }

    /// The cached refusal of `key` for `cost` at `now_ms`, if any.
    pub(crate) fn check(&self, key: &impl Subject, cost: u64, now_ms: u64) -> Option<Decision> {
        let denial = self.map.get(key)?;
        if !denial.held.refuses(cost, now_ms) {
            return None;
        }
        // The module's times counted down; past its retry time, the next
        // instant (the hold is this gateway's, not the module's).
        let retry_ms = denial.retry_until_ms.saturating_sub(now_ms).max(1);
        Some(Decision {
            remaining: 0,
            retry_after: Some(Duration::from_millis(retry_ms)),
            reset_after: Duration::from_millis(denial.reset_until_ms.saturating_sub(now_ms).max(retry_ms)),
            source: Source::DenyCache,
            ..denial.refused
        })
    }

    /// Remembers a refusal that named a retry time, for that time or
    /// `hold_ms`, whichever is longer, but never past `hold_max_ms`.
    pub(crate) fn refused(&self, key: &impl Subject, cost: u64, refused: &Decision, now_ms: u64, hold_ms: u64) {
        let retry = refused.retry_after.filter(|_| !refused.allowed).map_or(0, millis);
        let most = self.hold_max_ms;
        let Some(held) = rl_core::deny::Denial::new(cost, retry.min(most), hold_ms.min(most), now_ms) else { return };
        let denial = Denial {
            held,
            retry_until_ms: now_ms.saturating_add(retry),
            reset_until_ms: now_ms.saturating_add(millis(refused.reset_after)),
            refused: *refused,
        };
        self.map.insert(key.owned(), denial);
    }

    /// Drops every refusal remembered for `subject`, in any group: how many.
    pub(crate) fn forget(&self, subject: &str) -> usize {
        crate::subject::forget_subject(&self.map, subject)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(retry_ms: Option<u64>) -> Decision {
        Decision {
            allowed: false,
            remaining: 1,
            retry_after: retry_ms.map(Duration::from_millis),
            reset_after: Duration::from_millis(900),
            limit: 5,
            rule: 2,
            source: Source::Redis,
            shadow_refused: None,
        }
    }

    fn key(s: &str) -> SubjectKey {
        (1, false, s.into())
    }

    const HOLD_MAX: u64 = 60_000;

    #[test]
    fn refuses_until_the_retry_time_then_asks_again() {
        let c = DenyCache::new(10, HOLD_MAX);
        c.refused(&key("a"), 1, &refusal(Some(120)), 1000, 0);
        let d = c.check(&key("a"), 1, 1050).unwrap();
        assert_eq!((d.allowed, d.remaining, d.rule, d.limit, d.source), (false, 0, 2, 5, Source::DenyCache));
        assert_eq!(d.retry_after, Some(Duration::from_millis(70)));
        assert_eq!(d.reset_after, Duration::from_millis(850));
        assert!(c.check(&key("a"), 1, 1120).is_none());
        assert!(c.check(&key("b"), 1, 1050).is_none());
    }

    #[test]
    fn a_refused_cost_refuses_larger_costs_only() {
        let c = DenyCache::new(10, HOLD_MAX);
        c.refused(&key("a"), 5, &refusal(Some(100)), 0, 0);
        assert!(c.check(&key("a"), 5, 10).is_some());
        assert!(c.check(&key("a"), 9, 10).is_some());
        assert!(c.check(&key("a"), 4, 10).is_none());
    }

    #[test]
    fn only_refusals_with_a_retry_time_are_kept() {
        let c = DenyCache::new(10, HOLD_MAX);
        c.refused(&key("never"), 1, &refusal(None), 0, 0);
        assert!(c.check(&key("never"), 1, 1).is_none());
        let allowed = Decision { allowed: true, ..refusal(Some(100)) };
        c.refused(&key("ok"), 1, &allowed, 0, 0);
        assert!(c.check(&key("ok"), 1, 1).is_none());
    }

    #[test]
    fn memory_is_bounded_under_churn() {
        let c = DenyCache::new(100, HOLD_MAX);
        for i in 0..10_000 {
            c.refused(&key(&i.to_string()), 1, &refusal(Some(60_000)), 0, 0);
        }
        // Short subjects: a few more entries than 100 fit the bytes.
        assert!(c.bytes() <= 100 * ENTRY_BUDGET, "{} bytes", c.bytes());
        assert!(c.map.len() <= (100 * ENTRY_BUDGET / ENTRY_BYTES) as usize, "{} entries", c.map.len());
    }

    #[test]
    fn long_subjects_are_bounded_in_bytes() {
        // 512-byte subjects (the longest a policy takes): fewer entries, the
        // same bytes as short ones.
        let c = DenyCache::new(1000, HOLD_MAX);
        for i in 0..10_000 {
            let subject = format!("{i:0>512}");
            c.refused(&key(&subject), 1, &refusal(Some(60_000)), 0, 0);
        }
        assert!(c.bytes() <= 1000 * ENTRY_BUDGET, "{} bytes", c.bytes());
        assert!(c.map.len() < 1000 * ENTRY_BUDGET as usize / 512, "{} entries", c.map.len());
        assert!(c.map.len() > 100, "still holds some: {}", c.map.len());
    }

    #[test]
    fn a_refusal_is_held_at_least_the_hold_naming_the_modules_retry_time() {
        let c = DenyCache::new(10, HOLD_MAX);
        c.refused(&key("a"), 1, &refusal(Some(100)), 0, 3000);
        assert_eq!(c.check(&key("a"), 1, 40).unwrap().retry_after, Some(Duration::from_millis(60)));
        let d = c.check(&key("a"), 1, 2999).expect("held past the retry time");
        assert_eq!(d.retry_after, Some(Duration::from_millis(1)), "the module's time has come: not the hold");
        assert!(c.check(&key("a"), 1, 3000).is_none());
    }

    #[test]
    fn no_refusal_is_held_past_the_longest_hold() {
        let c = DenyCache::new(10, 5000);
        // Redis said 8 hours, the fleet's share 100 days: asked again after 5 s.
        c.refused(&key("a"), 1, &refusal(Some(28_800_000)), 0, 8_640_000_000);
        let d = c.check(&key("a"), 1, 4999).unwrap();
        assert_eq!(d.retry_after, Some(Duration::from_millis(28_800_000 - 4999)), "the module's, counted down");
        assert!(d.reset_after >= d.retry_after.unwrap());
        assert!(c.check(&key("a"), 1, 5000).is_none());
    }
}
