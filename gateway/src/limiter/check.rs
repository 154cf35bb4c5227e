//! A single check (decide and charge one request against a policy), the
//! adjustments made after a response (settle, refund), and what every
//! check validates first.

use std::time::Duration;

use rl_client::{Backend, Decision, Error, Result};
use rl_core::limits::MAX_WINDOW_LIMIT;
use rl_core::BucketOp;

use super::evaluate::Evaluation;
use super::Limiter;
use crate::metrics::Event;
use crate::policy::Policy;
use crate::subject::validate_subject;

impl Limiter {
    /// Decides one request (cost 1) of `subject` against every rule of `policy`.
    pub async fn check(&self, policy: &Policy, subject: &str) -> Result<Decision> {
        self.check_cost(policy, subject, 1).await
    }

    /// Decides a request costing `cost` tokens of every rule.
    ///
    /// Redis failures never surface here: the fallback answers. The only
    /// errors are bad input (an empty subject or one with braces, a cost
    /// out of range, a policy beyond the Lua backend's range).
    pub async fn check_cost(&self, policy: &Policy, subject: &str, cost: u64) -> Result<Decision> {
        self.validate_input(policy, subject, BucketOp::Take { cost })?;
        // The clock, read once for the decisions made from memory.
        let now = self.inner.now_ms();
        self.inner.refresh_topology(now);
        let (enforced, shadow) = if self.inner.breaker_refuses(subject, now) {
            // While the shard's breaker refuses, the fallback decides, and
            // nothing is awaited.
            let by = |shadow| move |group| Evaluation { policy, group, shadow, subject };
            let enforced = self.outage_groups(&policy.enforced, by(false), cost, now);
            (enforced, self.outage_groups(&policy.shadow, by(true), cost, now))
        } else if policy.shadow.is_empty() {
            (self.evaluate_groups(policy, &policy.enforced, false, subject, cost, now).await, None)
        } else {
            // Boxed: inline, a second group's future would double the size
            // of every check's future, moved on every check.
            let enforced = self.evaluate_groups(policy, &policy.enforced, false, subject, cost, now);
            let shadow = Box::pin(self.evaluate_groups(policy, &policy.shadow, true, subject, cost, now));
            tokio::join!(enforced, shadow)
        };
        self.finish(policy, enforced, shadow)
    }

    /// The request's decision from its enforced groups' and its shadow
    /// groups' (each `None` when the policy has none), counted.
    // Inlined: it is on every check's path, and a call apart showed in the
    // lease spend's benchmark.
    #[inline]
    pub(super) fn finish(
        &self,
        policy: &Policy,
        enforced: Option<Decision>,
        shadow: Option<Decision>,
    ) -> Result<Decision> {
        let shadow_refused = shadow.filter(|d| !d.allowed).map(|d| d.rule);
        let decision = match (enforced, shadow) {
            (Some(d), _) => Decision { shadow_refused, ..d },
            // Only shadow rules: reported, never enforced.
            (None, Some(s)) => Decision { allowed: true, retry_after: Some(Duration::ZERO), shadow_refused, ..s },
            (None, None) => return Err(Error::invalid("a policy needs at least one rule")),
        };
        let name = |i: usize| policy.rule(i).map(|r| r.name());
        if decision.allowed {
            self.inner.record(Event::Allowed, policy.prefix(), None);
            if let Some(rule) = shadow_refused {
                self.inner.record(Event::ShadowRefused, policy.prefix(), name(rule));
            }
        } else {
            self.inner.record(Event::Refused, policy.prefix(), name(decision.rule));
        }
        Ok(decision)
    }

    /// Which shadow rule of `policy` (an index into its rules) would refuse
    /// this request, evaluating its shadow rules only and recording nothing:
    /// live rules run a shadow rule set beside the enforced one.
    pub async fn shadow_refusal(&self, policy: &Policy, subject: &str, cost: u64) -> Result<Option<usize>> {
        self.validate_input(policy, subject, BucketOp::Take { cost })?;
        let d = self.evaluate_groups(policy, &policy.shadow, true, subject, cost, self.inner.now_ms()).await;
        Ok(d.filter(|d| !d.allowed).map(|d| d.rule))
    }

    /// Takes `extra` more tokens from every rule of the subject, into debt
    /// if need be: for a cost found higher once the response is known
    /// (RL.TAKE ... FORCE). `None` when Redis could not be reached (the
    /// debit is then lost: under-counted, counted as an error).
    pub async fn settle(&self, policy: &Policy, subject: &str, extra: u64) -> Result<Option<Decision>> {
        self.adjust(policy, subject, BucketOp::Force { cost: extra }).await
    }

    /// Gives `tokens` back to every rule of the subject, never above
    /// capacity: for a cost found lower than was taken (RL.REFUND).
    pub async fn refund(&self, policy: &Policy, subject: &str, tokens: u64) -> Result<Option<Decision>> {
        self.adjust(policy, subject, BucketOp::Refund { tokens }).await
    }

    async fn adjust(&self, policy: &Policy, subject: &str, op: BucketOp) -> Result<Option<Decision>> {
        self.validate_input(policy, subject, op)?;
        if policy.buckets.is_empty() {
            return Err(Error::invalid(format!(
                "policy '{}' has only window rules: windows are neither settled nor refunded",
                policy.prefix()
            )));
        }
        Ok(self.adjust_group(Evaluation { policy, group: &policy.buckets, shadow: false, subject }, op).await)
    }

    /// `op` (a refund or a forced take) on a bucket group's keys; `None`
    /// when Redis could not be reached.
    pub(super) async fn adjust_group(&self, t: Evaluation<'_>, op: BucketOp) -> Option<Decision> {
        let admitted = self.inner.admit_call(t.subject, self.inner.now_ms())?;
        let keys = t.keys();
        // Boxed, as a check's call is: held inline, the call's future would
        // make every caller's future as large, a batch's on every request.
        let call = Box::pin(self.inner.client().run(op, &keys, &t.group.params));
        self.guarded(t.prefix(), admitted, call).await.ok().map(|d| t.mapped(d))
    }

    /// Bad input is the caller's error, never a decision.
    pub(super) fn validate_input(&self, policy: &Policy, subject: &str, op: BucketOp) -> Result<()> {
        validate_subject(subject)?;
        op.validate()?;
        let lua = self.inner.client().backend() == Backend::Lua;
        if let Some(beyond) = policy.beyond_lua().filter(|_| lua) {
            return Err(Error::invalid(format!(
                "policy '{}' has a rule the Lua backend cannot count exactly: {beyond}",
                policy.prefix()
            )));
        }
        if policy.has_windows() {
            if let BucketOp::Take { cost } = op {
                if cost > MAX_WINDOW_LIMIT {
                    return Err(Error::invalid(format!(
                        "cost must be at most {MAX_WINDOW_LIMIT} on a policy with window rules, got {cost}"
                    )));
                }
            }
        }
        Ok(())
    }
}
