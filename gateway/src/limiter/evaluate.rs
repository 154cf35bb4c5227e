//! The one evaluation path: a check's groups (its buckets, then its windows
//! of each mode) decided in order. A refusal the deny cache remembers for
//! any of them refuses first, before anything is charged or sent; then each
//! group is decided from its lease or by Redis; the first refusal decides,
//! and allowed groups combine (the binding rule is the one with the fewest
//! tokens left). Single checks and shadow rules run it as it is; a batch
//! runs its steps across several checks (`batch.rs`); while the shard's
//! breaker refuses, every group goes to the fallback at once.

use rl_client::{Decision, Source};
use rl_core::BucketOp;

use super::Limiter;
use crate::metrics::Event;
use crate::policy::{Group, Policy, GROUP_KINDS};
use crate::subject::SubjectRef;

/// The evaluation of one group of a policy's rules for one subject,
/// borrowed from the request: all a decision from memory needs. Nothing is
/// allocated for it: the keys are built only for a call to Redis, and a
/// lease's owned refill only for a background top-up.
#[derive(Clone, Copy)]
pub(super) struct Evaluation<'a> {
    pub(super) policy: &'a Policy,
    pub(super) group: &'a Group,
    pub(super) shadow: bool,
    pub(super) subject: &'a str,
}

impl<'a> Evaluation<'a> {
    /// Its key in the local maps (leases, deny cache, fallback).
    pub(super) fn key(&self) -> SubjectRef<'a> {
        SubjectRef(self.group.id, self.shadow, self.subject)
    }

    /// The group's bucket or window keys, for a call to Redis.
    pub(super) fn keys(&self) -> Vec<String> {
        self.policy.group_keys(self.group, self.subject)
    }

    pub(super) fn prefix(&self) -> &'a str {
        self.policy.prefix()
    }

    /// `d` with its binding index turned from the group's into the policy's.
    pub(super) fn mapped(&self, d: Decision) -> Decision {
        mapped(&self.group.rules, d)
    }
}

/// `d` with its binding index turned from a group's (`rules`: group index
/// -> policy rule index) into the policy's.
pub(super) fn mapped(rules: &[usize], d: Decision) -> Decision {
    Decision { rule: rules.get(d.rule).copied().unwrap_or(d.rule), ..d }
}

/// Whether an allowed decision took tokens that a refusal elsewhere in the
/// request must give back: Redis's or a lease's (the fallback took nothing
/// from Redis).
pub(super) fn took_tokens(d: &Decision) -> bool {
    d.allowed && matches!(d.source, Source::Redis | Source::Lease)
}

/// A check's groups' decisions joined: the first refusal decides; allowed
/// ones combine, the binding rule the one with the fewest tokens left.
#[derive(Clone, Copy, Default)]
pub(super) struct Joined {
    decision: Option<Decision>,
    /// Whether a group took tokens (see [`took_tokens`]).
    charged: bool,
}

impl Joined {
    /// Adds one group's decision; whether the check is still allowed.
    pub(super) fn add(&mut self, d: Decision) -> bool {
        self.charged |= took_tokens(&d);
        self.decision = Some(match self.decision {
            Some(before) if !before.allowed => before,
            _ if !d.allowed => d,
            Some(a) => {
                let tighter = if d.remaining < a.remaining { d } else { a };
                Decision { reset_after: a.reset_after.max(d.reset_after), ..tighter }
            }
            None => d,
        });
        self.decision.is_some_and(|d| d.allowed)
    }

    /// The check's decision; `None` when no group was decided.
    pub(super) fn decision(&self) -> Option<Decision> {
        self.decision
    }

    /// Whether any of its groups took tokens.
    pub(super) fn charged(&self) -> bool {
        self.charged
    }
}

impl Limiter {
    /// The first refusal the deny cache remembers among `evaluations` (each
    /// tagged, with its cost), counted: the request is refused before
    /// anything is charged or sent.
    pub(super) fn remembered_refusal<'a, T>(
        &self,
        evaluations: impl IntoIterator<Item = (T, Evaluation<'a>, u64)>,
        now: u64,
    ) -> Option<(T, Decision)> {
        for (tag, t, cost) in evaluations {
            if let Some(d) = self.inner.remembered(&t.key(), cost, now) {
                self.inner.record(Event::DenyCacheHit, t.prefix(), None);
                return Some((tag, d));
            }
        }
        None
    }

