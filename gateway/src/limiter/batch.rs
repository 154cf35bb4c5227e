//! Several checks of one request decided together ([`Limiter::check_batch`]):
//! memory first (the deny cache, leases), then what memory cannot decide in
//! one round trip per shard, all or nothing.
//!
//! Each policy keeps its own RL.TAKE (or RL.WINDOW) in the pipeline rather
//! than sharing one RL.TAKE with the others' keys: one command answers only
//! for its binding key, and each policy's headers need its own answer. All
//! or nothing is kept by refunds: when one check is refused, the bucket
//! tokens the others took are given back (RL.REFUND, never above capacity).
//! Between the take and the refund those tokens are missing: under, never
//! over. A window counts a request even when another check refuses it
//! (windows take nothing back): under, never over.

use redis::Cmd;
use rl_client::internal::slot_of;
use rl_client::{Decision, Error, Result};
use rl_core::BucketOp;

use super::evaluate::{took_tokens, Evaluation, Joined};
use super::inner::Admitted;
use super::Limiter;
use crate::policy::{Group, Policy};

/// One check of a request: `cost` tokens of every rule of `policy`, for
/// `subject`.
#[derive(Clone, Copy)]
pub struct Check<'a> {
    /// The policy.
    pub policy: &'a Policy,
    /// The subject, as for [`Limiter::check`].
    pub subject: &'a str,
    /// Tokens the request costs under this policy.
    pub cost: u64,
}

/// A call that goes to Redis: the group evaluated, its breaker's ticket,
/// its command and key count.
struct Call<'a> {
    check: usize,
    t: Evaluation<'a>,
    admitted: Admitted,
    cmd: Result<(Cmd, usize)>,
}

/// Where a pipeline goes: a shard, or (a cluster whose slot map is not
/// known yet) a slot.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Shard(usize),
    Slot(u16),
}

