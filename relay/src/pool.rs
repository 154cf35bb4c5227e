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
//! One lease call per subject is in flight at a time; a request that finds
//! the pool short meanwhile is forwarded as is (Redis answers it exactly).
//! A refusal from Redis is remembered until the retry time Redis named
//! (only for requests needing as much or more); a contended bucket (a grant
//! smaller than asked) is paced: until the relay's share of the rate has
//! refilled a batch, a request the pool cannot pay is refused from memory,
//! then one call asks for two batches. Both only refuse: never over.

use std::collections::HashMap;

use bytes::Bytes;
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
    /// Most subjects tracked; past it, new subjects are forwarded.
    pub max_subjects: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings { window_ms: 1000, ttl_ms: 2000, relays: 1, max_subjects: 100_000 }
    }
}

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

/// One subject's pool and its counters.
#[derive(Clone, Debug, Default)]
pub struct Pool {
    params: Vec<BucketParams>,
    tokens: u64,
    expires_ms: u64,
    leasing: bool,
    contended: bool,
    paced_until_ms: u64,
    /// A refusal from Redis: (tokens asked, retry until).
    denied: Option<(u64, u64)>,
    /// Redis's last answer and when: the standing replies are built from.
    last: Option<(Reply, u64)>,
    /// The batch size in force.
    pub batch: u64,
    /// Requests answered from memory (paid or refused), and lease calls sent.
    pub hits: u64,
    pub calls: u64,
}

impl Pool {
    /// Tokens held now.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    fn expire(&mut self, now_ms: u64) {
        if now_ms >= self.expires_ms {
            self.tokens = 0;
        }
    }

    /// The refusal Redis named, while it holds for `need`.
    fn refusal(&mut self, need: Need, now_ms: u64) -> Option<Reply> {
        let (asked, until) = self.denied?;
        if now_ms >= until || need.min < asked {
            return None;
        }
        self.hits += 1;
        Some(self.standing(0, (until - now_ms) as i64, now_ms))
    }

    /// Takes what `need` asks of the pool, if it holds `need.min`.
    fn pay(&mut self, need: Need, now_ms: u64) -> Option<Reply> {
        if self.tokens < need.min {
            return None;
        }
        let granted = need.want.min(self.tokens);
        self.tokens -= granted;
        Some(self.standing(granted, 0, now_ms))
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
            remaining: last.remaining.saturating_add(self.tokens).min(last.limit.max(last.remaining)),
            retry_after_ms,
            reset_after_ms: last.reset_after_ms.saturating_sub(now_ms.saturating_sub(at)),
            limit: last.limit,
            binding: last.binding,
        }
    }
}

/// Every subject's pool, keyed by its keys.
#[derive(Debug, Default)]
pub struct Pools {
    settings: Settings,
    pools: HashMap<Vec<Bytes>, Pool>,
}

