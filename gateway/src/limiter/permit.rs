//! In-flight permits on the request path: [`Limiter::acquire`] takes a
//! slot in every rule of an [`InflightPolicy`] and returns a [`Permit`] that
//! gives it back when dropped.
//!
//! - Drop releases in the background; a release that fails (Redis down)
//!   is healed by the server at the slot's deadline.
//! - Cancellation-safe: the id is made here before anything is sent, so an
//!   acquire whose future is dropped mid-call, or whose answer is lost
//!   (a timeout), is followed by a release of that id. The release is sent
//!   on the same connection after the acquire, so it cannot overtake it; an
//!   id that never got a slot releases nothing (ids are 128 random bits).
//! - The timeout is part of the rule: past it the server has dropped the
//!   slot. [`Permit::expired`] says so (from the clock read before the
//!   acquire was sent, so it errs towards "expired").
//! - Redis down: fail-closed rules refuse; fail-open ones fall back to a
//!   local limit of this gateway's share (see `local_inflight.rs` and the
//!   crate README for the bound).

use std::sync::Arc;
use std::time::Duration;

use rl_client::internal::{new_id, validate_cost};
use rl_client::{Clock, Result, Source};

use super::Limiter;
use crate::inflight_policy::InflightPolicy;
use crate::local_inflight::{local_share, LocalInflight};
use crate::metrics::Event;

/// Why [`Limiter::acquire`] gave no permit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoPermit {
    /// Index of the binding rule in [`InflightPolicy::rules`].
    pub rule: usize,
    /// Requests in flight in it now.
    pub in_flight: u64,
    /// Its limit (the local share when the fallback refused).
    pub limit: u64,
    /// How long until enough slots reach their deadline (a release may
    /// come sooner); `None`: the cost never fits.
    pub retry_after: Option<Duration>,
    /// Which path refused: Redis, the fallback or a fail-closed rule.
    pub source: Source,
}

/// A slot in every rule of an [`InflightPolicy`], held until the permit is
/// dropped (which releases it in the background) or its timeout passes.
#[derive(Debug)]
pub struct Permit {
    hold: Hold,
    rule: usize,
    in_flight: u64,
    limit: u64,
    deadline_ms: u64,
    clock: Clock,
}

#[derive(Debug)]
enum Hold {
    Redis(Pending),
    Local { local: Arc<LocalInflight>, subject: Box<str>, token: u64 },
    Released,
}

/// An id that may hold slots on Redis: released when dropped while armed.
struct Pending {
    limiter: Limiter,
    keys: Vec<String>,
    id: String,
    prefix: Arc<str>,
    armed: bool,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("keys", &self.keys).field("id", &self.id).finish()
    }
}

impl Pending {
    /// Sends the release now: the answer says how many keys gave a slot back.
    async fn release(mut self) -> Result<u64> {
        self.armed = false;
        self.limiter.client().release(&self.keys, &self.id).await
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (limiter, keys, id, prefix) =
            (self.limiter.clone(), std::mem::take(&mut self.keys), std::mem::take(&mut self.id), self.prefix.clone());
        let inner = limiter.inner.clone();
        inner.spawn(async move {
            // A failed release heals at the deadline.
            if limiter.client().release(&keys, &id).await.is_err() {
                limiter.record(Event::Error, &prefix, None);
            }
        });
    }
}

impl Permit {
    /// Whether the slot's timeout has passed: the server has dropped it (or
    /// will in a moment), so it no longer counts against the limit.
    pub fn expired(&self) -> bool {
        self.clock.now_ms() >= self.deadline_ms
    }

    /// Time left before the slot is gone (zero once expired).
    pub fn remaining(&self) -> Duration {
        Duration::from_millis(self.deadline_ms.saturating_sub(self.clock.now_ms()))
    }

    /// The slot's id on Redis (`None` for a local fallback permit).
    pub fn id(&self) -> Option<&str> {
        match &self.hold {
            Hold::Redis(p) => Some(&p.id),
            _ => None,
        }
    }

    /// Which path granted it: [`Source::Redis`] or [`Source::Fallback`].
    pub fn source(&self) -> Source {
        match self.hold {
            Hold::Local { .. } => Source::Fallback,
            _ => Source::Redis,
        }
    }

    /// Requests in flight in the binding rule once this one was admitted.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The binding rule's limit (its local share on the fallback).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Index of the binding rule: the one with the fewest slots left.
    pub fn rule(&self) -> usize {
        self.rule
    }

