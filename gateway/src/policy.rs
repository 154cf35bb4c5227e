//! Named rules for a subject, validated once when the policy is built.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use rl_client::internal::{beyond_lua, bucket_params};
use rl_client::{period_ms, Error, Result};
use rl_core::limits::{in_range, MAX_LOG_LIMIT};
use rl_core::{BucketParams, WindowMode};
use serde::{Deserialize, Serialize};

use crate::names::{validate_name, validate_rules};
use crate::subject::validate_subject;

/// What a rule does when Redis cannot answer. In rule files (feature live):
/// `open` or `closed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Limit locally, at this gateway's share of the limit (the default).
    #[default]
    Open,
    /// Refuse: for rules that are the security control itself (logins,
    /// one-time passwords, SMS sends), where an outage must not open a
    /// brute-force window.
    Closed,
}

/// One limit of a policy: a token bucket (at most `capacity` tokens,
/// `refill` more every `period`, continuously) or, with [`Rule::window`], a
/// window counted by RL.WINDOW.
///
/// ```
/// use std::time::Duration;
/// use rl_gateway::{Rule, WindowMode};
///
/// // 100 a second with bursts of 200.
/// let api = Rule::per_second("per_second", 100).burst(200);
/// // 5 login attempts a minute, refused outright while Redis is down.
/// let login = Rule::per_minute("login", 5).fail_closed();
/// // A rule being tried out: evaluated and reported, never enforced.
/// let trial = Rule::new("hourly", 1000, 1000, Duration::from_secs(3600)).shadow();
/// // A daily quota that resets at UTC midnight (module backend only).
/// let daily = Rule::window("daily", 10_000, Duration::from_secs(86_400), WindowMode::Fixed);
/// # let _ = (api, login, trial, daily);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    name: String,
    /// For a window: its limit (capacity and refill are both the limit).
    capacity: u64,
    refill: u64,
    period: Duration,
    fail: FailMode,
    shadow: bool,
    /// None: a token bucket. Some: a window counted in that mode.
    window: Option<WindowMode>,
}

impl Rule {
    /// A bucket of `capacity` tokens gaining `refill` tokens every `period`
    /// (a whole number of milliseconds). Checked when the policy is built.
    pub fn new(name: impl Into<String>, capacity: u64, refill: u64, period: Duration) -> Rule {
        Rule { name: name.into(), capacity, refill, period, fail: FailMode::Open, shadow: false, window: None }
    }

    /// At most `limit` requests in any `window` (SLIDING, EXACT) or per
    /// epoch-aligned `window` (FIXED: quotas), counted by RL.WINDOW (on the
    /// Lua backend by its window script: an EXACT limit at most 10,000); no leases (every request asks Redis, unless the deny
    /// cache refuses it); while Redis cannot answer, a fail-open window is
    /// replaced by a local bucket that admits at most this gateway's share
    /// of `limit x slack` in any `window`. An EXACT limit is checked here
    /// against the hard ceiling, 10^6; the server refuses a limit above its
    /// `max-log-limit` (10,000 unless configured) on every call. SLIDING and
    /// FIXED go to 10^12.
    pub fn window(name: impl Into<String>, limit: u64, window: Duration, mode: WindowMode) -> Rule {
        Rule { window: Some(mode), ..Rule::new(name, limit, limit, window) }
    }

    /// `n` a second, bursts of `n`.
    pub fn per_second(name: impl Into<String>, n: u64) -> Rule {
        Rule::new(name, n, n, Duration::from_secs(1))
    }

    /// `n` a minute, bursts of `n`.
    pub fn per_minute(name: impl Into<String>, n: u64) -> Rule {
        Rule::new(name, n, n, Duration::from_secs(60))
    }

    /// `n` an hour, bursts of `n`.
    pub fn per_hour(name: impl Into<String>, n: u64) -> Rule {
        Rule::new(name, n, n, Duration::from_secs(3600))
    }

    /// Sets the capacity (the burst) apart from the rate.
    pub fn burst(mut self, capacity: u64) -> Rule {
        self.capacity = capacity;
        self
    }

    /// Refuse while Redis cannot answer, instead of limiting locally.
    pub fn fail_closed(mut self) -> Rule {
        self.fail = FailMode::Closed;
        self
    }

