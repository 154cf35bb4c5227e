//! A busy subject's group: spend from its lease, top it up in the
//! background at half empty, and ask Redis when it runs short, at most one
//! RL.LEASE per subject under way. The lease state and its locks are
//! `lease.rs`.
//!
//! In a fleet a contended bucket is paced: a request the lease cannot pay
//! is refused from memory until this gateway's share of the rate has
//! refilled what it last got. A gateway alone is never paced: such a
//! request asks Redis (Redis may hold refill nobody took) unless the deny
//! cache holds Redis's refusal (until the module's retry time), so it
//! admits what Redis alone admits.

use std::sync::Arc;

use rl_client::internal::{lock, millis};
use rl_client::{Decision, Source};
use rl_core::lease::{batch, pace_ms};
use rl_core::{BucketOp, BucketParams};

use super::evaluate::{mapped, Evaluation};
use super::Limiter;
use crate::lease::{spend_with, Lease, LeaseCall, Reserved, Spend};
use crate::metrics::Event;
use crate::policy::Group;
use crate::subject::{Subject, SubjectKey};

/// A group's lease call, owned, for a background top-up to carry.
struct Refill {
    key: SubjectKey,
    keys: Vec<String>,
    params: Vec<BucketParams>,
    /// Group index -> policy rule index.
    rules: Vec<usize>,
    policy: Arc<str>,
}

impl Refill {
    fn new(t: &Evaluation) -> Refill {
        Refill {
            key: t.key().owned(),
            keys: t.keys(),
            params: t.group.params.clone(),
            rules: t.group.rules.clone(),
            policy: t.policy.prefix_arc(),
        }
    }
}

impl Limiter {
    /// The tokens one RL.LEASE asks for in `group`; 1 is a quiet subject,
    /// asked call by call. Windows are never leased: RL.LEASE takes tokens
    /// from buckets only.
    pub(super) fn batch(&self, group: &Group, gateways: u32) -> u64 {
        match group.window {
            Some(_) => 1,
            None => batch(&group.params, millis(self.inner.config().lease_window), gateways),
        }
    }

    /// A busy subject: spend from the lease, top it up in the background at
    /// half empty, and lease synchronously only when it runs short.
    pub(super) async fn leased(
        &self,
        t: Evaluation<'_>,
        cost: u64,
        batch: u64,
        now: u64,
        shard_down: &mut bool,
    ) -> Decision {
        let i = &self.inner;
        let key = t.key();
        let entry = i.lease(&key);
        // While the shard's breaker refuses, a top-up or a lease call would
        // be refused: none is claimed.
        let may_call = || !i.breaker_refuses(t.subject, now);
        let in_fleet = i.gateways() > 1;
        let (reserved, lease) = match spend_with(&entry, cost, batch, now, in_fleet, may_call) {
            Spend::Hit { decision, refill } => {
                i.record(Event::LeaseHit, t.prefix(), None);
                if let Some(call) = refill {
                    let want = lock(&entry).want(batch);
                    self.refill(Refill::new(&t), call, want, batch);
                }
                return decision;
            }
            Spend::Paced => {
                i.record(Event::PacingRefusal, t.prefix(), None);
                return lock(&entry).paced_refusal(now);
            }
            Spend::Short { reserved, lease } => (reserved, lease),
        };
        // Given back if this request is dropped while it waits.
        let reserved = Reserved::new(&entry, reserved, &i.config().connection.clock);
        // Leased tokens are already paid for; only a short lease checks the
        // deny cache.
        let need = cost - reserved.tokens();
        if let Some(((), d)) = self.remembered_refusal([((), t, need)], now) {
            reserved.put_back(0, now);
            return d;
        }
        let Some(admitted) = self.admit(t.subject, now, shard_down) else {
            reserved.put_back(0, now);
            return self.degraded(&t, cost, now);
        };
        // The one lease call under way asks for a batch (two while
        // contended); requests that come while it is on its way ask for what
        // they lack, nothing more.
        let want = if lease.is_some() { lock(&entry).want(batch).max(need) } else { need };
        let keys = t.keys();
        // Boxed: a call's future is kilobytes, and held inline it would make
        // every check's future as big, moved on every check, even one
        // answered from memory.
        let call = Box::pin(i.client().grant(BucketOp::Lease { want, min: need }, &keys, &t.group.params));
        let answer = self.guarded(t.prefix(), admitted, call).await;
        let (after, ttl) = (i.now_ms(), millis(i.config().lease_ttl));
        let pace = |granted| pace_ms(&t.group.params, granted, batch, i.gateways());
        match answer {
            Ok(g) if g.tokens >= need => {
                reserved.spent();
                let standing = t.mapped(g.decision);
                let update = |l: &mut Lease| {
                    l.answered(want, g.tokens, pace(g.tokens), after);
                    l.add(g.tokens - need, &standing, after, ttl);
                    Decision { source: Source::Redis, ..l.estimate(after) }
                };
                lease.and_then(|lease| lease.done(update)).unwrap_or(standing)
            }
            Ok(g) => {
                // RL.LEASE grants nothing below MIN; should it ever, keep what came.
                reserved.put_back(g.tokens, after);
                let d = Decision { allowed: false, remaining: 0, ..t.mapped(g.decision) };
                let refused = |l: &mut Lease| l.refused(&d, after);
                match lease {
                    Some(lease) => {
                        lease.done(|l| {
                            l.answered(want, g.tokens, pace(g.tokens), after);
                            refused(l);
                        });
                    }
                    None => refused(&mut lock(&entry)),
                }
                // Held until the module's retry time.
                i.remember(&key, need, &d, now, 0);
                d
            }
            Err(e) => {
                *shard_down |= e.is_shard_failure();
                reserved.put_back(0, after);
                self.degraded(&t, cost, after)
            }
        }
    }

    /// Tops a lease up off the request path, asking for `want`. `call` is
    /// the subject's one lease call under way: however this task ends (or if
    /// it never runs), dropping it lets the next one go.
    fn refill(&self, r: Refill, call: LeaseCall, want: u64, batch: u64) {
        let this = self.clone();
        self.inner.spawn(async move {
            let i = &this.inner;
            let now = i.now_ms();
            // An open breaker: spend what is left; the request path and its
            // fallback take over.
            let Some(admitted) = i.admit_call(&r.key.2, now) else { return };
            let grant = i.client().grant(BucketOp::Lease { want, min: 1 }, &r.keys, &r.params);
            // Spend what is left on an error; the request path and its
            // fallback take over.
            if let Ok(g) = this.guarded(&r.policy, admitted, grant).await {
                let (now, ttl) = (i.now_ms(), millis(i.config().lease_ttl));
                let pace = pace_ms(&r.params, g.tokens, batch, i.gateways());
                let standing = mapped(&r.rules, g.decision);
                // Empty: requests spend what is left, then (in a fleet) are
                // paced; alone they ask Redis.
                call.done(|l| {
                    l.answered(want, g.tokens, pace, now);
                    if g.tokens == 0 {
                        l.refused(&Decision { allowed: false, remaining: 0, ..standing }, now);
                    }
                    l.add(g.tokens, &standing, now, ttl);
                });
            }
        });
    }
}
