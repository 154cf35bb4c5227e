//! Leases, pure: how many tokens a holder (a gateway, a relay) leases at a
//! time, how long it waits while the bucket is contended, and one
//! subject's lease as a state machine with time a parameter. rl-client's
//! limiter, the relay and the scale model all run this code; the locks,
//! the calls and the replies around it are theirs.
//!
//! A lease is taken with RL.LEASE before any of its tokens is spent, so
//! holders can never admit more than the buckets hold: the error is under,
//! never over. Tokens unspent `ttl` after the lease's last refill are
//! dropped (never handed back: the bucket refilled while they were held,
//! so a refund could lift it above `capacity + refill x elapsed`).
//!
//! At most one lease call per subject is in flight (`leasing`). A
//! contended bucket (a call got fewer tokens than it asked for) is paced:
//! until this holder's share of the rate has refilled what the last call
//! granted (a batch if nothing), no top-up is sent, and once the pace ends
//! one call asks for two batches. What a request the lease cannot pay does
//! meanwhile depends on the spend:
//!
//! - [`Lease::spend`] refuses it from memory for the whole pace (holders
//!   in a fleet: the pace keeps their calls spread);
//! - [`Lease::spend_or_ask`] sends it to Redis, leading the one call when
//!   none is on its way (a holder alone: nobody else takes the refill, so
//!   pacing could only refuse what Redis holds).
//!
//! Only refusals are added: never over.

use crate::BucketParams;

/// This holder's share of `window_ms` of the slowest rule's rate, among
/// `holders`: the tokens one lease call asks for. 1 means a quiet subject,
/// checked call by call. Never more than the smallest capacity.
pub fn batch(rules: &[BucketParams], window_ms: u64, holders: u32) -> u64 {
    let holders = u64::from(holders.max(1));
    let share = |p: &BucketParams| {
        // In u64 when it fits (nearly always, and a u128 division is several
        // times slower: a gateway runs this on every check), else in u128.
        let per_window = match (p.refill().checked_mul(window_ms), p.period_ms().checked_mul(holders)) {
            (Some(tokens), Some(per)) => u128::from(tokens / per),
            _ => p.refill() as u128 * window_ms as u128 / (p.period_ms() as u128 * holders as u128),
        };
        per_window.min(p.capacity() as u128) as u64
    };
    rules.iter().map(share).min().unwrap_or(1).max(1)
}

/// How long one holder's share (`refill / holders` per `period`) of `rule`
/// takes to refill `tokens`, in ms (saturating).
pub fn share_ms(rule: &BucketParams, tokens: u64, holders: u32) -> u64 {
    let ms = tokens as u128 * u128::from(holders.max(1)) * rule.period_ms() as u128 / rule.refill() as u128;
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The pace of a contended lease that was just granted `granted` tokens:
/// the slowest rule's share refilling them (a batch when nothing came), so
/// each holder calls again once its share has refilled what it took. A
/// fixed pace after every grant kept a fleet in lockstep (the first
/// gateways drained the bucket, the rest got nothing and waited as long),
/// and tokens sat leased but unspent: the subject got 94.9% of its limit.
pub fn pace_ms(rules: &[BucketParams], granted: u64, batch: u64, holders: u32) -> u64 {
    let tokens = if granted == 0 { batch } else { granted };
    rules.iter().map(|r| share_ms(r, tokens, holders)).max().unwrap_or(0)
}

/// One subject's lease at one holder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lease {
    tokens: u64,
    expires_ms: u64,
    /// A lease call is on its way: don't send another.
    leasing: bool,
    /// The last call got fewer tokens than it asked for: calls are paced.
    contended: bool,
    /// While contended, no call goes before this time.
    paced_until_ms: u64,
}

/// What spending from a lease found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spend {
    /// Paid from the lease. `top_up`: it reached half of a batch, and this
    /// request leads the one lease call (ask for [`Lease::want`]) to top it
    /// up in the background; [`Lease::call_done`] when it ends.
    Hit { top_up: bool },
    /// Not enough tokens: `reserved` (fewer than the cost) were taken out
    /// for this request, which needs the rest from Redis; [`Lease::put_back`]
    /// them if it does not get it. With `lead`, it is the one lease call in
    /// flight and asks for a batch; without, it asks for the rest only.
    Short { reserved: u64, lead: bool },
    /// The bucket is contended and this holder has had its share for now:
    /// refused from memory until `until_ms` (nothing reserved).
    Paced { until_ms: u64 },
}

