//! A gateway's decisions as rl-client's `Limiter` makes them for a subject
//! of one bucket rule, with cost 1: rl-core's lease (`rl_core::lease`, the
//! state gateway/src/lease.rs keeps under its lock) and rl-core's refusal
//! (`rl_core::deny`, what gateway/src/deny_cache.rs keeps), driven in the
//! order the limiter drives them (gateway/src/limiter/ `evaluate_groups`,
//! `evaluate`, `degraded`, `admit`, `report`; gateway/src/lease.rs
//! `leased`, `refill`). Each shard it calls has its own circuit breaker,
//! rl-client's `Breaker` (made when the gateway first calls the shard);
//! while it refuses, or when a call fails, the request is decided as
//! gateway/src/fallback.rs decides it: a local bucket at rl-core's share of
//! the rule (`rl_core::fallback::share`), `slack - 1` times the share while
//! the breaker is closed and `slack` times once it opens (the difference
//! added once), after the subject's refusal. Its locks, its async calls
//! and its replies are left out.

use std::collections::HashMap;

use rl_core::deny::Denial;
use rl_core::fallback::share;
use rl_core::lease::{batch, pace_ms, share_ms, Lease, Spend};
use rl_core::{acquire_in_place, BucketParams, BucketState, Reply};
use rl_gateway::internal::{Breaker, Ticket};

/// A call a gateway sends.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Take,
    Lease { want: u64, min: u64 },
}

/// Why a gateway sent a call, carried to its answer.
#[derive(Clone, Copy, Debug)]
pub enum Purpose {
    /// A quiet subject's RL.TAKE.
    Take,
    /// A short lease's call for a request: `reserved` tokens were taken out
    /// of the lease for it; `lead`: it is the subject's one lease call.
    Short { reserved: u64, lead: bool },
    /// A background top-up (the subject's one lease call).
    TopUp,
}

/// What a gateway does with a request.
#[derive(Clone, Copy, Debug)]
pub enum Check {
    /// Decided from memory (a lease, a pace or a refusal); with `top_up`,
    /// a lease call of that many tokens goes in the background, admitted
    /// by the shard's breaker with its ticket.
    Memory { admitted: bool, top_up: Option<(u64, Ticket)> },
    /// Decided by the local fallback without a call: the shard's breaker
    /// refused one.
    Fallback { admitted: bool },
    /// Redis decides: send `op`, admitted by the shard's breaker with `ticket`.
    Call { op: Op, purpose: Purpose, ticket: Ticket },
}

#[derive(Default)]
struct Entry {
    lease: Lease,
    denied: Option<Denial>,
    local: Option<Local>,
}

/// A subject's rule: its bucket, and whether it refuses while Redis cannot
/// answer (make sim's logins) rather than falling back.
pub struct Rule<'a> {
    pub params: &'a [BucketParams],
    pub fail_closed: bool,
}

/// A subject's fallback bucket (gateway/src/fallback.rs `Local`, one rule).
struct Local {
    slack: f64,
    /// The full slack's capacity was given (see `Gateway::degraded`).
    topped: bool,
    params: [BucketParams; 1],
    states: [Option<BucketState>; 1],
}

/// The client's defaults: 5 failures in a row or half of a window's calls
/// open a breaker for 2 s; the fallback allows twice the share.
pub const TRIP_AFTER: u32 = 5;
pub const FAILURE_RATE: f64 = 0.5;
pub const OPEN_FOR_MS: u64 = 2000;
pub const SLACK: f64 = 2.0;

/// One gateway's leases, refusals, breakers and fallback buckets.
pub struct Gateway {
    /// Fleet size (the client's `gateways`), lease window and ttl (ms).
    gateways: u32,
    window_ms: u64,
    ttl_ms: u64,
    subjects: HashMap<u32, Entry>,
    /// A breaker per shard called, by shard.
    breakers: HashMap<u32, Breaker>,
    /// Checks decided without a call because a breaker refused (at once
    /// while it refuses every call, or when it refused this one), and
    /// top-ups not sent.
    pub avoided: u64,
    /// The failure rate that opens a breaker (infinite: none opens).
    failure_rate: f64,
    trip_after: u32,
}

const COST: u64 = 1;

impl Gateway {
    /// With `breakers` false the breakers never open (a comparison run).
    pub fn new(gateways: u32, window_ms: u64, ttl_ms: u64, breakers: bool) -> Gateway {
        let (trip_after, failure_rate) = if breakers { (TRIP_AFTER, FAILURE_RATE) } else { (u32::MAX, f64::INFINITY) };
        Gateway {
            gateways,
            window_ms,
            ttl_ms,
            subjects: HashMap::new(),
            breakers: HashMap::new(),
            avoided: 0,
            failure_rate,
            trip_after,
        }
    }

