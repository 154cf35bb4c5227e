//! Local token buckets that decide while Redis cannot answer.
//!
//! Behind a round-robin balancer each of `gateways` gateways sees about
//! 1/gateways of a subject's traffic, so each enforces that share of every
//! rule, times `slack` because traffic is never spread perfectly evenly.
//! Fleet-wide a subject then gets about `slack` times its limit (2x by
//! default): approximate, bounded, and only while the shard is down. The
//! buckets are rl-core's, integer-exact on a local monotonic clock; a
//! subject's rules stay all-or-nothing.
//!
//! Memory is bounded: at most `entries` subjects (quick_cache, CLOCK-Pro
//! eviction). An evicted subject starts again with full buckets: under heavy
//! churn during an outage a subject may get one more local burst.

use std::sync::{Arc, Mutex};

use quick_cache::sync::Cache;
use rl_core::limits::{MAX_PERIOD_MS, MAX_TOKENS};
use rl_core::{acquire, BucketParams, BucketState, Update};

use crate::{lock, SubjectKey};

pub(crate) struct Fallback {
    map: Cache<SubjectKey, Arc<Mutex<Vec<Option<BucketState>>>>>,
}

impl Fallback {
    pub(crate) fn new(entries: usize) -> Fallback {
        Fallback { map: Cache::new(entries) }
    }

    /// Takes `cost` from the subject's local buckets (already scaled with
    /// [`share`]), all or none.
    pub(crate) fn take(&self, key: &SubjectKey, params: &[BucketParams], cost: u64, now_ms: u64) -> rl_core::Decision {
        let fresh = || Ok::<_, std::convert::Infallible>(Arc::new(Mutex::new(vec![None; params.len()])));
        let entry = match self.map.get_or_insert_with(key, fresh) {
            Ok(entry) => entry,
            Err(never) => match never {},
        };
        let mut states = lock(&entry);
        states.resize(params.len(), None);
        let out = acquire(params, &states, cost, cost, now_ms);
        for (state, update) in states.iter_mut().zip(&out.updates) {
            *state = match update {
                Update::Store { state, .. } => Some(*state),
                Update::Remove => None,
            };
        }
        out.decision
    }
}

/// A rule's bucket scaled to `slack / gateways` of its capacity and rate.
/// The rate `refill / period` is rescaled as `refill x k / (period x k /
/// share)` with k up to 1000, so rounding the new period costs at most
/// 0.05% of the rate (a period that would pass two years is capped there).
pub(crate) fn share(rule: &BucketParams, slack: f64, gateways: u32) -> BucketParams {
    let share = slack / f64::from(gateways.max(1));
    let capacity = (rule.capacity() as f64 * share).round().clamp(1.0, MAX_TOKENS as f64) as u64;
    let room_in_period = (MAX_PERIOD_MS as f64 * share / rule.period_ms() as f64) as u64;
    let k = (MAX_TOKENS / rule.refill()).min(1000).min(room_in_period).max(1);
    let period = (rule.period_ms() as f64 * k as f64 / share).round().clamp(1.0, MAX_PERIOD_MS as f64) as u64;
    // Every value is clamped into range; the rule itself is a safe answer.
    BucketParams::new(capacity, rule.refill() * k, period).unwrap_or(*rule)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(c: u64, r: u64, ms: u64) -> BucketParams {
        BucketParams::new(c, r, ms).unwrap()
    }

    #[test]
    fn each_gateway_gets_its_share_times_slack() {
        // 100/s, bursts of 200, on 10 gateways with slack 2: 20 a second, bursts of 40.
        let s = share(&p(200, 100, 1000), 2.0, 10);
        assert_eq!((s.capacity(), s.refill(), s.period_ms()), (40, 100_000, 5_000_000));
        // One gateway with slack 2: twice the rule, even with a 1 ms period.
        let s = share(&p(10, 3, 1), 2.0, 1);
        assert_eq!((s.capacity(), s.refill(), s.period_ms()), (20, 3000, 500));
        // Never below one token of burst; a slow rate stays exact.
        let s = share(&p(5, 5, 60_000), 2.0, 300);
        assert_eq!((s.capacity(), s.refill(), s.period_ms()), (1, 5000, 9_000_000_000));
        // Near the limits the values are clamped, not wrapped.
        let s = share(&p(MAX_TOKENS, MAX_TOKENS, MAX_PERIOD_MS), 2.0, 1000);
        assert_eq!((s.refill(), s.period_ms()), (MAX_TOKENS, MAX_PERIOD_MS));
    }

    #[test]
    fn local_buckets_are_all_or_nothing_and_bounded() {
        let f = Fallback::new(10);
        let key: SubjectKey = (1, false, "u".into());
        let rules = [p(3, 1, 60_000), p(2, 1, 60_000)];
        assert!(f.take(&key, &rules, 1, 0).allowed());
        assert!(f.take(&key, &rules, 1, 0).allowed());
        let d = f.take(&key, &rules, 1, 0);
        assert_eq!((d.allowed(), d.binding), (false, 1));
        assert!(f.take(&key, &rules, 1, 60_000).allowed(), "refilled a minute later");
        for i in 0..1000 {
            f.take(&(1, false, i.to_string().into()), &rules, 1, 0);
        }
        assert!(f.map.len() <= 11);
    }
}