impl Lease {
    /// Tokens held (expired ones included until the next spend or add).
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Whether calls are paced at `now_ms` (the bucket is contended and
    /// this holder has had its share for now).
    pub fn is_paced(&self, now_ms: u64) -> bool {
        self.contended && now_ms < self.paced_until_ms
    }

    /// Tokens held and unexpired at `now_ms`.
    pub fn held(&self, now_ms: u64) -> u64 {
        if now_ms < self.expires_ms {
            self.tokens
        } else {
            0
        }
    }

    /// A lease call is on its way.
    pub fn leasing(&self) -> bool {
        self.leasing
    }

    /// Whether it holds unexpired tokens or a call is on its way at `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.leasing || self.held(now_ms) > 0
    }

    /// Spends `cost` tokens at `now_ms` if the lease holds them (expired ones
    /// are dropped first); `batch` is the size of a top-up. `may_call` says
    /// whether a lease call could go now, asked only when one is wanted: if
    /// not (the shard's breaker refuses it), none is claimed: no top-up, and
    /// a short request asks for its own cost.
    pub fn spend(&mut self, cost: u64, batch: u64, now_ms: u64, may_call: impl FnOnce() -> bool) -> Spend {
        self.expire(now_ms);
        let paced = self.is_paced(now_ms);
        if self.tokens < cost {
            // Contended: this holder has had its share until the pace ends,
            // and once it ends the one call in flight asks for everyone.
            if self.contended && (paced || self.leasing) {
                return Spend::Paced { until_ms: self.paced_until_ms.max(now_ms + 1) };
            }
            let reserved = std::mem::take(&mut self.tokens);
            return Spend::Short { reserved, lead: self.claim(true, may_call) };
        }
        self.tokens -= cost;
        let half_empty = 2 * self.tokens <= batch;
        Spend::Hit { top_up: self.claim(half_empty && !paced, may_call) }
    }

    /// [`Lease::spend`] for a holder alone, never `Paced`: a request the
    /// lease cannot pay is `Short`, leading the one call when none is on its
    /// way (`may_call` as for `spend`), contended or not. Top-ups are paced
    /// as by `spend`.
    pub fn spend_or_ask(&mut self, cost: u64, batch: u64, now_ms: u64, may_call: impl FnOnce() -> bool) -> Spend {
        self.expire(now_ms);
        if self.tokens < cost {
            let reserved = std::mem::take(&mut self.tokens);
            return Spend::Short { reserved, lead: self.claim(true, may_call) };
        }
        self.spend(cost, batch, now_ms, may_call)
    }

    /// Claims the one call in flight, if one is wanted and none is on its way.
    fn claim(&mut self, wanted: bool, may_call: impl FnOnce() -> bool) -> bool {
        let lead = wanted && !self.leasing && may_call();
        self.leasing |= lead;
        lead
    }

    /// The call in flight ended (answered, failed or abandoned): the next
    /// may go.
    pub fn call_done(&mut self) {
        self.leasing = false;
    }

    /// Drops the tokens of an expired lease.
    pub fn expire(&mut self, now_ms: u64) {
        if now_ms >= self.expires_ms {
            self.tokens = 0;
        }
    }

    /// Adds granted tokens (dropping expired ones first: they are never
    /// revived); a grant keeps them `ttl_ms`.
    pub fn add(&mut self, tokens: u64, now_ms: u64, ttl_ms: u64) {
        self.expire(now_ms);
        self.tokens += tokens;
        if tokens > 0 {
            self.expires_ms = now_ms.saturating_add(ttl_ms);
        }
    }

    /// A lease call asked for `wanted` and got `granted`: fewer means the
    /// bucket is contended, and the next call waits `pace_ms` (this
    /// holder's share of the rate refilling what was granted, [`pace_ms`]);
    /// all of it ends that.
    pub fn answered(&mut self, wanted: u64, granted: u64, pace_ms: u64, now_ms: u64) {
        self.contended = granted < wanted;
        self.paced_until_ms = if self.contended { now_ms.saturating_add(pace_ms) } else { 0 };
    }

    /// What a lease call asks for: a batch, two while contended (more than
    /// this holder's share, so the bucket is drained rather than left to
    /// overflow: Redis grants what is there, no more).
    pub fn want(&self, batch: u64) -> u64 {
        if self.contended {
            batch.saturating_mul(2)
        } else {
            batch
        }
    }

