//! In-flight limits on the request path: [`Limiter::acquire`] takes a slot
//! in every rule of an [`InflightPolicy`] and returns a [`Permit`] that
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

use rl_core::inflight::InflightParams;
use rl_core::limits::MAX_KEYS;

use crate::clock::Clock;
use crate::decision::Source;
use crate::error::{Error, Result};
use crate::inflight::{check_cost, inflight_params, new_id};
use crate::limiter::Limiter;
use crate::local_inflight::{local_share, LocalInflight};
use crate::metrics::Event;
use crate::policy::{check_name, FailMode};
use crate::subject::validate_subject;

/// One in-flight limit of an [`InflightPolicy`]: at most `limit` requests
/// of a subject at once, each holding its slot at most `timeout`.
///
/// ```
/// use std::time::Duration;
/// use rl_client::InflightRule;
///
/// // 20 at once per customer; a slot not released heals after 30 s.
/// let per_customer = InflightRule::new("concurrent", 20, Duration::from_secs(30));
/// // NoPermit with 503 rather than 429, and refused while Redis is down.
/// let exports = InflightRule::new("exports", 2, Duration::from_secs(600)).unavailable().fail_closed();
/// # let _ = (per_customer, exports);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InflightRule {
    name: String,
    limit: u64,
    timeout: Duration,
    fail: FailMode,
    /// A refusal means the service is saturated, not that the client asks too much.
    unavailable: bool,
}

impl InflightRule {
    /// At most `limit` in flight (1 to 100,000; the server refuses one above
    /// its `max-inflight-limit`, 10,000 unless configured), each slot held
    /// at most `timeout` (whole ms): pick it above the endpoint's p99.9.
    pub fn new(name: impl Into<String>, limit: u64, timeout: Duration) -> InflightRule {
        InflightRule { name: name.into(), limit, timeout, fail: FailMode::Open, unavailable: false }
    }

    /// Refuse while Redis cannot answer, instead of limiting locally.
    pub fn fail_closed(mut self) -> InflightRule {
        self.fail = FailMode::Closed;
        self
    }

    /// A refusal by this rule says the service is saturated, not that the
    /// client asks too much: over HTTP, `503 Service Unavailable` rather
    /// than `429 Too Many Requests`.
    pub fn unavailable(mut self) -> InflightRule {
        self.unavailable = true;
        self
    }

    /// The rule's name: the last part of its key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Most requests in flight.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How long a slot is held at most.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What the rule does while Redis cannot answer.
    pub fn fail_mode(&self) -> FailMode {
        self.fail
    }

    /// Whether a refusal by this rule says the service is saturated
    /// ([`InflightRule::unavailable`]).
    pub fn is_unavailable(&self) -> bool {
        self.unavailable
    }
}

/// In-flight rules for one kind of subject, under one key prefix: a
/// subject's keys are `prefix:{subject}:rule` (one cluster slot), and one
/// acquire takes a slot in every rule or in none.
///
/// ```
/// use std::time::Duration;
/// use rl_client::{InflightPolicy, InflightRule};
///
/// let policy = InflightPolicy::builder("slow")
///     .rule(InflightRule::new("concurrent", 20, Duration::from_secs(30)))
///     .build()?;
/// assert_eq!(policy.keys("user42")?, ["slow:{user42}:concurrent"]);
/// let err = InflightPolicy::builder("slow").rule(InflightRule::new("c", 0, Duration::from_secs(1))).build();
/// assert!(err.unwrap_err().to_string().contains("rule 'c': limit must be"));
/// # Ok::<(), rl_client::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct InflightPolicy {
    prefix: Arc<str>,
    rules: Vec<InflightRule>,
    params: Vec<InflightParams>,
    /// The shortest timeout: when a permit's slots start to go.
    timeout_ms: u64,
    /// Shared by clones: the outage fallback's local slots.
    local: Arc<LocalInflight>,
}

/// Collects rules for [`InflightPolicy::builder`].
#[derive(Clone, Debug)]
pub struct InflightPolicyBuilder {
    prefix: String,
    rules: Vec<InflightRule>,
}

impl InflightPolicyBuilder {
    /// Adds a rule; checked by [`InflightPolicyBuilder::build`].
    pub fn rule(mut self, rule: InflightRule) -> InflightPolicyBuilder {
        self.rules.push(rule);
        self
    }

    /// Checks every rule and returns the policy, or an error naming the
    /// rule and the value at fault.
    pub fn build(self) -> Result<InflightPolicy> {
        let prefix = self.prefix;
        if prefix.is_empty() || prefix.contains(['{', '}']) || prefix.bytes().any(|b| b.is_ascii_control()) {
            return Err(Error::invalid(format!(
                "in-flight policy prefix must be non-empty, without '{{', '}}' or control characters, got {prefix:?}"
            )));
        }
        if self.rules.is_empty() || self.rules.len() > MAX_KEYS {
            return Err(Error::invalid(format!(
                "in-flight policy '{prefix}' needs 1 to {MAX_KEYS} rules, got {}",
                self.rules.len()
            )));
        }
        let mut params = Vec::with_capacity(self.rules.len());
        for (i, rule) in self.rules.iter().enumerate() {
            let name = &rule.name;
            check_name(name).map_err(|why| Error::invalid(format!("rule {}: name {why}", i + 1)))?;
            if self.rules[..i].iter().any(|r| &r.name == name) {
                return Err(Error::invalid(format!("in-flight policy '{prefix}' names rule '{name}' twice")));
            }
            params.push(
                inflight_params(rule.limit, rule.timeout)
                    .map_err(|why| Error::invalid(format!("rule '{name}': {why}")))?,
            );
        }
        Ok(InflightPolicy {
            timeout_ms: params.iter().map(|p| p.timeout_ms()).min().unwrap_or(1),
            prefix: prefix.into(),
            rules: self.rules,
            params,
            local: Arc::default(),
        })
    }
}