    /// Breakers made so far (one per shard this gateway called).
    pub fn breakers(&self) -> usize {
        self.breakers.len()
    }

    /// Whether `shard`'s breaker refuses every call at `now_ms`; a shard
    /// never called has no breaker yet, and a new one refuses nothing.
    fn refuses(&self, shard: u32, now_ms: u64) -> bool {
        self.breakers.get(&shard).is_some_and(|b| b.refuses(now_ms))
    }

    /// `shard`'s breaker's ticket for a call at `now_ms` (`Limiter::admit`).
    fn admit(&mut self, shard: u32, now_ms: u64) -> Option<Ticket> {
        let (trip_after, failure_rate) = (self.trip_after, self.failure_rate);
        let breaker = self.breakers.entry(shard).or_insert_with(|| Breaker::new(trip_after, OPEN_FOR_MS, failure_rate));
        let ticket = breaker.admit(now_ms);
        self.avoided += u64::from(ticket.is_none());
        ticket
    }

    /// How the call `ticket` admitted went (`Limiter::report`).
    pub fn report(&mut self, shard: u32, ticket: Ticket, ok: bool, now_ms: u64) {
        let Some(breaker) = self.breakers.get(&shard) else { return };
        if ok {
            breaker.success(ticket, now_ms);
        } else {
            breaker.failure(ticket, now_ms);
        }
    }

    /// Redis cannot answer for `s` (`Limiter::degraded`, a bucket rule):
    /// while `shard`'s breaker refuses, the subject's refusal first; then a
    /// fail-closed rule refuses, a fail-open one takes from the local
    /// bucket at `slack` x the share (while the breaker is closed, a call
    /// failed: `slack - 1` x). Whether the request is admitted, and whether
    /// the fallback decided it (not the refusal).
    fn degraded(&mut self, s: u32, shard: u32, rule: &Rule, now_ms: u64) -> (bool, bool) {
        let full = self.refuses(shard, now_ms);
        let gateways = self.gateways;
        let entry = self.subjects.entry(s).or_default();
        if full && entry.denied.is_some_and(|d| d.refuses(COST, now_ms)) {
            return (false, false);
        }
        if rule.fail_closed {
            return (false, true);
        }
        let slack = if full { SLACK } else { SLACK - 1.0 };
        let scaled = [share(&rule.params[0], slack, gateways)];
        let local = entry.local.get_or_insert(Local { slack, topped: full, params: scaled, states: [None] });
        if local.slack != slack {
            // `Fallback::rescale`: the breaker opened (or closed); the
            // bucket keeps its tokens, and the first opening adds the
            // budget Redis no longer spends.
            if slack > local.slack && !local.topped {
                if let Some(state) = &mut local.states[0] {
                    let more = scaled[0].capacity().saturating_sub(local.params[0].capacity());
                    state.tokens = state.tokens.saturating_add(i64::try_from(more).unwrap_or(i64::MAX));
                }
            }
            local.topped |= full;
            local.params = scaled;
            local.slack = slack;
        }
        (acquire_in_place(&local.params, &mut local.states, COST, COST, now_ms).granted > 0, true)
    }

    /// The fallback's answer as a check's.
    fn fallback(&mut self, s: u32, shard: u32, rule: &Rule, now_ms: u64) -> Check {
        match self.degraded(s, shard, rule, now_ms) {
            (admitted, true) => Check::Fallback { admitted },
            (_, false) => Check::Memory { admitted: false, top_up: None },
        }
    }

    fn batch(&self, params: &[BucketParams]) -> u64 {
        batch(params, self.window_ms, self.gateways)
    }

