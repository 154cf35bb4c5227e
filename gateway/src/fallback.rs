//! Local token buckets that decide while Redis cannot answer.
//!
//! Behind a round-robin balancer each of `gateways` gateways sees about
//! 1/gateways of a subject's traffic, so each enforces that share of every
//! rule, times `slack` because traffic is never spread perfectly evenly.
//! The buckets are rl-core's, integer-exact on a local monotonic clock; a
//! subject's rules stay all-or-nothing. The bounds, fleet-wide, while the
//! shard is down:
//!
//! - a token bucket admits at most `max(slack x capacity, gateways) +
//!   slack x refill x elapsed / period`: each gateway's bucket holds its
//!   share of the capacity, rounded down, but one token at least, and
//!   refills at its share of the rate;
//! - a window admits at most `slack` x its limit in any window: its
//!   stand-in holds half of that share and refills the other half over a
//!   window, so a full bucket plus one window of refill is the share (with
//!   the whole share as capacity and as refill, a window could see twice
//!   that).
//!
//! A share is rounded down to whole tokens of capacity. A bucket rule whose
//! share is below one token (10 a second on 300 gateways, slack 2: 0.07
//! each) gets one token anyway, refilling at its share of the rate: one
//! request per gateway at once, `gateways` fleet-wide (300 for a limit of
//! 10), then `slack` x the rate. Refusing instead would shut every small
//! plan out for the whole outage; the rules that must not be that generous
//! (logins, one-time passwords) are marked fail-closed. The limiter says so
//! once in the log. A window whose share is below one token still refuses:
//! a token on every gateway in every window would break its bound.
//!
//! While the shard's breaker is open a decision consults one entry per
//! subject and group: this one, which also keeps what the deny cache said
//! of the subject (read again at most every `REFUSAL_READ_MS`), under one
//! lock. Leased tokens are left unspent meanwhile (under, never over).
//!
//! Memory is bounded: at most `entries` subjects (quick_cache, CLOCK-Pro
//! eviction). An evicted subject starts again with full buckets: under heavy
//! churn during an outage a subject may get one more local burst.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quick_cache::sync::Cache;
use rl_client::internal::lock;
use rl_client::Decision;
use rl_core::fallback::{below_one_token, share};
use rl_core::{acquire_in_place, BucketParams, BucketState};

use crate::subject::{Subject, SubjectKey};

/// How long the open breaker's path trusts what it read from the deny
/// cache. While the breaker is open no answer from Redis adds a refusal,
/// but for a late one (a call sent before it opened): such a refusal is
/// seen at most this late, the fallback's bound holding meanwhile.
const REFUSAL_READ_MS: u64 = 100;

pub(crate) struct Fallback {
    map: Cache<SubjectKey, Arc<Mutex<Local>>>,
    /// Groups (and fleet sizes) already warned about a share below one token.
    warned: Cache<(u64, u32), ()>,
}

/// One subject's stand-ins for a group's rules.
struct Local {
    /// The fleet size and slack `params` were scaled for.
    gateways: u32,
    slack: f64,
    /// The capacity of the full slack was given (made at it, or added once
    /// when the breaker first opened): a breaker that opens and closes again
    /// adds no new burst.
    topped: bool,
    /// The group's rules scaled to this gateway's share.
    params: Vec<BucketParams>,
    states: Vec<Option<BucketState>>,
    /// The deny cache's answer for the subject, as last read on the open
    /// breaker's path.
    refusal: Option<Refusal>,
}

/// What the deny cache answered at `read_ms` for a request of `cost`.
struct Refusal {
    read_ms: u64,
    cost: u64,
    refused: Option<Decision>,
}

impl Refusal {
    /// Its refusal at `now_ms`, the waits counted down; `None` once it ends.
    fn at(&self, now_ms: u64) -> Option<Decision> {
        let d = self.refused?;
        let past = Duration::from_millis(now_ms.saturating_sub(self.read_ms));
        let retry = d.retry_after?.checked_sub(past).filter(|left| !left.is_zero())?;
        Some(Decision { retry_after: Some(retry), reset_after: d.reset_after.saturating_sub(past), ..d })
    }
}

