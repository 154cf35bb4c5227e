//! A gateway's decisions as rl-client's `Limiter` makes them for a subject
//! of one bucket rule, with cost 1: rl-core's lease (`rl_core::lease`, the
//! state client/src/lease.rs keeps under its lock) and rl-core's refusal
//! (`rl_core::deny`, what client/src/deny_cache.rs keeps), driven in the
//! order the limiter drives them (client/src/limiter.rs `evaluate_groups`,
//! `evaluate`; client/src/lease.rs `leased`, `refill`). Its locks, its
//! calls and its replies are left out; so are its breaker and its local
//! fallback (a failed call is counted as decided by the fallback).

use std::collections::HashMap;

use rl_core::deny::Denial;
use rl_core::lease::{batch, pace_ms, share_ms, Lease, Spend};
use rl_core::{BucketParams, Reply};

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
    /// a lease call of that many tokens goes in the background.
    Memory { admitted: bool, top_up: Option<u64> },
    /// Redis decides: send `op`.
    Call { op: Op, purpose: Purpose },
}

#[derive(Default)]
struct Entry {
    lease: Lease,
    denied: Option<Denial>,
}

/// One gateway's leases and refusals.
pub struct Gateway {
    /// Fleet size (the client's `gateways`), lease window and ttl (ms).
    gateways: u32,
    window_ms: u64,
    ttl_ms: u64,
    subjects: HashMap<u32, Entry>,
}

const COST: u64 = 1;

impl Gateway {
    pub fn new(gateways: u32, window_ms: u64, ttl_ms: u64) -> Gateway {
        Gateway { gateways, window_ms, ttl_ms, subjects: HashMap::new() }
    }

    fn batch(&self, params: &[BucketParams]) -> u64 {
        batch(params, self.window_ms, self.gateways)
    }

    /// A request for subject `s` at `now_ms`.
    pub fn check(&mut self, s: u32, params: &[BucketParams], now_ms: u64) -> Check {
        let batch = self.batch(params);
        let entry = self.subjects.entry(s).or_default();
        let refused = |e: &Entry, cost| e.denied.is_some_and(|d| d.refuses(cost, now_ms));
        if batch == 1 {
            // A quiet subject: its refusal, else one RL.TAKE.
            if refused(entry, COST) {
                return Check::Memory { admitted: false, top_up: None };
            }
            return Check::Call { op: Op::Take, purpose: Purpose::Take };
        }
        match entry.lease.spend(COST, batch, now_ms, || true) {
            Spend::Hit { top_up } => Check::Memory { admitted: true, top_up: top_up.then(|| entry.lease.want(batch)) },
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
                Check::Call { op: Op::Lease { want, min: need }, purpose: Purpose::Short { reserved, lead } }
            }
        }
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

    /// The call failed (a timeout): reserved tokens go back, the lease call
    /// may go again; the request is the fallback's.
    pub fn failed(&mut self, s: u32, purpose: Purpose, now_ms: u64) {
        let Some(entry) = self.subjects.get_mut(&s) else { return };
        match purpose {
            Purpose::Take => {}
            Purpose::TopUp => entry.lease.call_done(),
            Purpose::Short { reserved, lead } => {
                entry.lease.put_back(reserved, now_ms);
                if lead {
                    entry.lease.call_done();
                }
            }
        }
    }
}
