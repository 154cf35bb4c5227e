//! Local token buckets that decide while Redis cannot answer.
//!
//! Behind a round-robin balancer each of `gateways` gateways sees about
//! 1/gateways of a subject's traffic, so each enforces that share of every
//! rule, times `slack` because traffic is never spread perfectly evenly.
//! The buckets are rl-core's, integer-exact on a local monotonic clock; a
//! subject's rules stay all-or-nothing. The bounds, fleet-wide, while the
//! shard is down:
//!
//! - a token bucket admits at most `slack` x what the rule admits over the
//!   same time: `slack x (capacity + refill x elapsed / period)`;
//! - a window admits at most `slack` x its limit in any window: its
//!   stand-in holds half of that share and refills the other half over a
//!   window, so a full bucket plus one window of refill is the share (with
//!   the whole share as capacity and as refill, a window could see twice
//!   that).
//!
//! A share is rounded down to whole tokens of capacity. A rule whose share
//! is below one token (5 a minute on 300 gateways, slack 2: 0.03 each)
//! falls back closed: a floor of one token would let `gateways` requests
//! through at once fleet-wide (300 login attempts for a limit of 5), so it
//! refuses instead, and says so once in the log.
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
    /// Groups (and fleet sizes) already warned about a share below one token.
    warned: Cache<(u64, u32), ()>,
}

impl Fallback {
    pub(crate) fn new(entries: usize) -> Fallback {
        Fallback { map: Cache::new(entries), warned: Cache::new(1000) }
    }

    /// This gateway's stand-ins for the rules of `key`'s group, scaled with
    /// [`share`] (windows at half the slack); `Err(i)` when the share of
    /// rule `i` (an index into `rules`) is below one token: the group then
    /// refuses.
    pub(crate) fn local(
        &self,
        key: &SubjectKey,
        rules: &[BucketParams],
        window: bool,
        slack: f64,
        gateways: u32,
        policy: &str,
    ) -> Result<Vec<BucketParams>, usize> {
        let slack = if window { slack / 2.0 } else { slack };
        let mut local = Vec::with_capacity(rules.len());
        for (i, rule) in rules.iter().enumerate() {
            match share(rule, slack, gateways) {
                Some(p) => local.push(p),
                None => {
                    if self.warned.get(&(key.0, gateways)).is_none() {
                        self.warned.insert((key.0, gateways), ());
                        log::warn!(
                            "policy '{policy}': a fail-open rule of capacity {} has a fallback share below one token on \
                             {gateways} gateways ({} x {slack} / {gateways}): it refuses while Redis cannot answer",
                            rule.capacity(),
                            rule.capacity()
                        );
                    }
                    return Err(i);
                }
            }
        }
        Ok(local)
    }

    /// Takes `cost` from the subject's local buckets (already scaled with
    /// [`Fallback::local`]), all or none.
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

/// A rule's bucket scaled to `slack / gateways` of its capacity and rate;
/// `None` when that share of the capacity is below one whole token. The
/// capacity is rounded down. The rate `refill / period` is rescaled as
/// `refill x k / (period x k / share)` with k up to 1000, so rounding the
/// new period costs at most 0.05% of the rate (a period that would pass two
/// years is capped there).
pub(crate) fn share(rule: &BucketParams, slack: f64, gateways: u32) -> Option<BucketParams> {
    let gateways = f64::from(gateways.max(1));
    // Divided last: exact whenever the share is a whole number of tokens.
    let capacity = (rule.capacity() as f64 * slack / gateways).floor();
    if capacity < 1.0 {
        return None;
    }
    let share = slack / gateways;
    let room_in_period = (MAX_PERIOD_MS as f64 * share / rule.period_ms() as f64) as u64;
    let k = (MAX_TOKENS / rule.refill()).min(1000).min(room_in_period).max(1);
    let period = (rule.period_ms() as f64 * k as f64 / share).round().clamp(1.0, MAX_PERIOD_MS as f64) as u64;
    // Every value is clamped into range; the rule itself is a safe answer.
    Some(BucketParams::new(capacity.min(MAX_TOKENS as f64) as u64, rule.refill() * k, period).unwrap_or(*rule))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(c: u64, r: u64, ms: u64) -> BucketParams {
        BucketParams::new(c, r, ms).unwrap()
    }

    #[test]
    fn each_gateway_gets_its_share_times_slack() {
        let shared = |rule, slack, gateways| {
            let s = share(&rule, slack, gateways).unwrap();
            (s.capacity(), s.refill(), s.period_ms())
        };
        // 100/s, bursts of 200, on 10 gateways with slack 2: 20 a second, bursts of 40.
        assert_eq!(shared(p(200, 100, 1000), 2.0, 10), (40, 100_000, 5_000_000));
        // One gateway with slack 2: twice the rule, even with a 1 ms period.
        assert_eq!(shared(p(10, 3, 1), 2.0, 1), (20, 3000, 500));
        // The capacity is rounded down, never up: 10 x 2 / 3 is 6.67.
        assert_eq!(shared(p(10, 10, 1000), 2.0, 3).0, 6);
        // A slow rate stays exact.
        assert_eq!(shared(p(300, 5, 60_000), 2.0, 300), (2, 5000, 9_000_000_000));
        // Near the limits the values are clamped, not wrapped.
        let (_, refill, period) = shared(p(MAX_TOKENS, MAX_TOKENS, MAX_PERIOD_MS), 2.0, 1000);
        assert_eq!((refill, period), (MAX_TOKENS, MAX_PERIOD_MS));
    }

    #[test]
    fn a_share_below_one_token_is_none() {
        // 5 a minute on 300 gateways: 0.03 tokens each. No floor of one.
        assert_eq!(share(&p(5, 5, 60_000), 2.0, 300), None);
        assert_eq!(share(&p(149, 5, 60_000), 2.0, 300), None, "0.99 of a token");
        assert!(share(&p(150, 5, 60_000), 2.0, 300).is_some());
        // A group refuses when any of its rules is below one token.
        let f = Fallback::new(10);
        let key: SubjectKey = (7, false, "u".into());
        assert_eq!(f.local(&key, &[p(1000, 1000, 1000), p(5, 5, 60_000)], false, 2.0, 300, "api"), Err(1));
        // Windows take half the slack: a limit of 300 on 300 gateways is one each.
        assert_eq!(f.local(&key, &[p(300, 300, 60_000)], true, 2.0, 300, "api").map(|l| l[0].capacity()), Ok(1));
        assert_eq!(f.local(&key, &[p(299, 299, 60_000)], true, 2.0, 300, "api"), Err(0));
    }

    #[test]
    fn a_window_stand_in_admits_slack_times_the_limit_in_any_window() {
        // 100 in any minute, one gateway, slack 2: at most 200 in any minute.
        let f = Fallback::new(10);
        let key: SubjectKey = (8, false, "u".into());
        let local = f.local(&key, &[p(100, 100, 60_000)], true, 2.0, 1, "api").unwrap();
        let admitted = |from: u64, to: u64| {
            (from..=to).step_by(10).filter(|&ms| f.take(&key, &local, 1, ms).allowed()).count()
        };
        // Saturated for a whole window, then for the next one.
        assert_eq!(admitted(0, 60_000), 200, "100 at once, 100 more over the window");
        assert_eq!(admitted(60_010, 120_000), 100, "then the rate: the limit x slack / 2");
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