/// What a subject's entry answered on the open breaker's path.
pub(crate) enum Answer {
    /// The deny cache's refusal, still running.
    Refused(Decision),
    /// The stand-in buckets' decision.
    Local(rl_core::Reply),
}

/// What the stand-ins of a group are scaled from: its rules as the policy
/// has them, and how they are shared.
pub(crate) struct Scale<'a> {
    pub(crate) rules: &'a [BucketParams],
    /// Windows (at half the slack) rather than token buckets.
    pub(crate) window: bool,
    pub(crate) slack: f64,
    /// The full slack (the breaker is open), not the partial failure's.
    pub(crate) full: bool,
    pub(crate) gateways: u32,
    /// For the log.
    pub(crate) policy: &'a str,
}

impl Fallback {
    pub(crate) fn new(entries: usize) -> Fallback {
        Fallback { map: Cache::new(entries), warned: Cache::new(1000) }
    }

    /// This gateway's stand-ins for the rules of `key`'s group, scaled with
    /// [`share`] (windows at half the slack); `Err(i)` when rule `i` (an
    /// index into the rules) is a window whose share is below one token:
    /// the group then refuses.
    pub(crate) fn local(&self, key: &impl Subject, scale: &Scale) -> Result<Vec<BucketParams>, usize> {
        let Scale { rules, window, gateways, policy, .. } = *scale;
        let slack = if window { scale.slack / 2.0 } else { scale.slack };
        let mut local = Vec::with_capacity(rules.len());
        for (i, rule) in rules.iter().enumerate() {
            if below_one_token(rule, slack, gateways) {
                let group = key.group();
                if self.warned.get(&(group, gateways)).is_none() {
                    self.warned.insert((group, gateways), ());
                    let capacity = rule.capacity();
                    let share = format!("{capacity} x {slack} / {gateways}");
                    if window {
                        log::warn!(
                            "policy '{policy}': a fail-open window of limit {capacity} has a fallback share below one \
                             token on {gateways} gateways ({share}): it refuses while Redis cannot answer"
                        );
                    } else {
                        log::warn!(
                            "policy '{policy}': a fail-open rule of capacity {capacity} has a fallback share below \
                             one token on {gateways} gateways ({share}): while Redis cannot answer each gateway admits \
                             one request at once ({gateways} fleet-wide), then {slack} x its rate fleet-wide; mark it \
                             fail-closed if it guards logins or one-time passwords"
                        );
                    }
                }
                if window {
                    return Err(i);
                }
            }
            local.push(share(rule, slack, gateways));
        }
        Ok(local)
    }

    /// Takes `cost` from the subject's stand-ins for its group's rules, all
    /// or none, at `now_ms`: scaled from `scale` the first time, and again
    /// when the fleet size or the slack changes (one bucket whose tokens
    /// are kept: the slack is lower while Redis still answers other calls). `Err(i)` as [`Fallback::local`].
    pub(crate) fn take(
        &self,
        key: &impl Subject,
        scale: &Scale,
        cost: u64,
        now_ms: u64,
    ) -> Result<rl_core::Reply, usize> {
        let entry = self.entry(key, scale)?;
        let mut local = lock(&entry);
        self.rescale(&mut local, key, scale)?;
        Ok(local.take(cost, now_ms))
    }

    /// [`Fallback::take`] while the breaker is open, after the subject's
    /// refusal: `deny` reads the deny cache for a request of `cost`, at
    /// most every `REFUSAL_READ_MS` (and when the cost changes); its answer
    /// is kept in the entry. One lookup, one lock.
    pub(crate) fn take_unless_refused(
        &self,
        key: &impl Subject,
        scale: &Scale,
        cost: u64,
        now_ms: u64,
        deny: impl FnOnce() -> Option<Decision>,
    ) -> Result<Answer, usize> {
        let entry = self.entry(key, scale)?;
        let mut local = lock(&entry);
        let fresh = |r: &Refusal| r.cost == cost && now_ms.saturating_sub(r.read_ms) < REFUSAL_READ_MS;
        if !local.refusal.as_ref().is_some_and(fresh) {
            local.refusal = Some(Refusal { read_ms: now_ms, cost, refused: deny() });
        }
        if let Some(refused) = local.refusal.as_ref().and_then(|r| r.at(now_ms)) {
            return Ok(Answer::Refused(refused));
        }
        self.rescale(&mut local, key, scale)?;
        Ok(Answer::Local(local.take(cost, now_ms)))
    }