    /// Evaluate and report this rule, never enforce it.
    pub fn shadow(mut self) -> Rule {
        self.shadow = true;
        self
    }

    /// The rule's name: the last part of its keys, and its name in headers.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Most tokens the bucket holds (its burst).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Tokens added every period.
    pub fn refill(&self) -> u64 {
        self.refill
    }

    /// The refill period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// What the rule does while Redis cannot answer.
    pub fn fail_mode(&self) -> FailMode {
        self.fail
    }

    /// Whether the rule is only evaluated and reported.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// How the rule counts when it is a window; `None` for a token bucket.
    pub fn window_mode(&self) -> Option<WindowMode> {
        self.window
    }

    /// Seconds to refill an empty bucket, rounded up: the window `w` the
    /// `RateLimit-Policy` header announces for `capacity` tokens.
    pub fn window_secs(&self) -> u64 {
        let ms = self.capacity as u128 * self.period.as_millis();
        let per_s = self.refill as u128 * 1000;
        ms.div_ceil(per_s).max(1).min(u64::MAX as u128) as u64
    }

    /// Its parameters, checked against the module's limits; the text names
    /// the field at fault.
    fn params(&self) -> std::result::Result<BucketParams, String> {
        match self.window {
            None => bucket_params(self.capacity, self.refill, self.period),
            Some(mode) => window_params(self.capacity, self.refill, self.period, mode),
        }
    }
}

/// Checks a window against the module's limits. Its parameters as a bucket
/// (`limit` per `window`) are what the outage fallback scales down locally.
fn window_params(
    limit: u64,
    refill: u64,
    window: Duration,
    mode: WindowMode,
) -> std::result::Result<BucketParams, String> {
    if refill != limit {
        return Err(format!("a window has no burst: its limit is {refill}, the burst set is {limit}"));
    }
    // An EXACT limit above the server's max-log-limit (a module option
    // up to this ceiling) is the server's to refuse: it answers so on
    // every call.
    in_range("limit", limit, 1, mode.max_limit(MAX_LOG_LIMIT)).map_err(|e| format!("{mode:?} window {e}"))?;
    let ms = period_ms(window).map_err(|why| why.replacen("period", "window", 1))?;
    BucketParams::new(limit, limit, ms).map_err(|e| e.to_string())
}

/// The rules evaluated together in one call: all of them give or none does.
/// One call counts one kind, so the enforced rules of a policy form up to
/// four groups (its buckets, then its windows of each mode), and so do its
/// shadow rules.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    /// What the group is: a hash of the policy's prefix, the group's kind
    /// and its rules. Local caches (leases, deny cache, fallback) key on
    /// it, so a policy built per request shares them with an equal one
    /// built before (the same rules on the same Redis keys).
    pub(crate) id: u64,
    /// Indexes into the policy's rules.
    pub(crate) rules: Vec<usize>,
    pub(crate) params: Vec<BucketParams>,
    /// Index in this group of its first fail-closed rule, if any: the whole
    /// group refuses on an outage.
    pub(crate) fail_closed: Option<usize>,
    /// None: token buckets (RL.TAKE, RL.LEASE). Some: windows (RL.WINDOW).
    pub(crate) window: Option<WindowMode>,
}

/// The kinds of calls, in the order a policy's groups are evaluated:
/// buckets first, so a request refused by its rate never counts in a window.
const KINDS: [Option<WindowMode>; 4] =
    [None, Some(WindowMode::Sliding), Some(WindowMode::Exact), Some(WindowMode::Fixed)];

/// The most groups a policy's enforced (or shadow) rules form: one per kind.
pub(crate) const GROUP_KINDS: usize = KINDS.len();