impl Pools {
    pub fn new(settings: Settings) -> Pools {
        Pools { settings, pools: HashMap::new() }
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// The pools, for INFO and metrics.
    pub fn iter(&self) -> impl Iterator<Item = (&Vec<Bytes>, &Pool)> {
        self.pools.iter()
    }

    /// What to do with a request for `need` tokens of the buckets `keys`
    /// (with `params`) at `now_ms`.
    pub fn plan(&mut self, keys: &[Bytes], params: &[BucketParams], need: Need, now_ms: u64) -> Plan {
        let settings = self.settings;
        if batch(params, settings.window_ms, settings.relays) <= 1 {
            // A share of a token or less: a lease would strand tokens, so
            // each request is one call, as a gateway does; only a refusal
            // Redis named is answered from memory.
            return match self.pools.get_mut(keys).and_then(|p| p.refusal(need, now_ms)) {
                Some(reply) => Plan::Answer { reply, top_up: None },
                None => Plan::Forward,
            };
        }
        if !self.pools.contains_key(keys) && !self.make_room(now_ms) {
            return Plan::Forward;
        }
        let pool = self.pools.entry(keys.to_vec()).or_default();
        if pool.params != params {
            // New or changed limits: what was held was leased under the old
            // ones; drop it (under, never over).
            *pool = Pool {
                params: params.to_vec(),
                batch: batch(params, settings.window_ms, settings.relays),
                ..Pool::default()
            };
        }
        pool.expire(now_ms);
        let paced = pool.contended && now_ms < pool.paced_until_ms;
        if let Some(reply) = pool.pay(need, now_ms) {
            pool.hits += 1;
            let top_up = (!pool.leasing && !paced && pool.tokens < pool.batch.div_ceil(2)).then(|| {
                pool.leasing = true;
                pool.calls += 1;
                pool.want()
            });
            return Plan::Answer { reply, top_up };
        }
        if let Some(reply) = pool.refusal(need, now_ms) {
            return Plan::Answer { reply, top_up: None };
        }
        if paced {
            pool.hits += 1;
            return Plan::Answer {
                reply: pool.standing(0, (pool.paced_until_ms - now_ms) as i64, now_ms),
                top_up: None,
            };
        }
        if pool.leasing {
            return Plan::Forward;
        }
        pool.leasing = true;
        pool.calls += 1;
        let min = need.min - pool.tokens;
        // Never more than the buckets hold: a grant short of an ask no
        // bucket could meet is not contention.
        let capacity = params.iter().map(|p| p.capacity()).min().unwrap_or(u64::MAX);
        let want = (need.want - pool.tokens).saturating_add(pool.want()).min(capacity).max(min);
        Plan::Lease { want, min }
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
        let ttl_ms = self.settings.ttl_ms;
        let relays = self.settings.relays;
        let Some(pool) = self.pools.get_mut(keys) else {
            // Evicted meanwhile: the grant is dropped (under, never over).
            return need.map(|_| Reply { granted: 0, ..upstream });
        };
        pool.leasing = false;
        pool.expire(now_ms);
        pool.last = Some((upstream, now_ms));
        if upstream.granted > 0 {
            pool.tokens = pool.tokens.saturating_add(upstream.granted);
            pool.expires_ms = now_ms.saturating_add(ttl_ms);
            pool.denied = None;
            pool.contended = upstream.granted < asked;
            if pool.contended {
                pool.paced_until_ms = now_ms.saturating_add(pace_ms(&pool.params, pool.batch, relays));
            }
        } else if upstream.retry_after_ms > 0 {
            let asked_min = need.map_or(1, |n| n.min.saturating_sub(pool.tokens).max(1));
            pool.denied = Some((asked_min, hold_until(&pool.params, asked_min, upstream, relays, now_ms)));
        }
        let need = need?;
        Some(pool.pay(need, now_ms).unwrap_or(Reply { granted: 0, ..upstream }))
    }

    /// Redis answered a forwarded RL.TAKE or RL.LEASE of `need`: a refusal
    /// is remembered until the retry time it names.
    pub fn forwarded(&mut self, keys: &[Bytes], params: &[BucketParams], need: Need, upstream: Reply, now_ms: u64) {
        if upstream.granted > 0 || upstream.retry_after_ms <= 0 {
            return;
        }
        if !self.pools.contains_key(keys) && !self.make_room(now_ms) {
            return;
        }
        let settings = self.settings;
        let pool = self.pools.entry(keys.to_vec()).or_default();
        if pool.params != params {
            *pool = Pool {
                params: params.to_vec(),
                batch: batch(params, settings.window_ms, settings.relays),
                ..Pool::default()
            };
        }
        pool.last = Some((upstream, now_ms));
        pool.denied = Some((need.min, hold_until(params, need.min, upstream, settings.relays, now_ms)));
    }

    /// A lease call failed (timeout, connection): the next request may try.
    pub fn failed(&mut self, keys: &[Bytes]) {
        if let Some(pool) = self.pools.get_mut(keys) {
            pool.leasing = false;
        }
    }

    /// Room for one more subject: drops pools holding nothing; false if
    /// the table is still full.
    fn make_room(&mut self, now_ms: u64) -> bool {
        if self.pools.len() < self.settings.max_subjects {
            return true;
        }
        self.pools.retain(|_, p| {
            p.leasing || (p.tokens > 0 && now_ms < p.expires_ms) || p.denied.is_some_and(|(_, until)| now_ms < until)
        });
        self.pools.len() < self.settings.max_subjects
    }
}

impl Pool {
    /// What a lease call asks for on top of the request's need: a batch,
    /// two once paced (the bucket is drained, not left to overflow).
    fn want(&self) -> u64 {
        if self.contended {
            self.batch.saturating_mul(2)
        } else {
            self.batch
        }
    }
}

/// A batch: `window_ms` of one relay's share (rate / relays) of the
/// tightest rule, at most its capacity, at least 1. The same sizing as a
/// gateway's (rl-client's lease batch), with relays for gateways.
pub fn batch(rules: &[BucketParams], window_ms: u64, relays: u32) -> u64 {
    let relays = u128::from(relays.max(1));
    let share = |p: &BucketParams| {
        let per_window = u128::from(p.refill()) * u128::from(window_ms) / (u128::from(p.period_ms()) * relays);
        per_window.min(u128::from(p.capacity())) as u64
    };
    rules.iter().map(share).min().unwrap_or(1).max(1)
}

/// Until when a refusal of `tokens` is held: the retry time Redis named, and
/// at least this holder's share of the refill of them (as rl-client's deny
/// cache holds one), so a subject refused everywhere costs about one call
/// per token of refill, not one per holder per retry time. Longer only
/// refuses more: under, never over.
fn hold_until(params: &[BucketParams], tokens: u64, refused: Reply, holders: u32, now_ms: u64) -> u64 {
    let retry = u64::try_from(refused.retry_after_ms).unwrap_or(0);
    now_ms.saturating_add(retry.max(pace_ms(params, tokens, holders)))
}

/// How long the relay's share of the slowest rule takes to refill `tokens`.
pub fn pace_ms(rules: &[BucketParams], tokens: u64, relays: u32) -> u64 {
    let one = |p: &BucketParams| {
        let ms = u128::from(tokens) * u128::from(relays.max(1)) * u128::from(p.period_ms()) / u128::from(p.refill());
        u64::try_from(ms).unwrap_or(u64::MAX)
    };
    rules.iter().map(one).max().unwrap_or(0)
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
        assert_eq!(pace_ms(&rule(1000, 10_000, 1000), 50, 200), 1000);
    }

