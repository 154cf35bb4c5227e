//! The relay's decisions, pure: tokens it leased from Redis for each subject,
//! spent on its gateways' RL.TAKE and RL.LEASE calls, with time a parameter
//! (the server reads the system clock, the scale model a virtual one).
//!
//! Tokens only flow downward: every token handed to a gateway was granted
//! to the relay by an RL.LEASE before, so the relay never admits what Redis
//! did not grant. Held tokens unspent `ttl_ms` after their last grant are
//! dropped, never handed back (a late refund could lift a bucket above its
//! limit, see RL.REFUND). A relay that dies loses what it holds: at most
//! about two batches per subject (a batch and a top-up, or a paced call's
//! two batches), and the buckets refill meanwhile: under-admission only.
//!
//! Each pool is rl-core's lease (`rl_core::lease`), the code a gateway's
//! limiter runs, with the relays for the gateways in its sizing: one lease
//! call per subject in flight (a request that finds the pool short
//! meanwhile is forwarded as is: Redis answers it exactly), a top-up at
//! half a batch, and a contended bucket (a grant smaller than asked)
//! paced: until the relay's share of the rate has refilled what the last
//! call granted, a request the pool cannot pay is refused from memory, then
//! one call asks for two batches. A refusal from Redis is remembered
//! (`rl_core::deny`) until the retry time Redis named, for requests needing
//! as much or more, and at most `max_hold_ms` (then Redis is asked again;
//! the reply still names Redis's retry time). Both only refuse: never over.
//!
//! The table is bounded: at most `max_subjects` pools, of subjects whose
//! keys add up to at most [`MAX_POOLED_KEY_BYTES`]. When it is full, a new
//! subject takes the place of the least recently used of a few sampled
//! pools that cost nothing to drop (no tokens held, no call on its way; a
//! remembered refusal costs one call to Redis), as Redis's approximated LRU
//! does; if none of them is free, the new subject is forwarded, which Redis
//! answers exactly and at full speed. Making room is constant time.

use bytes::Bytes;
use indexmap::IndexMap;
use rl_core::deny::Denial;
pub use rl_core::lease::batch;
use rl_core::lease::{pace_ms, share_ms, Lease, Spend};
use rl_core::{BucketParams, Reply};

/// How the relay sizes and keeps its leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// A batch is this much of the relay's share of the rate (ms).
    pub window_ms: u64,
    /// Held tokens unspent this long after their last grant are dropped.
    pub ttl_ms: u64,
    /// Relays sharing the limits: the relay's share is the rate / relays.
    pub relays: u32,
    /// Most subjects tracked; past it, a new subject takes the place of an
    /// idle one, or is forwarded.
    pub max_subjects: usize,
    /// Longest a refusal is remembered, whatever retry time Redis named.
    pub max_hold_ms: u64,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings { window_ms: 1000, ttl_ms: 2000, relays: 1, max_subjects: 100_000, max_hold_ms: 30_000 }
    }
}

/// A subject whose keys add up to more is never pooled (forwarded), so the
/// table's memory is bounded by `max_subjects` whatever the keys.
pub const MAX_POOLED_KEY_BYTES: usize = 1024;

/// Pools looked at to find one to drop when the table is full.
const EVICTION_SAMPLES: usize = 16;

/// What a caller needs: at least `min`, at most `want` tokens (RL.TAKE's
/// cost is both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub want: u64,
    pub min: u64,
}

/// What to do with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Answered from memory. With `top_up`, also send RL.LEASE WANT top_up
    /// MIN 1 in the background and [`Pools::settle`] its answer with no need.
    Answer { reply: Reply, top_up: Option<u64> },
    /// Send RL.LEASE WANT want MIN min, then [`Pools::settle`] the answer
    /// with the request's need: it gives the reply.
    Lease { want: u64, min: u64 },
    /// Send the request as it came (a lease call is in flight, or the table
    /// is full): Redis answers it.
    Forward,
}

/// What a pool knows of Redis: the room it last said its buckets had, at
/// `at_ms` (the pools' clock), and the tokens a lease call on its way may
/// take (about: a top-up's want).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub room: u64,
    pub at_ms: u64,
    pub leasing: u64,
}