    /// Gives back tokens reserved by a request that did not get the rest,
    /// unless the lease expired meanwhile (then they are dropped).
    pub fn put_back(&mut self, tokens: u64, now_ms: u64) {
        if now_ms < self.expires_ms {
            self.tokens += tokens;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_TOKENS;

    fn leased(tokens: u64, now_ms: u64) -> Lease {
        let mut l = Lease::default();
        l.add(tokens, now_ms, 1000);
        l
    }

    fn spend(l: &mut Lease, cost: u64, batch: u64, now_ms: u64) -> Spend {
        l.spend(cost, batch, now_ms, || true)
    }

    /// The reserved tokens of a short spend.
    fn reserved(s: Spend) -> u64 {
        match s {
            Spend::Short { reserved, .. } => reserved,
            hit => panic!("{hit:?}"),
        }
    }

    #[test]
    fn spends_from_memory_and_tops_up_at_half_empty_once() {
        let mut l = leased(9, 0);
        let top_ups: Vec<Spend> = (0..5).map(|_| spend(&mut l, 1, 10, 0)).collect();
        // 8, 7, 6 left: no top-up; 5 is half of 10: once, not again.
        let hit = |top_up| Spend::Hit { top_up };
        assert_eq!(top_ups, [hit(false), hit(false), hit(false), hit(true), hit(false)]);
        l.call_done();
        assert_eq!(spend(&mut l, 1, 10, 30), hit(true), "a finished call lets the next one go");
    }

    #[test]
    fn one_lease_call_at_a_time() {
        let mut l = Lease::default();
        assert_eq!(spend(&mut l, 3, 10, 0), Spend::Short { reserved: 0, lead: true }, "the first short request leads");
        assert_eq!(spend(&mut l, 1, 10, 0), Spend::Short { reserved: 0, lead: false }, "the others ask for their cost");
        l.add(4, 0, 1000);
        l.call_done();
        assert_eq!(spend(&mut l, 4, 10, 0), Spend::Hit { top_up: true }, "empty: a top-up at once");
        assert_eq!(spend(&mut l, 1, 10, 0), Spend::Short { reserved: 0, lead: false }, "not beside the top-up");
        l.call_done();
        assert_eq!(spend(&mut l, 1, 10, 0), Spend::Short { reserved: 0, lead: true });
    }

    #[test]
    fn no_call_is_claimed_when_none_may_go() {
        let mut l = leased(6, 0);
        assert_eq!(l.spend(1, 10, 0, || false), Spend::Hit { top_up: false });
        assert_eq!(l.spend(9, 10, 0, || false), Spend::Short { reserved: 5, lead: false });
        assert!(!l.leasing());
    }

    #[test]
    fn a_short_lease_reserves_what_it_has() {
        let mut l = leased(2, 0);
        assert_eq!(reserved(spend(&mut l, 3, 10, 0)), 2);
        assert_eq!(reserved(spend(&mut l, 1, 10, 0)), 0);
        l.put_back(2, 500);
        assert!(matches!(spend(&mut l, 2, 10, 500), Spend::Hit { .. }));
    }

    #[test]
    fn expired_tokens_are_dropped_never_revived() {
        let mut l = leased(5, 0);
        assert_eq!((l.held(999), l.held(1000)), (5, 0));
        assert!(matches!(spend(&mut l, 1, 10, 999), Spend::Hit { .. }));
        l.call_done();
        assert_eq!(reserved(spend(&mut l, 1, 10, 1000)), 0, "the 4 left expired");
        l.call_done();
        // Tokens reserved before expiry and put back after it are dropped too.
        l.add(3, 2000, 1000);
        assert_eq!(reserved(spend(&mut l, 4, 10, 2000)), 3);
        l.call_done();
        l.put_back(3, 3000);
        assert_eq!(reserved(spend(&mut l, 1, 10, 3000)), 0);
        l.call_done();
        // A refill after expiry does not revive what was left.
        l.add(4, 4000, 1000);
        l.add(2, 5000, 1000);
        assert_eq!(reserved(spend(&mut l, 3, 10, 5000)), 2);
        assert!(l.is_live(5000), "the call in flight keeps it");
        l.call_done();
        assert!(!l.is_live(5000), "nothing held, nothing on its way");
    }

    #[test]
    fn a_contended_lease_is_paced_and_asks_for_two_batches() {
        let mut l = Lease::default();
        assert_eq!(spend(&mut l, 1, 10, 0), Spend::Short { reserved: 0, lead: true });
        // Asked for 10, got 4 (one for the request): contended, paced for 50 ms.
        l.call_done();
        l.answered(10, 4, 50, 0);
        l.add(3, 0, 1000);
        assert_eq!(l.want(10), 20);
        for _ in 0..3 {
            assert_eq!(spend(&mut l, 1, 10, 10), Spend::Hit { top_up: false }, "no top-up while paced");
        }
        assert_eq!(spend(&mut l, 1, 10, 10), Spend::Paced { until_ms: 50 }, "refused from memory");
        assert!(l.is_paced(49) && !l.is_paced(50));
        // The pace ends: one call leads, the others are refused meanwhile.
        assert_eq!(spend(&mut l, 1, 10, 50), Spend::Short { reserved: 0, lead: true });
        assert!(matches!(spend(&mut l, 1, 10, 50), Spend::Paced { .. }));
        // It got all it asked for: no longer contended.
        l.call_done();
        l.answered(20, 20, 50, 50);
        l.add(19, 50, 1000);
        assert_eq!(l.want(10), 10);
        assert!(matches!(spend(&mut l, 15, 10, 51), Spend::Hit { .. }));
    }

    #[test]
    fn a_holder_alone_asks_redis_where_a_fleet_is_paced() {
        let mut l = Lease::default();
        let ask = |l: &mut Lease, now| l.spend_or_ask(1, 10, now, || true);
        assert_eq!(ask(&mut l, 0), Spend::Short { reserved: 0, lead: true });
        // Asked for 10, got 4: contended, paced for 50 ms.
        l.call_done();
        l.answered(10, 4, 50, 0);
        l.add(3, 0, 1000);
        for _ in 0..3 {
            assert_eq!(ask(&mut l, 10), Spend::Hit { top_up: false }, "no top-up while paced");
        }
        assert_eq!(l.spend(1, 10, 10, || true), Spend::Paced { until_ms: 50 }, "a fleet's holder is paced");
        // Alone: short while paced, Redis may still hold the refill.
        assert_eq!(ask(&mut l, 10), Spend::Short { reserved: 0, lead: true });
        assert_eq!(ask(&mut l, 10), Spend::Short { reserved: 0, lead: false }, "its own cost beside the call");
        // The call got nothing: still asks.
        l.call_done();
        l.answered(20, 0, 100, 20);
        assert_eq!(ask(&mut l, 30), Spend::Short { reserved: 0, lead: true });
    }

    #[test]
    fn batch_is_a_share_of_a_window_of_the_slowest_rule() {
        let p = |c, r, ms| BucketParams::new(c, r, ms).unwrap();
        // 100,000/s on 10 gateways: 1,000 per 100 ms.
        assert_eq!(batch(&[p(200_000, 100_000, 1000)], 100, 10), 1000);
        // The slowest rule sets it; never above the smallest capacity.
        assert_eq!(batch(&[p(200_000, 100_000, 1000), p(300, 6000, 1000)], 100, 1), 300);
        // 100/s on 300 gateways: a quiet key, batch 1.
        assert_eq!(batch(&[p(100, 100, 1000)], 100, 300), 1);
        assert_eq!(batch(&[p(5, 5, 60_000)], 100, 1), 1);
        assert_eq!(batch(&[], 100, 1), 1);
    }

    #[test]
    fn batch_past_u64_is_the_same_floor() {
        let p = |c, r, ms| BucketParams::new(c, r, ms).unwrap();
        // 10^14 a second x a 10^6 ms window does not fit a u64.
        assert_eq!(batch(&[p(MAX_TOKENS, MAX_TOKENS, 1000)], 1_000_000, 1000), MAX_TOKENS);
        assert_eq!(batch(&[p(MAX_TOKENS, MAX_TOKENS, 1000)], 1_000_000, 4_000_000_000), 25_000_000);
    }

    #[test]
    fn the_share_interval_is_the_fleets_refill_per_holder() {
        let p = BucketParams::new(10_000, 10_000, 1000).unwrap();
        // 10,000/s on 300 gateways: 33 tokens take 990 ms of one gateway's share.
        assert_eq!(share_ms(&p, 33, 300), 990);
        assert_eq!(pace_ms(&[p, BucketParams::new(10, 10, 1000).unwrap()], 1, 5, 300), 30_000);
        // Paced by what was granted: twice the tokens, twice the wait; none,
        // a batch's wait.
        assert_eq!(pace_ms(&[p], 66, 33, 300), 1980);
        assert_eq!(pace_ms(&[p], 0, 33, 300), 990);
    }
}