impl Limiter {
    /// Decides every check of one request, all or nothing: one decision per
    /// check, in order, `None` for a check left undecided because another
    /// was refused first from memory (the deny cache, a lease): it was not
    /// charged.
    ///
    /// A refusal the deny cache remembers refuses at once, before anything
    /// is charged; leased groups spend from their leases; the rest go to
    /// Redis in one pipeline per shard, the shards at the same time. When
    /// any check is refused, the bucket tokens the others took (from Redis
    /// or a lease) are refunded. Errors are bad input only, as for
    /// [`Limiter::check_cost`]. On the Lua backend without a relay (its
    /// scripts cannot be reloaded inside a pipeline) the checks are made in
    /// turn, with the same refunds.
    pub async fn check_batch<'a>(&self, checks: &[Check<'a>]) -> Result<Vec<Option<Decision>>> {
        // One check is a check: its future inline, the rest boxed, so the
        // common case carries no larger state than `check_cost` does.
        match checks {
            [] => return Ok(Vec::new()),
            [c] => return Ok(vec![Some(self.check_cost(c.policy, c.subject, c.cost).await?)]),
            _ => {}
        }
        Box::pin(self.check_together(checks)).await
    }

    /// [`Limiter::check_batch`] for two checks or more. Its state (leases,
    /// pipelines, refunds) is several kilobytes: kept apart, so that a
    /// one-check batch does not carry and move it on every request.
    async fn check_together<'a>(&self, checks: &[Check<'a>]) -> Result<Vec<Option<Decision>>> {
        for c in checks {
            self.validate_input(c.policy, c.subject, BucketOp::Take { cost: c.cost })?;
        }
        if !self.inner.client().pipelines() {
            return self.check_in_turn(checks).await;
        }
        let i = &self.inner;
        let now = i.now_ms();
        i.refresh_topology(now);
        let gateways = i.gateways();
        let mut out = vec![None; checks.len()];
        let evaluation =
            |c: &Check<'a>, group| Evaluation { policy: c.policy, group, shadow: false, subject: c.subject };

        // A refusal remembered for any unleased group: nothing is charged.
        let quiet = checks.iter().enumerate().flat_map(|(n, c)| {
            let groups = c.policy.enforced.iter().filter(move |g| self.batch(g, gateways) == 1);
            groups.map(move |group| (n, evaluation(c, group), c.cost))
        });
        if let Some((n, d)) = self.remembered_refusal(quiet, now) {
            out[n] = Some(self.finish_check(&checks[n], Some(d), now).await?);
            return Ok(out);
        }

        // Leased groups spend from memory; the others go to Redis.
        let mut outcomes = vec![Joined::default(); checks.len()];
        let mut down = vec![false; checks.len()];
        let mut remote = Vec::new();
        let mut refused = false;
        for (n, c) in checks.iter().enumerate() {
            for group in &c.policy.enforced {
                let batch = self.batch(group, gateways);
                if batch == 1 {
                    remote.push((n, group));
                    continue;
                }
                if refused {
                    continue;
                }
                let d = self.leased(evaluation(c, group), c.cost, batch, now, &mut down[n]).await;
                outcomes[n].add(d);
                refused |= !d.allowed;
            }
        }
        if !refused {
            Box::pin(self.pipelined(checks, remote, now, &mut outcomes, &mut down)).await;
        }

        // All or nothing: a refusal gives back what the others took.
        if outcomes.iter().filter_map(Joined::decision).any(|d| !d.allowed) {
            let charged = checks.iter().zip(&outcomes).filter(|(c, o)| o.charged() && !c.policy.buckets.is_empty());
            for (c, _) in charged {
                let _ = self.refund(c.policy, c.subject, c.cost).await;
            }
        }
        for (n, c) in checks.iter().enumerate() {
            // A check whose groups were never asked (a lease refused first)
            // is left undecided; a policy of shadow rules only still reports.
            let decided = outcomes[n].decision();
            if decided.is_some() || c.policy.enforced.is_empty() {
                out[n] = Some(self.finish_check(c, decided, now).await?);
            }
        }
        Ok(out)
    }

    /// Asks Redis for `remote` groups: one pipeline per shard, all shards at
    /// once; a shard whose breaker is open, or whose call fails, is
    /// answered by the fallback.
    async fn pipelined<'a>(
        &self,
        checks: &[Check<'a>],
        remote: Vec<(usize, &'a Group)>,
        now: u64,
        outcomes: &mut [Joined],
        down: &mut [bool],
    ) {
        let i = &self.inner;
        let mut routes: Vec<(Route, Vec<Call<'a>>)> = Vec::new();
        for (n, group) in remote {
            let c = &checks[n];
            let t = Evaluation { policy: c.policy, group, shadow: false, subject: c.subject };
            let Some(admitted) = self.admit(c.subject, now, &mut down[n]) else {
                outcomes[n].add(self.degraded(&t, c.cost, now));
                continue;
            };
            let keys = t.keys();
            let cmd = i.client().take_command(group.window, &keys, &group.params, c.cost).map(|cmd| (cmd, keys.len()));
            let route = i.shard_of(c.subject).map_or_else(|| Route::Slot(slot_of(c.subject)), Route::Shard);
            let call = Call { check: n, t, admitted, cmd };
            match routes.iter_mut().find(|(r, _)| *r == route) {
                Some((_, calls)) => calls.push(call),
                None => routes.push((route, vec![call])),
            }
        }
        let sent = routes.into_iter().map(|(_, mut calls)| async move {
            let slot = slot_of(calls[0].t.subject);
            // Each command moves into the pipeline; the call keeps whether it had one.
            let cmds: Vec<(Cmd, usize)> = calls
                .iter_mut()
                .filter_map(|c| c.cmd.as_mut().ok().map(|(cmd, n)| (std::mem::take(cmd), *n)))
                .collect();
            let replies = if cmds.is_empty() { Ok(Vec::new()) } else { i.client().pipeline(cmds, slot).await };
            (calls, replies)
        });
        for (calls, replies) in futures_util::future::join_all(sent).await {
            let (answers, failed) = match replies {
                Ok(answers) => (answers, None),
                Err(e) => (Vec::new(), Some(e)),
            };
            let mut answers = answers.into_iter();
            for call in calls {
                let n = call.check;
                let cost = checks[n].cost;
                let own;
                let answer: std::result::Result<Decision, &Error> = match (&call.cmd, &failed) {
                    (Err(e), _) | (Ok(_), Some(e)) => Err(e),
                    (Ok(_), None) => {
                        own = answers.next().unwrap_or_else(|| Err(Error::Reply("a pipeline reply is missing".into())));
                        own.as_ref().copied()
                    }
                };
                self.report(call.t.prefix(), call.admitted, answer.err());
                let d = self.answered(&call.t, cost, now, answer.map_err(Error::is_shard_failure), &mut down[n]);
                outcomes[n].add(d);
            }
        }
    }

    /// One check's decision, with its shadow groups (evaluated on calls of
    /// their own), counted.
    async fn finish_check(&self, c: &Check<'_>, enforced: Option<Decision>, now: u64) -> Result<Decision> {
        let shadow = if c.policy.shadow.is_empty() {
            None
        } else {
            Box::pin(self.evaluate_groups(c.policy, &c.policy.shadow, true, c.subject, c.cost, now)).await
        };
        self.finish(c.policy, enforced, shadow)
    }

    /// The checks in turn, stopping at the first refusal and refunding the
    /// bucket tokens the ones before it took.
    async fn check_in_turn(&self, checks: &[Check<'_>]) -> Result<Vec<Option<Decision>>> {
        let mut out = vec![None; checks.len()];
        for (n, c) in checks.iter().enumerate() {
            let d = self.check_cost(c.policy, c.subject, c.cost).await?;
            out[n] = Some(d);
            if !d.allowed {
                for (before, d) in checks[..n].iter().zip(&out) {
                    // A fallback decision took nothing from Redis.
                    let charged = d.as_ref().is_some_and(took_tokens);
                    if charged && !before.policy.buckets.is_empty() {
                        let _ = self.refund(before.policy, before.subject, before.cost).await;
                    }
                }
                break;
            }
        }
        Ok(out)
    }
}