impl Group {
    /// `role` tells the enforced, shadow and settling groups apart.
    fn new(
        prefix: &str,
        role: &str,
        rules: &[Rule],
        params: &[BucketParams],
        window: Option<WindowMode>,
        member: impl Fn(&Rule) -> bool,
    ) -> Group {
        let rules_in: Vec<usize> =
            (0..rules.len()).filter(|&i| rules[i].window == window && member(&rules[i])).collect();
        // In-process only (local state), so the std hasher's stability
        // across Rust releases does not matter.
        let mut id = DefaultHasher::new();
        (prefix, role, window).hash(&mut id);
        rules_in.iter().for_each(|&i| rules[i].hash(&mut id));
        Group {
            id: id.finish(),
            params: rules_in.iter().map(|&i| params[i]).collect(),
            fail_closed: rules_in.iter().position(|&i| rules[i].fail == FailMode::Closed),
            rules: rules_in,
            window,
        }
    }

    /// The non-empty groups of the rules `member` picks, one per kind.
    fn split(
        prefix: &str,
        role: &str,
        rules: &[Rule],
        params: &[BucketParams],
        member: impl Fn(&Rule) -> bool,
    ) -> Vec<Group> {
        let group = |&kind| Group::new(prefix, role, rules, params, kind, &member);
        KINDS.iter().map(group).filter(|g| !g.is_empty()).collect()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// The rules that apply to one kind of subject (an API key, a user, an
/// IP prefix), under one key prefix.
///
/// A subject's bucket keys are `prefix:{subject}:rule`: the hash tag puts
/// all of them in one Redis Cluster slot, so one call sees them all.
///
/// ```
/// use rl_gateway::{Policy, Rule};
///
/// let policy = Policy::builder("api")
///     .rule(Rule::per_second("per_second", 100).burst(200))
///     .rule(Rule::per_minute("per_minute", 5000))
///     .build()?;
/// assert_eq!(policy.keys("user42")?, ["api:{user42}:per_second", "api:{user42}:per_minute"]);
///
/// // Mistakes are found here, not on the request path.
/// let err = Policy::builder("api").rule(Rule::per_second("s", 0)).build().unwrap_err();
/// assert!(err.to_string().contains("rule 's': capacity must be"));
/// # Ok::<(), rl_gateway::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Policy {
    prefix: Arc<str>,
    rules: Vec<Rule>,
    /// Evaluated in order; the first refusal decides.
    pub(crate) enforced: Vec<Group>,
    pub(crate) shadow: Vec<Group>,
    /// Every token-bucket rule: what settling and refunds adjust (windows
    /// have no refund and no debt).
    pub(crate) buckets: Group,
    /// The first rule the Lua scripts cannot count, and why.
    beyond_lua: Option<String>,
    /// How headers name this policy's rules (`label.rule`), if set.
    label: Option<Arc<str>>,
    /// What a token stands for, in headers.
    unit: QuotaUnit,
}

/// What one token of a policy stands for: the draft's quota unit (`qu`),
/// announced when it is not the default, requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuotaUnit {
    /// One token per request (a cost above one still counts tokens).
    #[default]
    Requests,
    /// The request's content bytes: the cost is its length.
    ContentBytes,
    /// Requests in flight.
    ConcurrentRequests,
}

impl QuotaUnit {
    /// The `qu` value, `None` for the default.
    pub fn parameter(self) -> Option<&'static str> {
        match self {
            QuotaUnit::Requests => None,
            QuotaUnit::ContentBytes => Some("content-bytes"),
            QuotaUnit::ConcurrentRequests => Some("concurrent-requests"),
        }
    }
}

/// Collects rules for [`Policy::builder`].
#[derive(Clone, Debug)]
pub struct PolicyBuilder {
    prefix: String,
    rules: Vec<Rule>,
    label: Option<String>,
    unit: QuotaUnit,
}

impl PolicyBuilder {
    /// Adds a rule; checked by [`PolicyBuilder::build`].
    pub fn rule(mut self, rule: Rule) -> PolicyBuilder {
        self.rules.push(rule);
        self
    }

    /// Names the policy's rules `label.rule` in headers: for several
    /// policies on one response (their rule names may repeat). Same
    /// characters as a rule name. Not part of what the policy is: an
    /// equal policy with another label shares its local state.
    pub fn label(mut self, label: impl Into<String>) -> PolicyBuilder {
        self.label = Some(label.into());
        self
    }

    /// What a token stands for, announced as the draft's `qu`.
    pub fn unit(mut self, unit: QuotaUnit) -> PolicyBuilder {
        self.unit = unit;
        self
    }