    /// Evaluates `groups` in order and stops at the first refusal: none of
    /// the groups after it counts the request. `None` when there are none.
    ///
    /// A refusal remembered for any group (the deny cache) refuses at once,
    /// before any group is asked: a subject refused by its quota does not
    /// pay an RL.TAKE, and spend bucket tokens, on every request. A leased
    /// group looks at its entry only when its lease runs short: the tokens
    /// it holds are paid for. And once a call fails on the shard, the
    /// groups after it (the same subject, so the same slot) are answered by
    /// the fallback without asking: a check waits at most one timeout,
    /// however many groups it has.
    pub(super) async fn evaluate_groups(
        &self,
        policy: &Policy,
        groups: &[Group],
        shadow: bool,
        subject: &str,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        let evaluation = |group| Evaluation { policy, group, shadow, subject };
        if self.inner.breaker_refuses(subject, now) {
            return self.outage_groups(groups, evaluation, cost, now);
        }
        // A policy has at most one group of each kind of call.
        let gateways = self.inner.gateways();
        let batch = |k| groups.get(k).map_or(1, |g| self.batch(g, gateways));
        let batches: [u64; GROUP_KINDS] = std::array::from_fn(batch);
        let quiet = groups.iter().zip(batches).filter(|(_, batch)| *batch == 1);
        if let Some(((), d)) = self.remembered_refusal(quiet.map(|(g, _)| ((), evaluation(g), cost)), now) {
            return Some(d);
        }
        let mut shard_down = false;
        let mut outcome = Joined::default();
        // The buckets' evaluation, when their tokens were taken: a window
        // refusing after them gives them back (a refused request takes
        // nothing).
        let mut buckets_took = None;
        for (group, batch) in groups.iter().zip(batches) {
            let t = evaluation(group);
            let d = if batch > 1 {
                self.leased(t, cost, batch, now, &mut shard_down).await
            } else {
                self.asked(t, cost, now, &mut shard_down).await
            };
            if !outcome.add(d) {
                if let Some(buckets) = buckets_took.filter(|_| !shard_down) {
                    self.adjust_group(buckets, BucketOp::Refund { tokens: cost }).await;
                }
                break;
            }
            if group.window.is_none() && took_tokens(&d) {
                buckets_took = Some(t);
            }
        }
        outcome.decision()
    }

    /// [`Limiter::evaluate_groups`] while the shard's breaker refuses: every
    /// group goes to the fallback at once, one entry (which keeps the
    /// subject's refusal) and one lock each; leased tokens are left unspent
    /// (under, never over). Only fail-closed groups ask the deny cache
    /// first. Nothing to await.
    pub(super) fn outage_groups<'a>(
        &self,
        groups: &'a [Group],
        evaluation: impl Fn(&'a Group) -> Evaluation<'a>,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        let closed = groups.iter().filter(|g| g.fail_closed.is_some());
        if let Some(((), d)) = self.remembered_refusal(closed.map(|g| ((), evaluation(g), cost)), now) {
            return Some(d);
        }
        let mut outcome = Joined::default();
        for group in groups {
            if !outcome.add(self.degraded(&evaluation(group), cost, now)) {
                break;
            }
        }
        outcome.decision()
    }

    /// A quiet subject's group: the request asks Redis (its deny-cache
    /// entry was looked at first), unless the shard already failed this
    /// check or its breaker is open.
    async fn asked(&self, t: Evaluation<'_>, cost: u64, now: u64, shard_down: &mut bool) -> Decision {
        let Some(admitted) = self.admit(t.subject, now, shard_down) else {
            return self.degraded(&t, cost, now);
        };
        let (keys, params) = (t.keys(), &t.group.params);
        let client = self.inner.client();
        // Boxed: a call's future is kilobytes, and held inline it would make
        // every check's future as big, moved on every check, even one
        // answered from memory.
        let answer = match t.group.window {
            None => {
                let call = Box::pin(client.run(BucketOp::Take { cost }, &keys, params));
                self.guarded(t.prefix(), admitted, call).await
            }
            Some(mode) => {
                let call = Box::pin(client.run_windows(mode, &keys, params, cost));
                self.guarded(t.prefix(), admitted, call).await
            }
        };
        self.answered(&t, cost, now, answer.as_ref().map_err(|e| e.is_shard_failure()).copied(), shard_down)
    }

    /// The decision for Redis's answer to `t` (a refusal is remembered in
    /// the deny cache), or the fallback's when the call failed (`Err`:
    /// whether the shard failed).
    pub(super) fn answered(
        &self,
        t: &Evaluation,
        cost: u64,
        now: u64,
        answer: std::result::Result<Decision, bool>,
        shard_down: &mut bool,
    ) -> Decision {
        let i = &self.inner;
        match answer {
            Ok(d) => {
                // Held at least this gateway's share of the refill of `cost`:
                // asking sooner, a subject pressing its limit from every
                // gateway would cost a call per gateway per retry time.
                let hold = t.group.params.get(d.rule).map_or(0, |r| rl_core::lease::share_ms(r, cost, i.gateways()));
                let d = t.mapped(d);
                i.remember(&t.key(), cost, &d, now, hold);
                d
            }
            Err(shard_failure) => {
                *shard_down |= shard_failure;
                self.degraded(t, cost, i.now_ms())
            }
        }
    }
}