/// One subject's pool and its counters.
#[derive(Clone, Debug, Default)]
pub struct Pool {
    params: Vec<BucketParams>,
    /// The tokens held, the call in flight, the pace: rl-core's lease, as a
    /// gateway keeps it.
    lease: Lease,
    /// A refusal from Redis, remembered (held at most `max_hold_ms`).
    denied: Option<Denial>,
    /// The retry time Redis named with it, which replies keep.
    retry_at_ms: u64,
    /// The last request or answer for it: eviction drops the least recent.
    last_used_ms: u64,
    /// Redis's last answer and when: the standing replies are built from.
    last: Option<(Reply, u64)>,
    /// The batch size in force.
    pub batch: u64,
    /// Requests answered from memory (paid or refused), and lease calls sent.
    pub hits: u64,
    pub calls: u64,
    /// Requests refused, from memory or by Redis (the most refused
    /// subjects are an operator's first question).
    pub refused: u64,
}

impl Pool {
    fn new(params: &[BucketParams], settings: Settings) -> Pool {
        Pool { params: params.to_vec(), batch: batch(params, settings.window_ms, settings.relays), ..Pool::default() }
    }

    /// Tokens held now.
    pub fn tokens(&self) -> u64 {
        self.lease.tokens()
    }

    /// Tokens held and unexpired at `now_ms`.
    pub fn held(&self, now_ms: u64) -> u64 {
        self.lease.held(now_ms)
    }

    /// The refusal Redis named, while it holds for `need`.
    fn refusal(&mut self, need: Need, now_ms: u64) -> Option<Reply> {
        self.denied.filter(|d| d.refuses(need.min, now_ms))?;
        self.hits += 1;
        self.refused += 1;
        // Redis's retry time counted down, never the hold (the hold is this
        // relay's share of the fleet); past it, the next instant.
        let retry = self.retry_at_ms.saturating_sub(now_ms).max(1);
        Some(self.standing(0, i64::try_from(retry).unwrap_or(i64::MAX), now_ms))
    }

    /// Remembers Redis's refusal `refused` of `tokens` at `now_ms`.
    fn deny(&mut self, tokens: u64, refused: Reply, settings: Settings, now_ms: u64) {
        let retry = u64::try_from(refused.retry_after_ms).unwrap_or(0);
        self.denied = refusal(&self.params, tokens, refused, settings, now_ms);
        self.retry_at_ms = now_ms.saturating_add(retry);
    }

    /// What dropping it costs, least first: tokens held or a call on its
    /// way (never dropped), a refusal remembered (a call to Redis), then
    /// the least recently used.
    fn eviction_cost(&self, now_ms: u64) -> (bool, bool, u64) {
        let refusing = self.denied.is_some_and(|d| now_ms < d.until_ms);
        (self.lease.is_live(now_ms), refusing, self.last_used_ms)
    }

    /// Takes what `need` asks of the pool, if it holds `need.min`: no lease
    /// call is claimed (for the request a lease call answered).
    fn pay(&mut self, need: Need, now_ms: u64) -> Option<Reply> {
        let cost = need.want.min(self.lease.tokens());
        if cost < need.min {
            return None;
        }
        match self.lease.spend(cost, self.batch, now_ms, || false) {
            Spend::Hit { .. } => Some(self.standing(cost, 0, now_ms)),
            Spend::Short { reserved, .. } => {
                self.lease.put_back(reserved, now_ms);
                None
            }
            Spend::Paced { .. } => None,
        }
    }

    /// The reply for `granted` tokens (0: refused, wait `retry_after_ms`):
    /// the bucket as Redis last left it, plus what this relay still holds.
    fn standing(&self, granted: u64, retry_after_ms: i64, now_ms: u64) -> Reply {
        let (last, at) = self.last.unwrap_or((
            Reply { granted: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0, limit: 0, binding: 0 },
            now_ms,
        ));
        Reply {
            granted,
            remaining: last.remaining.saturating_add(self.tokens()).min(last.limit.max(last.remaining)),
            retry_after_ms,
            reset_after_ms: last.reset_after_ms.saturating_sub(now_ms.saturating_sub(at)),
            limit: last.limit,
            binding: last.binding,
        }
    }
}