    /// The subject's entry, made at `scale` if it has none.
    fn entry(&self, key: &impl Subject, scale: &Scale) -> Result<Arc<Mutex<Local>>, usize> {
        if let Some(entry) = self.map.get(key) {
            return Ok(entry);
        }
        let params = self.local(key, scale)?;
        let states = vec![None; params.len()];
        let fresh = || {
            Ok::<_, std::convert::Infallible>(Arc::new(Mutex::new(Local {
                gateways: scale.gateways,
                slack: scale.slack,
                topped: scale.full,
                params,
                states,
                refusal: None,
            })))
        };
        match self.map.get_or_insert_with(&key.owned(), fresh) {
            Ok(entry) => Ok(entry),
            Err(never) => match never {},
        }
    }

    /// Drops the stand-in buckets of `subject` in every group: how many.
    pub(crate) fn forget(&self, subject: &str) -> usize {
        crate::subject::forget_subject(&self.map, subject)
    }

    /// Rescales `local` when the fleet size or the slack changed since it
    /// was scaled. `Err(i)` as [`Fallback::local`].
    fn rescale(&self, local: &mut Local, key: &impl Subject, scale: &Scale) -> Result<(), usize> {
        if local.gateways == scale.gateways && local.slack == scale.slack {
            return Ok(());
        }
        // The buckets keep their tokens; only their size and rate change
        // (a new fleet size; the breaker opening or closing).
        let params = self.local(key, scale)?;
        if local.gateways == scale.gateways && scale.slack > local.slack && !local.topped {
            // The breaker opened: the budget Redis no longer spends is
            // added (a full bucket stays full), so a partial failure
            // followed by an outage allows what an outage alone does.
            let Local { params: old, states, .. } = &mut *local;
            for ((old, new), state) in old.iter().zip(&params).zip(states.iter_mut()) {
                if let Some(state) = state {
                    let more = new.capacity().saturating_sub(old.capacity());
                    state.tokens = state.tokens.saturating_add(i64::try_from(more).unwrap_or(i64::MAX));
                }
            }
        }
        local.topped |= scale.full;
        local.states.resize(params.len(), None);
        local.params = params;
        local.gateways = scale.gateways;
        local.slack = scale.slack;
        Ok(())
    }
}