impl InflightPolicy {
    /// Starts a policy whose keys begin with `prefix`.
    pub fn builder(prefix: impl Into<String>) -> InflightPolicyBuilder {
        InflightPolicyBuilder { prefix: prefix.into(), rules: Vec::new() }
    }

    /// The key prefix (also the policy's name in metrics and refusals).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The rules in the order they were added.
    pub fn rules(&self) -> &[InflightRule] {
        &self.rules
    }

    /// A rule by index (as in [`NoPermit::rule`]).
    pub fn rule(&self, index: usize) -> Option<&InflightRule> {
        self.rules.get(index)
    }

    /// The key of every rule for `subject`, in rule order.
    pub fn keys(&self, subject: &str) -> Result<Vec<String>> {
        validate_subject(subject)?;
        Ok(self.rules.iter().map(|r| format!("{}:{{{subject}}}:{}", self.prefix, r.name)).collect())
    }

    fn fail_closed(&self) -> Option<usize> {
        self.rules.iter().position(|r| r.fail == FailMode::Closed)
    }
}

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
    /// use rl_client::{Config, InflightPolicy, InflightRule, Limiter};
    ///
    /// # async fn run() -> Result<(), rl_client::Error> {
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
        check_cost(cost)?;
        let keys = policy.keys(subject)?;
        let i = &self.inner;
        // Read before sending: the server's deadline comes later.
        let now = i.now_ms();
        let clock = i.config.clock.clone();
        let Some(admitted) = i.shards.admit(subject, now) else {
            return Ok(self.inflight_degraded(policy, subject, cost));
        };
        let pending = Pending { limiter: self.clone(), keys, id: new_id(), prefix: policy.prefix.clone(), armed: true };
        let call = i.client.inflight_call(true, &pending.keys, &policy.params, Some(&pending.id), cost);
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
            deadline_ms: now + policy.timeout_ms,
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
                limit: policy.rules[rule].limit,
                retry_after: Some(i.config.breaker_open_for),
                source: Source::FailClosed,
            });
        }
        let (slack, gateways) = (i.config.fallback_slack, i.gateways());
        let shares: Vec<u64> = policy.rules.iter().map(|r| local_share(r.limit, slack, gateways)).collect();
        let now = i.now_ms();
        match policy.local.acquire(subject, &shares, policy.timeout_ms, cost, now) {
            Ok((token, in_flight, rule)) => {
                i.record(Event::Allowed, policy.prefix(), None);
                Ok(Permit {
                    hold: Hold::Local { local: policy.local.clone(), subject: subject.into(), token },
                    rule,
                    in_flight,
                    limit: shares[rule],
                    deadline_ms: now + policy.timeout_ms,
                    clock: i.config.clock.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn err(b: InflightPolicyBuilder) -> String {
        b.build().unwrap_err().to_string()
    }

    #[test]
    fn every_bad_rule_is_named() {
        let s = Duration::from_secs(1);
        let b = || InflightPolicy::builder("p");
        assert!(err(b()).contains("needs 1 to 32 rules, got 0"));
        assert!(err(b().rule(InflightRule::new("a b", 1, s))).contains("rule 1: name may hold only"));
        assert!(err(b().rule(InflightRule::new("c", 0, s))).contains("rule 'c': limit must be an integer from 1"));
        let e = err(b().rule(InflightRule::new("c", 1, Duration::from_micros(10))));
        assert!(e.contains("rule 'c': timeout must be a whole number of milliseconds"), "{e}");
        let e = err(b().rule(InflightRule::new("c", 1, s)).rule(InflightRule::new("c", 2, s)));
        assert!(e.contains("names rule 'c' twice"), "{e}");
        assert!(err(InflightPolicy::builder("a{").rule(InflightRule::new("c", 1, s))).contains("prefix"));
        let p = b().rule(InflightRule::new("c", 1, s)).build().unwrap();
        assert!(p.keys("a}b").unwrap_err().to_string().contains("subject must be"));
    }

    #[test]
    fn the_shortest_timeout_ends_a_permit_and_rules_keep_their_kind_of_refusal() {
        let p = InflightPolicy::builder("p")
            .rule(InflightRule::new("long", 5, Duration::from_secs(60)))
            .rule(InflightRule::new("short", 5, Duration::from_secs(2)).unavailable().fail_closed())
            .build()
            .unwrap();
        assert_eq!(p.timeout_ms, 2000);
        assert_eq!(p.fail_closed(), Some(1));
        assert!(!p.rule(0).unwrap().is_unavailable());
        assert!(p.rule(1).unwrap().is_unavailable());
    }
}