    /// Checks every rule against the module's limits and returns the policy,
    /// or an error naming the rule and the value at fault.
    pub fn build(self) -> Result<Policy> {
        let prefix = self.prefix;
        let params = validate_rules("policy", &prefix, &self.rules, Rule::name, Rule::params)?;
        if let Some(label) = &self.label {
            validate_name(label).map_err(|why| Error::invalid(format!("policy '{prefix}': label {why}")))?;
        }
        // The Lua scripts count exactly below 2^52 units; an EXACT log is
        // read and written whole by its script, so it is held to the
        // module's default max-log-limit.
        let beyond_lua = params.iter().zip(&self.rules).find_map(|(p, r)| {
            let why = beyond_lua(p.capacity(), p.period_ms(), r.window == Some(WindowMode::Exact))?;
            Some(format!("limit '{}': {why}", r.name()))
        });
        Ok(Policy {
            enforced: Group::split(&prefix, "enforced", &self.rules, &params, |r| !r.shadow),
            shadow: Group::split(&prefix, "shadow", &self.rules, &params, |r| r.shadow),
            buckets: Group::new(&prefix, "buckets", &self.rules, &params, None, |_| true),
            prefix: prefix.into(),
            rules: self.rules,
            beyond_lua,
            label: self.label.map(Into::into),
            unit: self.unit,
        })
    }
}

impl Policy {
    /// Starts a policy whose keys begin with `prefix`.
    pub fn builder(prefix: impl Into<String>) -> PolicyBuilder {
        PolicyBuilder { prefix: prefix.into(), rules: Vec::new(), label: None, unit: QuotaUnit::Requests }
    }

    /// The header label set by [`PolicyBuilder::label`].
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// What a token stands for.
    pub fn unit(&self) -> QuotaUnit {
        self.unit
    }

    /// The key prefix (also the policy's name in metrics and 429 bodies).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The prefix, shared: labels for metrics from background tasks.
    pub(crate) fn prefix_arc(&self) -> Arc<str> {
        self.prefix.clone()
    }

    /// The rules in the order they were added.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// A rule by index (as in [`Decision::rule`](crate::Decision::rule)).
    pub fn rule(&self, index: usize) -> Option<&Rule> {
        self.rules.get(index)
    }

    /// The bucket key of every rule for `subject`, in rule order.
    pub fn keys(&self, subject: &str) -> Result<Vec<String>> {
        validate_subject(subject)?;
        Ok(self.rules.iter().map(|r| self.key(subject, r)).collect())
    }

    /// Whether every rule fits the Lua backend's exact range
    /// (capacity x period_ms <= 2^52, an EXACT window <= 10,000).
    pub fn fits_lua(&self) -> bool {
        self.beyond_lua.is_none()
    }

    /// The first rule beyond the Lua backend's range, named, and why.
    pub fn beyond_lua(&self) -> Option<&str> {
        self.beyond_lua.as_deref()
    }

    /// Whether a rule is a window (RL.WINDOW).
    pub fn has_windows(&self) -> bool {
        self.rules.iter().any(|r| r.window.is_some())
    }

    /// Whether the two share local state (leases, deny cache, fallback):
    /// true when they have the same prefix and the same rules (their
    /// buckets are the same Redis keys), however they were built.
    pub fn shares_state_with(&self, other: &Policy) -> bool {
        self.buckets.id == other.buckets.id
    }

    /// The keys of a group's rules for a subject already checked.
    pub(crate) fn group_keys(&self, group: &Group, subject: &str) -> Vec<String> {
        group.rules.iter().map(|&i| self.key(subject, &self.rules[i])).collect()
    }