impl Local {
    fn take(&mut self, cost: u64, now_ms: u64) -> rl_core::Reply {
        acquire_in_place(&self.params, &mut self.states, cost, cost, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rl_core::limits::{MAX_PERIOD_MS, MAX_TOKENS};

    fn p(c: u64, r: u64, ms: u64) -> BucketParams {
        BucketParams::new(c, r, ms).unwrap()
    }

    fn scale(rules: &[BucketParams], window: bool, gateways: u32) -> Scale<'_> {
        Scale { rules, window, slack: 2.0, full: true, gateways, policy: "api" }
    }

    #[test]
    fn each_gateway_gets_its_share_times_slack() {
        let shared = |rule, slack, gateways| {
            let s = share(&rule, slack, gateways);
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
    fn a_share_below_one_token_is_one_token_at_the_share_of_the_rate() {
        // 5 a minute on 300 gateways: 0.03 tokens each. One token, refilled
        // at 5 x 2 / 300 a minute: one every 30 minutes.
        assert!(below_one_token(&p(5, 5, 60_000), 2.0, 300));
        let s = share(&p(5, 5, 60_000), 2.0, 300);
        assert_eq!((s.capacity(), s.refill(), s.period_ms()), (1, 5000, 9_000_000_000));
        assert!(below_one_token(&p(149, 5, 60_000), 2.0, 300), "0.99 of a token");
        assert!(!below_one_token(&p(150, 5, 60_000), 2.0, 300));
        // A group keeps its other rules' shares.
        let f = Fallback::new(10);
        let key: SubjectKey = (7, false, "u".into());
        let local = f.local(&key, &scale(&[p(1000, 1000, 1000), p(5, 5, 60_000)], false, 300)).unwrap();
        assert_eq!(local.iter().map(|l| l.capacity()).collect::<Vec<_>>(), [6, 1]);
        // Windows take half the slack: a limit of 300 on 300 gateways is one
        // each. Below one token a window refuses: its bound is per window.
        assert_eq!(f.local(&key, &scale(&[p(300, 300, 60_000)], true, 300)).map(|l| l[0].capacity()), Ok(1));
        assert_eq!(f.local(&key, &scale(&[p(299, 299, 60_000)], true, 300)), Err(0));
        assert_eq!(f.take(&key, &scale(&[p(299, 299, 60_000)], true, 300), 1, 0).map(|d| d.allowed()), Err(0));
    }

    #[test]
    fn a_share_below_one_token_admits_one_per_gateway_then_slack_times_the_rate() {
        // 10 a second on 300 gateways, slack 2: 0.07 tokens each. Fleet-wide
        // at most max(2 x 10, 300) at once, then 2 x 10 a second: every
        // gateway's bucket holds one token and gains one every 15 s.
        let rules = [p(10, 10, 1000)];
        let fleet: Vec<Fallback> = (0..300).map(|_| Fallback::new(10)).collect();
        let key: SubjectKey = (9, false, "quiet".into());
        // Every gateway asked every 100 ms for a minute: saturated.
        let admitted = |from: u64, to: u64| {
            let mut n = 0;
            for ms in (from..=to).step_by(100) {
                for gateway in &fleet {
                    n += u64::from(gateway.take(&key, &scale(&rules, false, 300), 1, ms).unwrap().allowed());
                }
            }
            n
        };
        assert_eq!(admitted(0, 0), 300, "one per gateway at once");
        assert_eq!(admitted(100, 14_900), 0, "nothing until a gateway's share refills a token");
        assert_eq!(admitted(15_000, 60_000), 4 * 300, "then 2 x 10 a second: 1,200 in 60 s");
    }

    #[test]
    fn a_window_stand_in_admits_slack_times_the_limit_in_any_window() {
        // 100 in any minute, one gateway, slack 2: at most 200 in any minute.
        let f = Fallback::new(10);
        let key: SubjectKey = (8, false, "u".into());
        let rules = [p(100, 100, 60_000)];
        let admitted = |from: u64, to: u64| {
            (from..=to)
                .step_by(10)
                .filter(|&ms| f.take(&key, &scale(&rules, true, 1), 1, ms).unwrap().allowed())
                .count()
        };
        // Saturated for a whole window, then for the next one.
        assert_eq!(admitted(0, 60_000), 200, "100 at once, 100 more over the window");
        assert_eq!(admitted(60_010, 120_000), 100, "then the rate: the limit x slack / 2");
    }

    #[test]
    fn the_open_breakers_path_keeps_the_refusal_and_reads_it_again_when_stale() {
        let f = Fallback::new(10);
        let key: SubjectKey = (4, false, "u".into());
        let rules = [p(100, 100, 60_000)];
        let open = scale(&rules, false, 1);
        let refused = Decision {
            allowed: false,
            remaining: 0,
            retry_after: Some(Duration::from_millis(250)),
            reset_after: Duration::from_millis(1000),
            limit: 100,
            rule: 0,
            source: rl_client::Source::DenyCache,
            shadow_refused: None,
        };
        let reads = std::cell::Cell::new(0);
        let answer = |cost, now, said: Option<Decision>| {
            let deny = || {
                reads.set(reads.get() + 1);
                said
            };
            match f.take_unless_refused(&key, &open, cost, now, deny).unwrap() {
                Answer::Refused(d) => Err(d),
                Answer::Local(d) => Ok(d.allowed()),
            }
        };
        // Refused, and counted down from the entry without reading again.
        assert_eq!(answer(1, 0, Some(refused)).unwrap_err().retry_after, Some(Duration::from_millis(250)));
        let later = answer(1, 60, None).unwrap_err();
        assert_eq!(
            (later.retry_after, later.reset_after),
            (Some(Duration::from_millis(190)), Duration::from_millis(940))
        );
        assert_eq!(reads.get(), 1);
        // Another cost is read again; so is an answer older than REFUSAL_READ_MS.
        assert_eq!(answer(2, 60, None).map_err(|_| ()), Ok(true));
        assert_eq!(answer(1, 61, Some(refused)).map_err(|_| ()), Err(()));
        assert_eq!(answer(1, 61 + REFUSAL_READ_MS, None).map_err(|_| ()), Ok(true));
        assert_eq!(reads.get(), 4);
        // A kept refusal ends when its retry time does, before it is stale.
        let brief = Decision { retry_after: Some(Duration::from_millis(50)), ..refused };
        assert_eq!(answer(1, 300, Some(brief)).map_err(|_| ()), Err(()));
        assert_eq!(answer(1, 349, None).map_err(|_| ()), Err(()));
        assert_eq!(answer(1, 350, None).map_err(|_| ()), Ok(true));
        assert_eq!(reads.get(), 5);
        // Only the requests the buckets decided spent tokens: 200 - 4 left.
        let left = (0..300).filter(|_| f.take(&key, &open, 1, 350).unwrap().allowed()).count();
        assert_eq!(left, 196);
    }

    #[test]
    fn local_buckets_are_all_or_nothing_and_bounded() {
        let f = Fallback::new(10);
        let key: SubjectKey = (1, false, "u".into());
        // Slack 2 on 2 gateways: the rules as they are.
        let rules = [p(3, 1, 60_000), p(2, 1, 60_000)];
        let local = scale(&rules, false, 2);
        assert!(f.take(&key, &local, 1, 0).unwrap().allowed());
        assert!(f.take(&key, &local, 1, 0).unwrap().allowed());
        let d = f.take(&key, &local, 1, 0).unwrap();
        assert_eq!((d.allowed(), d.binding), (false, 1));
        assert!(f.take(&key, &local, 1, 60_000).unwrap().allowed(), "refilled a minute later");
        for i in 0..1000 {
            f.take(&(1, false, i.to_string().into()), &local, 1, 0).unwrap();
        }
        assert!(f.map.len() <= 11);
    }

    #[test]
    fn the_breaker_opening_adds_the_budget_redis_no_longer_spends() {
        let f = Fallback::new(10);
        let key: SubjectKey = (3, false, "u".into());
        let rules = [p(100, 100, 60_000)];
        let partial = Scale { rules: &rules, window: false, slack: 1.0, full: false, gateways: 1, policy: "api" };
        // Redis still answering other calls: slack - 1 = 1, a bucket of 100.
        for _ in 0..30 {
            assert!(f.take(&key, &partial, 1, 0).unwrap().allowed());
        }
        // The breaker opens: slack 2, the 70 left plus 100 more.
        let open = scale(&rules, false, 1);
        assert_eq!((0..300).filter(|_| f.take(&key, &open, 1, 0).unwrap().allowed()).count(), 170);
        // 200 in all, as an outage alone would allow; closing and opening
        // again adds no new burst.
        assert!(!f.take(&key, &partial, 1, 0).unwrap().allowed());
        assert!(!f.take(&key, &open, 1, 0).unwrap().allowed());
    }

    #[test]
    fn a_new_fleet_size_rescales_the_buckets_keeping_their_tokens() {
        let f = Fallback::new(10);
        let key: SubjectKey = (2, false, "u".into());
        let rules = [p(100, 100, 60_000)];
        // One gateway: 200 tokens. Spend 195 of them.
        for _ in 0..195 {
            assert!(f.take(&key, &scale(&rules, false, 1), 1, 0).unwrap().allowed());
        }
        // Ten gateways: a bucket of 20 holding the 5 left, not a fresh one.
        let ten = scale(&rules, false, 10);
        let d = f.take(&key, &ten, 1, 0).unwrap();
        assert_eq!((d.allowed(), d.limit, d.remaining), (true, 20, 4));
        assert_eq!((0..100).filter(|_| f.take(&key, &ten, 1, 0).unwrap().allowed()).count(), 4);
    }
}