    #[test]
    fn a_short_pool_leases_a_batch_then_serves_from_memory() {
        let mut pools = Pools::new(Settings { relays: 10, ..Settings::default() });
        let params = rule(1000, 1000, 1000);
        let Plan::Lease { want, min } = pools.plan(&keys(), &params, ONE, 0) else { panic!() };
        assert_eq!((want, min), (101, 1));
        let reply = pools.settle(&keys(), want, granted(101, 899), Some(ONE), 0).unwrap();
        assert_eq!((reply.granted, reply.remaining), (1, 999));
        for _ in 0..50 {
            let Plan::Answer { reply, top_up: None } = pools.plan(&keys(), &params, ONE, 1) else { panic!() };
            assert_eq!(reply.granted, 1);
        }
        // Below half a batch: the answer also asks for a top-up, once.
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
        let Plan::Answer { reply, top_up: None } = pools.plan(&keys(), &params, ONE, 41) else { panic!() };
        assert_eq!((reply.granted, reply.retry_after_ms), (0, 9960));
        assert!(matches!(pools.plan(&keys(), &params, ONE, 10_000), Plan::Answer { .. }));
        assert_eq!(pools.plan(&keys(), &params, ONE, 10_001), Plan::Forward);
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
        assert!(matches!(pools.plan(&keys(), &params, ONE, 100), Plan::Lease { .. }));
    }

    #[test]
    fn a_contended_bucket_is_paced_then_asks_two_batches() {
        let mut pools = Pools::new(Settings { relays: 10, ..Settings::default() });
        let params = rule(1000, 1000, 1000); // batch 100, pace 1000 ms
        let Plan::Lease { want, .. } = pools.plan(&keys(), &params, ONE, 0) else { panic!() };
        pools.settle(&keys(), want, granted(2, 0), Some(ONE), 0);
        assert!(matches!(
            pools.plan(&keys(), &params, ONE, 1),
            Plan::Answer { reply: Reply { granted: 1, .. }, top_up: None }
        ));
        let Plan::Answer { reply, .. } = pools.plan(&keys(), &params, ONE, 10) else { panic!() };
        assert_eq!((reply.granted, reply.retry_after_ms), (0, 990));
        let Plan::Lease { want, .. } = pools.plan(&keys(), &params, ONE, 1000) else { panic!() };
        assert_eq!(want, 201);
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
    fn a_full_table_forwards_new_subjects() {
        let mut pools = Pools::new(Settings { max_subjects: 1, ..Settings::default() });
        let params = rule(1000, 1000, 1000);
        assert!(matches!(pools.plan(&keys(), &params, ONE, 0), Plan::Lease { .. }));
        assert_eq!(pools.plan(&[Bytes::from_static(b"other")], &params, ONE, 0), Plan::Forward);
    }
}