/// Every subject's pool, keyed by its keys.
#[derive(Debug)]
pub struct Pools {
    settings: Settings,
    pools: IndexMap<Vec<Bytes>, Pool>,
    /// Pools dropped to make room for new subjects.
    evictions: u64,
    /// The sampler's state (xorshift): deterministic, for the scale model.
    seed: u64,
}

impl Default for Pools {
    fn default() -> Pools {
        Pools::new(Settings::default())
    }
}

impl Pools {
    pub fn new(settings: Settings) -> Pools {
        Pools { settings, pools: IndexMap::new(), evictions: 0, seed: 0x9e37_79b9_7f4a_7c15 }
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// The pools, for INFO and metrics.
    pub fn iter(&self) -> impl Iterator<Item = (&Vec<Bytes>, &Pool)> {
        self.pools.iter()
    }

    /// The pool at `index` of `iter`'s order.
    pub fn get_index(&self, index: usize) -> Option<(&Vec<Bytes>, &Pool)> {
        self.pools.get_index(index)
    }

    /// Subjects held.
    pub fn len(&self) -> usize {
        self.pools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// Pools dropped so far to make room for new subjects.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The pool of `keys` with `params`, made if there is room. New or
    /// changed limits start it empty: what was held was leased under the
    /// old ones, and is dropped (under, never over).
    fn pool(&mut self, keys: &[Bytes], params: &[BucketParams], now_ms: u64) -> Option<&mut Pool> {
        if !self.pools.contains_key(keys) {
            if keys.iter().map(Bytes::len).sum::<usize>() > MAX_POOLED_KEY_BYTES || !self.make_room(now_ms) {
                return None;
            }
            self.pools.insert(keys.to_vec(), Pool::default());
        }
        let settings = self.settings;
        let pool = self.pools.get_mut(keys)?;
        if pool.params != params {
            *pool = Pool::new(params, settings);
        }
        pool.last_used_ms = now_ms;
        Some(pool)
    }

    /// What to do with a request for `need` tokens of the buckets `keys`
    /// (with `params`) at `now_ms`.
    pub fn plan(&mut self, keys: &[Bytes], params: &[BucketParams], need: Need, now_ms: u64) -> Plan {
        let settings = self.settings;
        if batch(params, settings.window_ms, settings.relays) <= 1 {
            // A share of a token or less: a lease would strand tokens, so
            // each request is one call, as a gateway does; only a refusal
            // Redis named is answered from memory.
            let Some(pool) = self.pools.get_mut(keys).filter(|p| p.params == params) else { return Plan::Forward };
            pool.last_used_ms = now_ms;
            return match pool.refusal(need, now_ms) {
                Some(reply) => Plan::Answer { reply, top_up: None },
                None => Plan::Forward,
            };
        }
        let Some(pool) = self.pool(keys, params, now_ms) else { return Plan::Forward };
        pool.lease.expire(now_ms);
        let held = pool.lease.tokens();
        if held < need.min {
            if let Some(reply) = pool.refusal(need, now_ms) {
                return Plan::Answer { reply, top_up: None };
            }
        }
        // A request takes what it wants of what is held, as long as that is
        // its minimum (RL.LEASE's WANT and MIN).
        let cost = if held >= need.min { need.want.min(held) } else { need.min };
        match pool.lease.spend(cost, pool.batch, now_ms, || true) {
            Spend::Hit { top_up } => {
                pool.hits += 1;
                pool.calls += u64::from(top_up);
                let reply = pool.standing(cost, 0, now_ms);
                Plan::Answer { reply, top_up: top_up.then(|| pool.lease.want(pool.batch)) }
            }
            // Paced only because a lease call is on its way: a gateway
            // refuses here to spare Redis a call per request; the relay
            // forwards (the call lands within a round trip, and Redis
            // answers exactly).
            Spend::Paced { .. } if !pool.lease.is_paced(now_ms) => Plan::Forward,
            Spend::Paced { until_ms } => {
                pool.hits += 1;
                pool.refused += 1;
                // The pace is this relay's share; the client is told when
                // the bucket refills what it needs at the full rate, as
                // Redis would tell it, never later than the pace.
                let refill = params.iter().map(|p| share_ms(p, need.min, 1)).max().unwrap_or(0);
                let retry = (until_ms - now_ms).min(refill).max(1);
                Plan::Answer { reply: pool.standing(0, retry as i64, now_ms), top_up: None }
            }
            Spend::Short { reserved, lead } => {
                // What is held stays in the pool: the lease call's answer
                // pays the request from it (see `settle`).
                pool.lease.put_back(reserved, now_ms);
                if !lead {
                    return Plan::Forward;
                }
                pool.calls += 1;
                let min = need.min - reserved;
                // Never more than the buckets hold: a grant short of an ask
                // no bucket could meet is not contention.
                let capacity = params.iter().map(|p| p.capacity()).min().unwrap_or(u64::MAX);
                let want = (need.want - reserved).saturating_add(pool.lease.want(pool.batch)).min(capacity).max(min);
                Plan::Lease { want, min }
            }
        }
    }

    /// Redis answered a lease call of `asked` tokens at `now_ms` with
    /// `upstream`: the pool takes the grant, and the request that waited
    /// for it (`need`, none for a top-up) gets its reply.
    pub fn settle(
        &mut self,
        keys: &[Bytes],
        asked: u64,
        upstream: Reply,
        need: Option<Need>,
        now_ms: u64,
    ) -> Option<Reply> {
        let settings = self.settings;
        let Settings { ttl_ms, relays, .. } = settings;
        let Some(pool) = self.pools.get_mut(keys) else {
            // Dropped meanwhile: the request takes what it needs of the
            // grant, the rest is dropped (under, never over).
            return need.map(|n| {
                let granted = if upstream.granted >= n.min { upstream.granted.min(n.want) } else { 0 };
                Reply { granted, ..upstream }
            });
        };
        pool.lease.call_done();
        pool.last_used_ms = now_ms;
        pool.last = Some((upstream, now_ms));
        pool.lease.add(upstream.granted, now_ms, ttl_ms);
        pool.lease.answered(
            asked,
            upstream.granted,
            pace_ms(&pool.params, upstream.granted, pool.batch, relays),
            now_ms,
        );
        if upstream.granted > 0 {
            pool.denied = None;
        } else {
            let asked_min = need.map_or(1, |n| n.min.saturating_sub(pool.lease.tokens()).max(1));
            pool.deny(asked_min, upstream, settings, now_ms);
        }
        let need = need?;
        let reply = pool.pay(need, now_ms).unwrap_or(Reply { granted: 0, ..upstream });
        pool.refused += u64::from(reply.granted == 0);
        Some(reply)
    }

    /// Redis answered a forwarded RL.TAKE or RL.LEASE of `need`: a refusal
    /// is remembered until the retry time it names.
    pub fn forwarded(&mut self, keys: &[Bytes], params: &[BucketParams], need: Need, upstream: Reply, now_ms: u64) {
        if upstream.granted > 0 || upstream.retry_after_ms <= 0 {
            return;
        }
        let settings = self.settings;
        if let Some(pool) = self.pool(keys, params, now_ms) {
            pool.last = Some((upstream, now_ms));
            pool.refused += 1;
            pool.deny(need.min, upstream, settings, now_ms);
        }
    }

    /// Redis's last word on `keys`' buckets (a lease, a top-up or a
    /// refusal), and the lease call on its way, if any.
    pub fn last_reading(&self, keys: &[Bytes]) -> Option<Reading> {
        let pool = self.pools.get(keys)?;
        let (reply, at_ms) = pool.last?;
        let leasing = if pool.lease.leasing() { pool.lease.want(pool.batch) } else { 0 };
        Some(Reading { room: reply.remaining, at_ms, leasing })
    }

    /// Tokens a request took and did not use, back in `keys`' pool (unless
    /// its lease expired meanwhile: then they are dropped).
    pub fn give_back(&mut self, keys: &[Bytes], tokens: u64, now_ms: u64) {
        if let Some(pool) = self.pools.get_mut(keys) {
            pool.lease.put_back(tokens, now_ms);
        }
    }

    /// A lease call failed (timeout, connection): the next request may try.
    pub fn failed(&mut self, keys: &[Bytes]) {
        if let Some(pool) = self.pools.get_mut(keys) {
            pool.lease.call_done();
        }
    }

    /// Room for one more subject: when the table is full, drops the
    /// cheapest of a few sampled pools if dropping it loses no tokens;
    /// false if none of them is free.
    fn make_room(&mut self, now_ms: u64) -> bool {
        if self.pools.len() < self.settings.max_subjects {
            return true;
        }
        let len = self.pools.len();
        let mut victim: Option<(usize, (bool, bool, u64))> = None;
        for _ in 0..EVICTION_SAMPLES.min(len) {
            let i = (self.next_random() % len as u64) as usize;
            let cost = self.pools[i].eviction_cost(now_ms);
            if victim.is_none_or(|(_, best)| cost < best) {
                victim = Some((i, cost));
            }
        }
        match victim {
            Some((i, (false, _, _))) => {
                self.pools.swap_remove_index(i);
                self.evictions += 1;
                true
            }
            _ => false,
        }
    }

    fn next_random(&mut self) -> u64 {
        xorshift(&mut self.seed)
    }
}

/// The next of a xorshift sequence (`seed` not 0): the eviction samplers'
/// cheap, deterministic draw.
pub fn xorshift(seed: &mut u64) -> u64 {
    let mut x = *seed;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *seed = x;
    x
}

/// A refusal of `tokens` held until the retry time Redis named, and at
/// least this holder's share of the refill of them (as rl-client's deny
/// cache holds one), so a subject refused everywhere costs about one call
/// per token of refill, not one per holder per retry time; either at most
/// `max_hold_ms`. Longer only refuses more: under, never over.
fn refusal(params: &[BucketParams], tokens: u64, refused: Reply, settings: Settings, now_ms: u64) -> Option<Denial> {
    let retry = u64::try_from(refused.retry_after_ms).unwrap_or(0);
    let hold = params.iter().map(|p| share_ms(p, tokens, settings.relays)).max().unwrap_or(0);
    let most = settings.max_hold_ms.max(1);
    Denial::new(tokens, retry.min(most), hold.min(most), now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(capacity: u64, refill: u64, period_ms: u64) -> Vec<BucketParams> {
        vec![BucketParams::new(capacity, refill, period_ms).unwrap()]
    }

    fn keys() -> Vec<Bytes> {
        vec![Bytes::from_static(b"rl:{a}:s")]
    }

    fn granted(n: u64, remaining: u64) -> Reply {
        Reply { granted: n, remaining, retry_after_ms: 0, reset_after_ms: 500, limit: 1000, binding: 0 }
    }

    fn refused(retry: i64) -> Reply {
        Reply { granted: 0, remaining: 0, retry_after_ms: retry, reset_after_ms: 900, limit: 1000, binding: 0 }
    }

    const ONE: Need = Need { want: 1, min: 1 };

    #[test]
    fn batches_are_the_relays_share_of_a_window() {
        assert_eq!(batch(&rule(1000, 100_000, 1000), 1000, 200), 500);
        assert_eq!(batch(&rule(100, 100_000, 1000), 1000, 200), 100, "at most the capacity");
        assert_eq!(batch(&rule(10, 10, 1000), 1000, 200), 1, "at least one");
        let two = [rule(1000, 1000, 1000), rule(100, 100, 1000)].concat();
        assert_eq!(batch(&two, 1000, 10), 10, "the tightest rule");
        assert_eq!(pace_ms(&rule(1000, 10_000, 1000), 50, 50, 200), 1000);
    }

    #[test]
    fn a_short_pool_leases_a_batch_then_serves_from_memory() {
        let mut pools = Pools::new(Settings { relays: 10, ..Settings::default() });
        let params = rule(1000, 1000, 1000);
        let Plan::Lease { want, min } = pools.plan(&keys(), &params, ONE, 0) else { panic!() };
        assert_eq!((want, min), (101, 1));
        let reply = pools.settle(&keys(), want, granted(101, 899), Some(ONE), 0).unwrap();
        assert_eq!((reply.granted, reply.remaining), (1, 999));
        for _ in 0..49 {
            let Plan::Answer { reply, top_up: None } = pools.plan(&keys(), &params, ONE, 1) else { panic!() };
            assert_eq!(reply.granted, 1);
        }
        // At half a batch: the answer also asks for a top-up, once.
        let Plan::Answer { top_up: Some(100), .. } = pools.plan(&keys(), &params, ONE, 1) else { panic!() };
        let Plan::Answer { top_up: None, .. } = pools.plan(&keys(), &params, ONE, 1) else { panic!() };
    }

    #[test]
    fn never_hands_out_more_than_was_granted() {
        let mut pools = Pools::new(Settings { relays: 10, ..Settings::default() });
        let params = rule(1000, 1000, 1000);
        let mut from_redis = 0;
        let mut handed = 0;
        for t in 0..2000u64 {
            let need = Need { want: 1 + t % 7, min: 1 + t % 3 };
            match pools.plan(&keys(), &params, need, t) {
                Plan::Answer { reply, top_up } => {
                    handed += reply.granted;
                    if let Some(w) = top_up {
                        let g = if t % 5 == 0 { 0 } else { w / 2 };
                        from_redis += g;
                        pools.settle(&keys(), w, granted(g, 0), None, t);
                    }
                }
                Plan::Lease { want, .. } => {
                    let g = want.min(3);
                    from_redis += g;
                    handed += pools.settle(&keys(), want, granted(g, 0), Some(need), t).unwrap().granted;
                }
                Plan::Forward => {}
            }
            assert!(handed <= from_redis, "at {t}: handed {handed} of {from_redis} granted");
        }
        assert!(handed > 0);
    }

    #[test]
    fn held_tokens_expire_after_the_ttl() {
        let mut pools = Pools::new(Settings { ttl_ms: 100, ..Settings::default() });
        let params = rule(1000, 10, 1000); // batch 10
        let Plan::Lease { want, .. } = pools.plan(&keys(), &params, ONE, 0) else { panic!() };
        pools.settle(&keys(), want, granted(11, 0), Some(ONE), 0);
        assert!(matches!(pools.plan(&keys(), &params, ONE, 99), Plan::Answer { .. }));
        assert!(matches!(pools.plan(&keys(), &params, ONE, 100), Plan::Lease { .. }), "dropped, not spent");
    }

    #[test]
    fn a_share_of_a_token_is_one_call_per_request_refusals_remembered() {
        let mut pools = Pools::new(Settings { relays: 100, ..Settings::default() });
        let params = rule(10, 10, 1000); // a tenth of a token a second per relay
        assert_eq!(pools.plan(&keys(), &params, ONE, 0), Plan::Forward);
        pools.forwarded(&keys(), &params, ONE, granted(1, 5), 0);
        assert_eq!(pools.plan(&keys(), &params, ONE, 1), Plan::Forward, "a grant is not remembered");
        // Held past Redis's 100 ms: until this relay's share (a tenth of a
        // token a second) refilled the token, 10 s.
        pools.forwarded(&keys(), &params, ONE, refused(100), 1);
        // The reply names Redis's retry time counted down, never this
        // relay's share of the fleet (a client would wait 100 times too
        // long); past it, the next instant.
        let Plan::Answer { reply, top_up: None } = pools.plan(&keys(), &params, ONE, 41) else { panic!() };
        assert_eq!((reply.granted, reply.retry_after_ms), (0, 60));
        let Plan::Answer { reply, .. } = pools.plan(&keys(), &params, ONE, 10_000) else { panic!() };
        assert_eq!((reply.granted, reply.retry_after_ms), (0, 1));
        assert_eq!(pools.plan(&keys(), &params, ONE, 10_001), Plan::Forward);
    }

    #[test]
    fn a_paced_refusal_names_the_full_rates_refill_not_the_relays_share() {
        let mut pools = Pools::new(Settings { relays: 10, ..Settings::default() });
        let params = rule(100, 100, 1000); // batch 10, the relay's share 10/s
        let Plan::Lease { want, .. } = pools.plan(&keys(), &params, ONE, 0) else { panic!() };
        // Contended: a grant smaller than asked paces the pool.
        pools.settle(&keys(), want, granted(1, 0), Some(ONE), 0);
        let Plan::Answer { reply, .. } = pools.plan(&keys(), &params, ONE, 1) else { panic!() };
        assert_eq!(reply.granted, 0);
        assert!(reply.retry_after_ms <= 10, "a token refills in 10 ms at 100/s, told {} ms", reply.retry_after_ms);
    }

    #[test]
    fn a_refusal_is_remembered_until_the_retry_time() {
        let mut pools = Pools::new(Settings::default());
        let params = rule(10, 10, 1000);
        let Plan::Lease { want, .. } = pools.plan(&keys(), &params, ONE, 0) else { panic!() };
        let reply = pools.settle(&keys(), want, refused(100), Some(ONE), 0).unwrap();
        assert_eq!((reply.granted, reply.retry_after_ms), (0, 100));
        let Plan::Answer { reply, .. } = pools.plan(&keys(), &params, ONE, 40) else { panic!() };
        assert_eq!((reply.granted, reply.retry_after_ms), (0, 60));
        // A lease call granted nothing: paced as a gateway is, until the
        // relay's share (all of 10/s) refilled a batch (10): 1 s; the
        // client is told when its one token refills: 100 ms.
        let Plan::Answer { reply, .. } = pools.plan(&keys(), &params, ONE, 100) else { panic!() };
        assert_eq!((reply.granted, reply.retry_after_ms), (0, 100));
        assert!(matches!(pools.plan(&keys(), &params, ONE, 1000), Plan::Lease { .. }));
    }

    #[test]
    fn a_contended_bucket_is_paced_then_asks_two_batches() {
        let mut pools = Pools::new(Settings { relays: 10, ..Settings::default() });
        // Batch 100; the relay's share is 100/s: 10 ms a token.
        let params = rule(1000, 1000, 1000);
        let Plan::Lease { want, .. } = pools.plan(&keys(), &params, ONE, 0) else { panic!() };
        pools.settle(&keys(), want, granted(2, 0), Some(ONE), 0);
        assert!(matches!(
            pools.plan(&keys(), &params, ONE, 1),
            Plan::Answer { reply: Reply { granted: 1, .. }, top_up: None }
        ));
        // Paced until the share refilled the 2 granted: 20 ms; the client
        // is told when the full rate refills its token: 1 ms.
        let Plan::Answer { reply, .. } = pools.plan(&keys(), &params, ONE, 10) else { panic!() };
        assert_eq!((reply.granted, reply.retry_after_ms), (0, 1));
        let Plan::Lease { want, .. } = pools.plan(&keys(), &params, ONE, 20) else { panic!() };
        assert_eq!(want, 201);
        // Its call on the way, the pace over: forwarded, not refused.
        assert_eq!(pools.plan(&keys(), &params, ONE, 20), Plan::Forward);
        // Never more than the capacity: a full grant of that is no contention.
        let small = rule(10, 100, 1000); // batch 10
        let k = [Bytes::from_static(b"small")];
        let Plan::Lease { want, .. } = pools.plan(&k, &small, ONE, 0) else { panic!() };
        assert_eq!(want, 10);
        pools.settle(&k, want, granted(10, 0), Some(ONE), 0);
        let paid = pools.plan(&k, &small, Need { want: 9, min: 9 }, 1);
        assert!(
            matches!(paid, Plan::Answer { reply: Reply { granted: 9, .. }, top_up: Some(10) }),
            "not paced: {paid:?}"
        );
    }

    #[test]
    fn one_lease_call_at_a_time_others_forward() {
        let mut pools = Pools::new(Settings::default());
        let params = rule(1000, 1000, 1000);
        assert!(matches!(pools.plan(&keys(), &params, ONE, 0), Plan::Lease { .. }));
        assert_eq!(pools.plan(&keys(), &params, ONE, 0), Plan::Forward);
        pools.failed(&keys());
        assert!(matches!(pools.plan(&keys(), &params, ONE, 0), Plan::Lease { .. }));
    }

    #[test]
    fn changed_limits_drop_what_was_held() {
        let mut pools = Pools::new(Settings::default());
        let Plan::Lease { want, .. } = pools.plan(&keys(), &rule(1000, 1000, 1000), ONE, 0) else { panic!() };
        pools.settle(&keys(), want, granted(want, 0), Some(ONE), 0);
        assert!(matches!(pools.plan(&keys(), &rule(10, 10, 1000), ONE, 1), Plan::Lease { .. }));
    }

    #[test]
    fn a_full_table_forwards_new_subjects_while_every_pool_holds_tokens() {
        let mut pools = Pools::new(Settings { max_subjects: 1, ..Settings::default() });
        let params = rule(1000, 1000, 1000);
        assert!(matches!(pools.plan(&keys(), &params, ONE, 0), Plan::Lease { .. }));
        assert_eq!(pools.plan(&[Bytes::from_static(b"other")], &params, ONE, 0), Plan::Forward, "a call on its way");
        pools.settle(&keys(), 1000, granted(1000, 0), Some(ONE), 0);
        assert_eq!(pools.plan(&[Bytes::from_static(b"other")], &params, ONE, 1), Plan::Forward, "tokens held");
        // Once they expire, the pool is free to drop.
        assert!(matches!(pools.plan(&[Bytes::from_static(b"other")], &params, ONE, 2000), Plan::Lease { .. }));
        assert_eq!((pools.len(), pools.evictions()), (1, 1));
    }

    #[test]
    fn a_table_full_of_refusals_drops_the_least_recently_used() {
        let mut pools = Pools::new(Settings { max_subjects: 100, ..Settings::default() });
        let params = rule(1, 1, 63_072_000_000);
        let key = |i: u32| vec![Bytes::from(format!("rl:{{k{i}}}:s"))];
        for i in 0..100 {
            pools.forwarded(&key(i), &params, ONE, refused(63_000_000_000), u64::from(i));
        }
        assert_eq!(pools.len(), 100);
        // The first ones are used again: the others are older.
        for i in 0..10 {
            assert!(matches!(pools.plan(&key(i), &params, ONE, 1000), Plan::Answer { .. }));
        }
        let fast = rule(100_000, 100_000, 1000);
        for i in 100..150 {
            assert!(matches!(pools.plan(&key(i), &fast, ONE, 2000), Plan::Lease { .. }), "new subject {i} pooled");
        }
        assert_eq!((pools.len(), pools.evictions()), (100, 50));
        let kept = (0..10).filter(|&i| pools.pools.contains_key(&key(i))).count();
        assert!(kept >= 8, "{kept} of the 10 recently used refusals kept");
    }

    #[test]
    fn a_refusal_is_held_at_most_max_hold_and_replies_keep_redis_retry_time() {
        let mut pools = Pools::new(Settings { max_hold_ms: 500, ..Settings::default() });
        let params = rule(1, 1, 63_072_000_000);
        assert_eq!(pools.plan(&keys(), &params, ONE, 0), Plan::Forward);
        pools.forwarded(&keys(), &params, ONE, refused(63_000_000_000), 0);
        let Plan::Answer { reply, .. } = pools.plan(&keys(), &params, ONE, 100) else { panic!() };
        assert_eq!((reply.granted, reply.retry_after_ms), (0, 63_000_000_000 - 100));
        assert_eq!(pools.plan(&keys(), &params, ONE, 500), Plan::Forward, "asked again after the hold");
    }

    #[test]
    fn subjects_with_long_keys_are_never_pooled() {
        let mut pools = Pools::new(Settings::default());
        let long = [Bytes::from(vec![b'k'; MAX_POOLED_KEY_BYTES + 1])];
        assert_eq!(pools.plan(&long, &rule(1000, 1000, 1000), ONE, 0), Plan::Forward);
        pools.forwarded(&long, &rule(1, 1, 1000), ONE, refused(100), 0);
        assert!(pools.is_empty());
    }

    #[test]
    fn a_grant_for_a_dropped_pool_still_pays_its_request() {
        let mut pools = Pools::new(Settings::default());
        let reply = pools.settle(&keys(), 10, granted(10, 0), Some(Need { want: 3, min: 2 }), 0).unwrap();
        assert_eq!(reply.granted, 3);
        let reply = pools.settle(&keys(), 10, granted(1, 0), Some(Need { want: 3, min: 2 }), 0).unwrap();
        assert_eq!(reply.granted, 0);
    }
}