    /// A request for subject `s`, on `shard`, at `now_ms`.
    pub fn check(&mut self, s: u32, shard: u32, rule: &Rule, now_ms: u64) -> Check {
        let params = rule.params;
        // While the shard's breaker refuses, the fallback decides at once
        // (leased tokens are left unspent).
        if self.refuses(shard, now_ms) {
            self.avoided += 1;
            return self.fallback(s, shard, rule, now_ms);
        }
        let batch = self.batch(params);
        let entry = self.subjects.entry(s).or_default();
        let refused = |e: &Entry, cost| e.denied.is_some_and(|d| d.refuses(cost, now_ms));
        if batch == 1 {
            // A quiet subject: its refusal, else one RL.TAKE.
            if refused(entry, COST) {
                return Check::Memory { admitted: false, top_up: None };
            }
            return match self.admit(shard, now_ms) {
                Some(ticket) => Check::Call { op: Op::Take, purpose: Purpose::Take, ticket },
                None => self.fallback(s, shard, rule, now_ms),
            };
        }
        // The breaker refused nothing above: a top-up may be claimed.
        match entry.lease.spend(COST, batch, now_ms, || true) {
            Spend::Hit { top_up: false } => Check::Memory { admitted: true, top_up: None },
            Spend::Hit { top_up: true } => {
                let want = entry.lease.want(batch);
                // `refill`: an open breaker sends no top-up.
                let top_up = self.admit(shard, now_ms).map(|ticket| (want, ticket));
                if top_up.is_none() {
                    self.entry(s).lease.call_done();
                }
                Check::Memory { admitted: true, top_up }
            }
            Spend::Paced { .. } => Check::Memory { admitted: false, top_up: None },
            Spend::Short { reserved, lead } => {
                let need = COST - reserved;
                if refused(entry, need) {
                    entry.lease.put_back(reserved, now_ms);
                    if lead {
                        entry.lease.call_done();
                    }
                    return Check::Memory { admitted: false, top_up: None };
                }
                let want = if lead { entry.lease.want(batch).max(need) } else { need };
                let Some(ticket) = self.admit(shard, now_ms) else {
                    let entry = self.entry(s);
                    entry.lease.put_back(reserved, now_ms);
                    if lead {
                        entry.lease.call_done();
                    }
                    return self.fallback(s, shard, rule, now_ms);
                };
                Check::Call { op: Op::Lease { want, min: need }, purpose: Purpose::Short { reserved, lead }, ticket }
            }
        }
    }

    fn entry(&mut self, s: u32) -> &mut Entry {
        self.subjects.entry(s).or_default()
    }

    /// Redis (or a relay) answered `op`, sent for `purpose`, with `reply`:
    /// whether the request is admitted (a top-up has no request).
    pub fn answered(
        &mut self,
        s: u32,
        params: &[BucketParams],
        op: Op,
        purpose: Purpose,
        reply: Reply,
        now_ms: u64,
    ) -> bool {
        let (batch, gateways, ttl) = (self.batch(params), self.gateways, self.ttl_ms);
        let entry = self.subjects.entry(s).or_default();
        let pace = |granted| pace_ms(params, granted, batch, gateways);
        match (op, purpose) {
            (Op::Take, _) => {
                let hold = params.get(reply.binding).map_or(0, |r| share_ms(r, COST, gateways));
                if reply.granted == 0 {
                    let retry = u64::try_from(reply.retry_after_ms).unwrap_or(0);
                    entry.denied = Denial::new(COST, retry, hold, now_ms);
                }
                reply.granted > 0
            }
            (Op::Lease { want, .. }, Purpose::TopUp) => {
                entry.lease.call_done();
                entry.lease.answered(want, reply.granted, pace(reply.granted), now_ms);
                entry.lease.add(reply.granted, now_ms, ttl);
                false
            }
            (Op::Lease { want, min: need }, Purpose::Short { reserved, lead }) => {
                if lead {
                    entry.lease.call_done();
                    entry.lease.answered(want, reply.granted, pace(reply.granted), now_ms);
                }
                if reply.granted >= need {
                    if lead {
                        entry.lease.add(reply.granted - need, now_ms, ttl);
                    }
                    return true;
                }
                entry.lease.put_back(reserved + reply.granted, now_ms);
                let retry = u64::try_from(reply.retry_after_ms).unwrap_or(0);
                entry.denied = Denial::new(need, retry, 0, now_ms);
                false
            }
            (Op::Lease { .. }, Purpose::Take) => unreachable!("a quiet subject's call is an RL.TAKE"),
        }
    }

    /// Unexpired leased tokens per subject at `now_ms`.
    pub fn held(&self, now_ms: u64) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.subjects.iter().map(move |(s, e)| (*s, e.lease.held(now_ms)))
    }

    /// The call failed (a timeout) on `shard`: reserved tokens go back,
    /// the lease call may go again, the breaker counts it; a request is
    /// then the fallback's: whether it is admitted and whether the local
    /// bucket decided it (not the subject's refusal); `None` for a top-up.
    pub fn failed(
        &mut self,
        s: u32,
        shard: u32,
        rule: &Rule,
        purpose: Purpose,
        ticket: Ticket,
        now_ms: u64,
    ) -> Option<(bool, bool)> {
        self.report(shard, ticket, false, now_ms);
        let entry = self.entry(s);
        match purpose {
            Purpose::Take => {}
            Purpose::TopUp => {
                entry.lease.call_done();
                return None;
            }
            Purpose::Short { reserved, lead } => {
                entry.lease.put_back(reserved, now_ms);
                if lead {
                    entry.lease.call_done();
                }
            }
        }
        Some(self.degraded(s, shard, rule, now_ms))
    }
}