    /// `prefix:{subject}:rule`, built at its exact length: this runs for
    /// every rule on every check, and `format!` would grow the string twice.
    fn key(&self, subject: &str, rule: &Rule) -> String {
        let mut key = String::with_capacity(self.prefix.len() + subject.len() + rule.name.len() + 4);
        for part in [&*self.prefix, ":{", subject, "}:", &rule.name] {
            key.push_str(part);
        }
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rl_core::limits::{MAX_PERIOD_MS, MAX_TOKENS};

    fn err(b: PolicyBuilder) -> String {
        b.build().unwrap_err().to_string()
    }

    #[test]
    fn splits_enforced_and_shadow_rules() {
        let p = Policy::builder("rl")
            .rule(Rule::per_second("s", 10))
            .rule(Rule::per_minute("m", 100).shadow())
            .rule(Rule::per_hour("h", 1000).fail_closed())
            .build()
            .unwrap();
        assert_eq!(p.enforced.len(), 1);
        assert_eq!(p.enforced[0].rules, [0, 2]);
        assert_eq!(p.enforced[0].fail_closed, Some(1), "the group's second rule");
        assert_eq!(p.buckets.rules, [0, 1, 2]);
        assert_eq!(p.shadow[0].rules, [1]);
        assert_eq!(p.shadow[0].fail_closed, None);
        assert_eq!(p.group_keys(&p.shadow[0], "u"), ["rl:{u}:m"]);
        assert_eq!(p.enforced[0].params[1].period_ms(), 3_600_000);
    }

    #[test]
    fn windows_form_their_own_groups_after_the_buckets() {
        let day = Duration::from_secs(86_400);
        let p = Policy::builder("rl")
            .rule(Rule::window("daily", 1000, day, WindowMode::Fixed))
            .rule(Rule::per_second("s", 10))
            .rule(Rule::window("hourly", 100, Duration::from_secs(3600), WindowMode::Sliding).fail_closed())
            .rule(Rule::window("trial", 5, day, WindowMode::Fixed).shadow())
            .build()
            .unwrap();
        let kinds: Vec<_> = p.enforced.iter().map(|g| (g.window, g.rules.clone(), g.fail_closed)).collect();
        assert_eq!(
            kinds,
            [
                (None, vec![1], None),
                (Some(WindowMode::Sliding), vec![2], Some(0)),
                (Some(WindowMode::Fixed), vec![0], None)
            ]
        );
        assert_eq!(p.shadow.iter().map(|g| g.rules.clone()).collect::<Vec<_>>(), [vec![3]]);
        assert_eq!(p.buckets.rules, [1], "only buckets are settled and refunded");
        assert!(p.has_windows());
        assert_ne!(p.enforced[0].id, p.enforced[1].id);
        // The fallback's stand-in: `limit` per `window`.
        let fixed = p.enforced[2].params[0];
        assert_eq!((fixed.capacity(), fixed.refill(), fixed.period_ms()), (1000, 1000, 86_400_000));
        assert_eq!(p.rule(0).unwrap().window_secs(), 86_400);
    }

    #[test]
    fn bad_windows_are_named() {
        let b = || Policy::builder("rl");
        let hour = Duration::from_secs(3600);
        let e = err(b().rule(Rule::window("w", 0, hour, WindowMode::Sliding)));
        assert!(e.contains("rule 'w': Sliding window limit must be an integer from 1 to 1000000000000, got 0"), "{e}");
        // The server refuses an EXACT limit above its max-log-limit; here
        // only the hard ceiling is checked.
        assert!(b().rule(Rule::window("w", 10_001, hour, WindowMode::Exact)).build().is_ok());
        let e = err(b().rule(Rule::window("w", 1_000_001, hour, WindowMode::Exact)));
        assert!(e.contains("Exact window limit must be an integer from 1 to 1000000"), "{e}");
        let e = err(b().rule(Rule::window("w", 5, Duration::ZERO, WindowMode::Fixed)));
        assert!(e.contains("rule 'w': window must be a whole number of milliseconds"), "{e}");
        let e = err(b().rule(Rule::window("w", 5, hour, WindowMode::Fixed).burst(9)));
        assert!(e.contains("a window has no burst"), "{e}");
    }

    #[test]
    fn every_bad_rule_is_named() {
        let b = || Policy::builder("rl");
        assert!(err(b()).contains("needs 1 to 32 rules, got 0"));
        assert!(err(b().rule(Rule::per_second("a b", 1))).contains("rule 1: name may hold only"));
        assert!(err(b().rule(Rule::per_second("", 1))).contains("rule 1: name must be 1 to 64"));
        assert!(err(b().rule(Rule::per_second("s", 1)).rule(Rule::per_minute("s", 1))).contains("names rule 's' twice"));
        assert!(err(b().rule(Rule::per_second("s", 1).burst(0))).contains("rule 's': capacity must be"));
        assert!(err(b().rule(Rule::new("s", 1, 0, Duration::from_secs(1)))).contains("rule 's': refill must be"));
        assert!(
            err(b().rule(Rule::new("s", MAX_TOKENS + 1, 1, Duration::from_secs(1)))).contains("got 100000000000001")
        );
        assert!(
            err(b().rule(Rule::new("s", 1, 1, Duration::from_micros(1500)))).contains("whole number of milliseconds")
        );
        assert!(err(b().rule(Rule::new("s", 1, 1, Duration::ZERO))).contains("period must be"));
        assert!(
            err(b().rule(Rule::new("s", 1, 1, Duration::from_millis(MAX_PERIOD_MS + 1)))).contains("period must be")
        );
        let many = (0..33).fold(b(), |b, i| b.rule(Rule::per_second(format!("r{i}"), 1)));
        assert!(err(many).contains("got 33"));
        assert!(err(Policy::builder("a{b").rule(Rule::per_second("s", 1))).contains("prefix"));
        assert!(err(Policy::builder("").rule(Rule::per_second("s", 1))).contains("prefix"));
    }

    #[test]
    fn subjects_that_would_move_the_hash_tag_are_refused() {
        let p = Policy::builder("rl").rule(Rule::per_second("s", 1)).build().unwrap();
        assert_eq!(p.keys("2001:db8::/48").unwrap(), ["rl:{2001:db8::/48}:s"]);
        for bad in ["", "a}b", "{x}", &"x".repeat(513)] {
            assert!(p.keys(bad).unwrap_err().to_string().contains("subject must be"), "{bad}");
        }
    }

    #[test]
    fn lua_range_is_known_at_build() {
        let fits = Policy::builder("rl").rule(Rule::per_hour("h", 1_000_000)).build().unwrap();
        assert!(fits.fits_lua());
        let day = Duration::from_secs(86_400);
        let huge = Policy::builder("rl").rule(Rule::new("d", 1_000_000_000, 1, day)).build().unwrap();
        assert!(!huge.fits_lua());
    }

    #[test]
    fn window_is_the_time_to_refill_capacity() {
        assert_eq!(Rule::per_second("s", 100).burst(200).window_secs(), 2);
        assert_eq!(Rule::per_minute("m", 5).window_secs(), 60);
        assert_eq!(Rule::new("x", 1, 3, Duration::from_secs(1)).window_secs(), 1);
    }

    #[test]
    fn local_state_is_keyed_by_what_a_policy_is() {
        let b = || Policy::builder("rl").rule(Rule::per_second("s", 1)).rule(Rule::per_minute("m", 5).shadow());
        let (one, two) = (b().build().unwrap(), b().label("x").build().unwrap());
        assert_eq!(one.enforced[0].id, two.enforced[0].id, "built apart, equal: one state");
        assert_eq!(one.shadow[0].id, two.shadow[0].id);
        assert!(one.shares_state_with(&two));
        assert_ne!(one.enforced[0].id, one.shadow[0].id);
        assert_ne!(one.enforced[0].id, one.buckets.id);
        for other in [
            Policy::builder("rl2").rule(Rule::per_second("s", 1)).rule(Rule::per_minute("m", 5).shadow()),
            Policy::builder("rl").rule(Rule::per_second("s", 2)).rule(Rule::per_minute("m", 5).shadow()),
            Policy::builder("rl").rule(Rule::per_second("s", 1).fail_closed()).rule(Rule::per_minute("m", 5).shadow()),
            Policy::builder("rl").rule(Rule::per_second("t", 1)).rule(Rule::per_minute("m", 5).shadow()),
        ] {
            let other = other.build().unwrap();
            assert_ne!(one.enforced[0].id, other.enforced[0].id, "{other:?}");
        }
    }

    #[test]
    fn a_label_is_checked() {
        let e = err(Policy::builder("rl").label("a b").rule(Rule::per_second("s", 1)));
        assert!(e.contains("policy 'rl': label may hold only"), "{e}");
    }
}
