//! In-flight limits for a kind of subject: [`InflightRule`]s under one key
//! prefix, checked once when the [`InflightPolicy`] is built. The limiter
//! takes a slot in every rule with [`Limiter::acquire`](crate::Limiter::acquire).

use std::sync::Arc;
use std::time::Duration;

use rl_client::internal::inflight_params;
use rl_client::Result;
use rl_core::inflight::InflightParams;

use crate::local_inflight::LocalInflight;
use crate::names::validate_rules;
use crate::policy::FailMode;
use crate::subject::validate_subject;

/// One in-flight limit of an [`InflightPolicy`]: at most `limit` requests
/// of a subject at once, each holding its slot at most `timeout`.
///
/// ```
/// use std::time::Duration;
/// use rl_gateway::InflightRule;
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
/// use rl_gateway::{InflightPolicy, InflightRule};
///
/// let policy = InflightPolicy::builder("slow")
///     .rule(InflightRule::new("concurrent", 20, Duration::from_secs(30)))
///     .build()?;
/// assert_eq!(policy.keys("user42")?, ["slow:{user42}:concurrent"]);
/// let err = InflightPolicy::builder("slow").rule(InflightRule::new("c", 0, Duration::from_secs(1))).build();
/// assert!(err.unwrap_err().to_string().contains("rule 'c': limit must be"));
/// # Ok::<(), rl_gateway::Error>(())
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
        let params = validate_rules("in-flight policy", &prefix, &self.rules, InflightRule::name, |r| {
            inflight_params(r.limit, r.timeout)
        })?;
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

    /// A rule by index (as in [`NoPermit::rule`](crate::NoPermit::rule)).
    pub fn rule(&self, index: usize) -> Option<&InflightRule> {
        self.rules.get(index)
    }

    /// The key of every rule for `subject`, in rule order.
    pub fn keys(&self, subject: &str) -> Result<Vec<String>> {
        validate_subject(subject)?;
        Ok(self.rules.iter().map(|r| format!("{}:{{{subject}}}:{}", self.prefix, r.name)).collect())
    }

    /// The first fail-closed rule, if any: the policy refuses on an outage.
    pub(crate) fn fail_closed(&self) -> Option<usize> {
        self.rules.iter().position(|r| r.fail == FailMode::Closed)
    }

    /// The prefix, shared: for a release sent in the background.
    pub(crate) fn prefix_arc(&self) -> Arc<str> {
        self.prefix.clone()
    }

    /// Every rule's limits, checked when the policy was built.
    pub(crate) fn params(&self) -> &[InflightParams] {
        &self.params
    }

    /// The shortest timeout: when a permit's slots start to go.
    pub(crate) fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    /// The outage fallback's local slots, shared by the policy's clones.
    pub(crate) fn local(&self) -> &Arc<LocalInflight> {
        &self.local
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