    /// Releases now and waits for the answer: whether a slot was given
    /// back (false once expired, or when Redis could not be reached: the
    /// slot then heals at its deadline).
    pub async fn release(mut self) -> bool {
        let now = self.clock.now_ms();
        match std::mem::replace(&mut self.hold, Hold::Released) {
            Hold::Redis(p) => p.release().await.is_ok_and(|n| n > 0),
            Hold::Local { local, subject, token } => local.release(&subject, token, now),
            Hold::Released => false,
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let expired = self.expired();
        let now = self.clock.now_ms();
        match std::mem::replace(&mut self.hold, Hold::Released) {
            // The server dropped it already: no release to send.
            Hold::Redis(mut p) if expired => p.armed = false,
            Hold::Redis(p) => drop(p),
            Hold::Local { local, subject, token } => {
                local.release(&subject, token, now);
            }
            Hold::Released => {}
        }
    }
}

impl Limiter {
    /// Takes a slot of `subject` in every rule of `policy` (cost 1): a
    /// permit, or why not. Redis failures never surface: fail-closed rules
    /// refuse, the others fall back to this gateway's local share. The
    /// only errors are bad input (a subject with braces, empty or too long).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use rl_gateway::{Config, InflightPolicy, InflightRule, Limiter};
    ///
    /// # async fn run() -> Result<(), rl_gateway::Error> {
    /// let limiter = Limiter::new(Config::standalone("redis://127.0.0.1:6379/"))?;
    /// let slow = InflightPolicy::builder("report")
    ///     .rule(InflightRule::new("concurrent", 20, Duration::from_secs(30)))
    ///     .build()?;
    /// match limiter.acquire(&slow, "customer-7").await? {
    ///     Ok(permit) => {
    ///         // ... serve the request; the slot is given back when `permit` drops.
    ///         if permit.expired() {
    ///             println!("took longer than the timeout: the slot was already gone");
    ///         }
    ///     }
    ///     Err(refused) => println!("busy: {} in flight, retry in {:?}", refused.in_flight, refused.retry_after),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, policy: &InflightPolicy, subject: &str) -> Result<Result<Permit, NoPermit>> {
        self.acquire_cost(policy, subject, 1).await
    }

    /// Takes `cost` slots (a request that weighs more) in every rule.
    pub async fn acquire_cost(
        &self,
        policy: &InflightPolicy,
        subject: &str,
        cost: u64,
    ) -> Result<Result<Permit, NoPermit>> {
        validate_cost(cost)?;
        let keys = policy.keys(subject)?;
        let i = &self.inner;
        // Read before sending: the server's deadline comes later.
        let now = i.now_ms();
        let clock = i.config().connection.clock.clone();
        let Some(admitted) = i.admit_call(subject, now) else {
            return Ok(self.inflight_degraded(policy, subject, cost));
        };
        let pending = Pending { limiter: self.clone(), keys, id: new_id(), prefix: policy.prefix_arc(), armed: true };
        let call = i.client().inflight_call(true, &pending.keys, policy.params(), Some(&pending.id), cost);
        let answer = self.guarded(policy.prefix(), admitted, call).await;
        // An error leaves `pending` armed: the acquire may have been carried
        // out, so its id is released when it drops.
        let a = match answer {
            Ok(a) => a,
            Err(_) => return Ok(self.inflight_degraded(policy, subject, cost)),
        };
        let mut pending = pending;
        if !a.allowed {
            pending.armed = false;
            let refused = NoPermit {
                rule: a.rule,
                in_flight: a.in_flight,
                limit: a.limit,
                retry_after: a.retry_after,
                source: Source::Redis,
            };
            i.record(Event::Refused, policy.prefix(), policy.rule(a.rule).map(|r| r.name()));
            return Ok(Err(refused));
        }
        i.record(Event::Allowed, policy.prefix(), None);
        Ok(Ok(Permit {
            hold: Hold::Redis(pending),
            rule: a.rule,
            in_flight: a.in_flight,
            limit: a.limit,
            deadline_ms: now + policy.timeout_ms(),
            clock,
        }))
    }

    /// Redis could not answer: a fail-closed rule refuses; otherwise the
    /// local slots at this gateway's share of every limit decide.
    fn inflight_degraded(&self, policy: &InflightPolicy, subject: &str, cost: u64) -> Result<Permit, NoPermit> {
        let i = &self.inner;
        i.record(Event::Fallback, policy.prefix(), None);
        let refuse = |r: NoPermit| {
            i.record(Event::Refused, policy.prefix(), policy.rule(r.rule).map(|r| r.name()));
            Err(r)
        };
        if let Some(rule) = policy.fail_closed() {
            return refuse(NoPermit {
                rule,
                in_flight: 0,
                limit: policy.rules()[rule].limit(),
                retry_after: Some(i.config().connection.breaker_open_for),
                source: Source::FailClosed,
            });
        }
        let (slack, gateways) = (i.config().fallback_slack, i.gateways());
        let shares: Vec<u64> = policy.rules().iter().map(|r| local_share(r.limit(), slack, gateways)).collect();
        let now = i.now_ms();
        match policy.local().acquire(subject, &shares, policy.timeout_ms(), cost, now) {
            Ok((token, in_flight, rule)) => {
                i.record(Event::Allowed, policy.prefix(), None);
                Ok(Permit {
                    hold: Hold::Local { local: policy.local().clone(), subject: subject.into(), token },
                    rule,
                    in_flight,
                    limit: shares[rule],
                    deadline_ms: now + policy.timeout_ms(),
                    clock: i.config().connection.clock.clone(),
                })
            }
            Err(r) => refuse(NoPermit {
                rule: r.rule,
                in_flight: r.in_flight,
                limit: shares[r.rule],
                retry_after: r.retry_ms.map(Duration::from_millis),
                source: Source::Fallback,
            }),
        }
    }
}
