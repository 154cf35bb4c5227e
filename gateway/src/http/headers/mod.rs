//! HTTP headers from a [`Decision`], as the IETF httpapi draft
//! "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers,
//! -10 and -11) spells them, and the legacy `X-RateLimit-*`.
//!
//! - `RateLimit-Policy: "per_minute";q=5000;w=60` for every enforced rule:
//!   `q` its capacity, `w` the seconds it takes to refill from empty, `qu`
//!   the quota unit when it is not requests ([`QuotaUnit`](crate::QuotaUnit)).
//!   Built once per [`PolicyHeaders`] (where the policy is registered); the
//!   same on every response of the policy.
//! - `RateLimit: "per_minute";r=42;t=1` for the policy's binding rule: `r`
//!   the tokens left (never above the rule's capacity: a decision of the
//!   local fallback does not announce its scaled bucket), `t` the seconds
//!   until more quota is available, rounded up: on a refusal the retry
//!   time, so `Retry-After` never points earlier than `t`; when allowed, the
//!   time one token takes to come back (a bucket) or the time until the
//!   window frees a request (a window). In a refused response an allowed
//!   policy's `t` is capped at `Retry-After` (a shorter effective window is
//!   still true).
//! - Several policies on one response (a layer with several, or stacked
//!   layers): each adds its list members, nothing is overwritten. Rule
//!   names repeat across policies: give each a
//!   [`label`](crate::PolicyBuilder::label) and its members read `label.rule`.
//!   One policy reached through two views of a request (live rules: by key
//!   and by address) names them apart, `key.label.rule` and
//!   `ip.label.rule` ([`insert_view`]).
//! - `X-RateLimit-Limit`, `-Remaining`, `-Reset` (Unix seconds of `t`) for
//!   the most restrictive policy: the one with the fewest tokens left. Its
//!   limit is the smallest capacity of its enforced rules, the same on
//!   every response of the policy (the binding rule changes from request
//!   to request, and the remaining count is the binding rule's, never more
//!   than that smallest capacity).
//! - `Retry-After` in whole seconds, rounded up, on refusals only (a wait
//!   of 200 ms says 1, never 0); the longest of the refusing policies'.
//!
//! [`Fields`] chooses which of these a response carries: all (the
//! default), the draft's only, or `Retry-After` only.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use rl_gateway::http::headers::{self, PolicyHeaders};
//! use rl_gateway::{Decision, Policy, Rule, Source};
//!
//! let policy = Policy::builder("api").rule(Rule::per_minute("per_minute", 5000)).build()?;
//! // Once, where the policy is registered: its headers' fixed parts.
//! let policy = PolicyHeaders::new(policy);
//! let refused = Decision {
//!     allowed: false,
//!     remaining: 0,
//!     retry_after: Some(Duration::from_millis(200)),
//!     reset_after: Duration::from_secs(60),
//!     limit: 5000,
//!     rule: 0,
//!     source: Source::Redis,
//!     shadow_refused: None,
//! };
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
//! let h = headers::for_decision(&policy, &refused, now);
//! assert_eq!(h["ratelimit-policy"], r#""per_minute";q=5000;w=60"#);
//! assert_eq!(h["ratelimit"], r#""per_minute";r=0;t=1"#);
//! assert_eq!(h["x-ratelimit-reset"], "1700000001");
//! assert_eq!(h["retry-after"], "1");
//! # Ok::<(), rl_gateway::Error>(())
//! ```

mod inflight;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{Entry, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use rl_core::codec::decimal;
use rl_core::ratelimit_header::{push_limit_member_prefix, push_policy_member, RESET_PARAMETER};

use crate::{Decision, Policy, Rule};

pub use inflight::{announce_inflight, insert_inflight, InflightHeaders, Slots};

/// `RateLimit-Policy` (IETF draft).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (Unix seconds).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// A policy with its headers' fixed parts (the `RateLimit-Policy` value,
/// each rule's member name, the legacy limit): made once where the policy
/// is registered (a layer's policies, a compiled rule), so a response only
/// writes its numbers. Each view's parts are built on first use.
#[derive(Clone, Debug)]
pub struct PolicyHeaders {
    policy: Arc<Policy>,
    /// Per [`View`] (none, key, ip): what no decision changes; `None` for a
    /// policy that enforces nothing.
    announced: [OnceLock<Option<Announced>>; 3],
}

impl PolicyHeaders {
    /// The headers of `policy`.
    pub fn new(policy: impl Into<Arc<Policy>>) -> PolicyHeaders {
        PolicyHeaders { policy: policy.into(), announced: Default::default() }
    }

    /// The policy they announce.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The fixed parts for `view`, built on first use.
    fn announced(&self, view: Option<View>) -> Option<&Announced> {
        self.announced[View::slot(view)].get_or_init(|| Announced::new(&self.policy, view)).as_ref()
    }
}

/// The headers for `decision` on `policy`, at `now` (for the Unix reset time).
pub fn for_decision(policy: &PolicyHeaders, decision: &Decision, now: SystemTime) -> HeaderMap {
    // Room for the six fields: the map allocates once.
    let mut headers = HeaderMap::with_capacity(6);
    insert(&mut headers, policy, decision, now);
    headers
}

/// Which fields a response carries. Every set keeps `Retry-After` on
/// refusals (HTTP's own field; a client that knows no draft still waits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fields {
    /// The draft's `RateLimit-Policy` and `RateLimit`, and the legacy
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` that many clients read.
    #[default]
    DraftAndLegacy,
    /// The draft's fields only: two map insertions instead of five, for
    /// clients that follow the draft (about half the cost: see the README).
    Draft,
    /// `Retry-After` on refusals only: limits are not disclosed (the
    /// draft's section on information disclosure). The layer's default
    /// refusal body names the violated policies: give it your own
    /// `refusal` too.
    RetryAfter,
}

/// Which view of a request a decision was made for, when one policy can
/// apply to a request twice: live rules see a request by its API key and by
/// its address, and both views may land on one rule (with different
/// buckets). Its members are then named `key.label.rule` and
/// `ip.label.rule`: distinct, and the same on every response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum View {
    /// By the API key (or the subject a request names).
    Key,
    /// By the client's address.
    Ip,
}

impl View {
    /// The word its members start with.
    pub fn name(self) -> &'static str {
        match self {
            View::Key => "key",
            View::Ip => "ip",
        }
    }

    /// Where [`PolicyHeaders`] keeps the fixed parts for this view.
    fn slot(view: Option<View>) -> usize {
        match view {
            None => 0,
            Some(View::Key) => 1,
            Some(View::Ip) => 2,
        }
    }
}

/// What a policy's headers hold that no decision changes, for one view:
/// the `RateLimit-Policy` value, each rule's member name, the legacy limit.
#[derive(Clone, Debug)]
struct Announced {
    policy: HeaderValue,
    /// Per rule of the policy: `"name";r=`, the start of its member.
    members: Vec<Box<[u8]>>,
    /// The smallest capacity of the enforced rules, and as a value.
    limit: u64,
    limit_value: HeaderValue,
}

/// Adds the headers of `decision` on `policy` to `headers`, beside those of
/// other policies already there (see the module notes). Add refusals
/// first: an allowed policy's `t` is capped at the `Retry-After` present.
/// A map without a `RateLimit-Policy` field holds no policy's headers yet:
/// its fields are written without comparing with what is there.
/// A policy of shadow rules only enforces nothing, so it announces nothing.
pub fn insert(headers: &mut HeaderMap, policy: &PolicyHeaders, decision: &Decision, now: SystemTime) {
    insert_fields(headers, policy, None, Fields::DraftAndLegacy, decision, now);
}

/// [`insert`] for one [`View`] of the request: its members are named by it.
pub fn insert_view(
    headers: &mut HeaderMap,
    policy: &PolicyHeaders,
    view: Option<View>,
    decision: &Decision,
    now: SystemTime,
) {
    insert_fields(headers, policy, view, Fields::DraftAndLegacy, decision, now);
}

/// [`insert_view`] writing only `fields`.
pub fn insert_fields(
    headers: &mut HeaderMap,
    policy: &PolicyHeaders,
    view: Option<View>,
    fields: Fields,
    decision: &Decision,
    now: SystemTime,
) {
    if fields == Fields::RetryAfter {
        insert_decision(headers, policy, view, fields, decision, now, false);
        return;
    }
    let Some(announced) = policy.announced(view) else { return };
    // Without a RateLimit-Policy field no policy's headers are there yet:
    // nothing to compare with (the service's own fields, such as a
    // content-type, do not count). One lookup says it and adds ours.
    let fresh = match headers.entry(RATELIMIT_POLICY) {
        Entry::Vacant(vacant) => {
            vacant.insert(announced.policy.clone());
            true
        }
        Entry::Occupied(mut occupied) => {
            occupied.append(announced.policy.clone());
            false
        }
    };
    insert_decision(headers, policy, view, fields, decision, now, fresh);
}

/// Adds `policy`'s `RateLimit-Policy` members (for `view`) and nothing
/// else: what a response announces for a policy that applies to the
/// request, decided or not (another refused first), so the field lists the
/// same members on every response. [`insert_decision`] adds the numbers.
pub fn announce(headers: &mut HeaderMap, policy: &PolicyHeaders, view: Option<View>) {
    if let Some(announced) = policy.announced(view) {
        headers.append(RATELIMIT_POLICY, announced.policy.clone());
    }
}

/// The numbers of `decision` on `policy` (the `RateLimit` member,
/// `Retry-After`, the legacy fields), its members announced apart
/// ([`announce`]). `fresh`: the map held no policy's headers before this
/// response's, so there is nothing to compare with.
pub fn insert_decision(
    headers: &mut HeaderMap,
    policy: &PolicyHeaders,
    view: Option<View>,
    fields: Fields,
    decision: &Decision,
    now: SystemTime,
    fresh: bool,
) {
    if fields == Fields::RetryAfter {
        if let Some(retry) = retry_secs(decision) {
            raise_retry_after(headers, retry, header_u64(headers, &RETRY_AFTER));
        }
        return;
    }
    let Some(announced) = policy.announced(view) else { return };
    let (Some(rule), Some(member)) = (policy.policy().rule(decision.rule), announced.members.get(decision.rule)) else {
        return;
    };
    let retry = retry_secs(decision);
    let present_retry = if fresh { None } else { header_u64(headers, &RETRY_AFTER) };
    let t = match (decision.allowed, retry) {
        (false, retry) => retry,
        (true, _) => {
            let t = next_quota_secs(rule, decision);
            Some(present_retry.map_or(t, |r| t.min(r)))
        }
    };
    let remaining = decision.remaining.min(rule.capacity());
    append_member(headers, member, remaining, t);
    if let Some(retry) = retry {
        raise_retry_after(headers, retry, present_retry);
    }
    if fields == Fields::Draft {
        return;
    }
    insert_legacy(headers, announced.limit, &announced.limit_value, remaining, t, now, fresh);
}

/// Appends a `RateLimit` member: `member` (`"name";r=`), the tokens left
/// and `t`, written once into a buffer of its exact size (a `Vec` becomes
/// `Bytes` without a second allocation).
pub(crate) fn append_member(headers: &mut HeaderMap, member: &[u8], remaining: u64, t: Option<u64>) {
    let (mut r_buf, mut t_buf) = ([0u8; 20], [0u8; 20]);
    let r_digits = decimal(remaining, &mut r_buf);
    let t_digits = t.map(|t| decimal(t, &mut t_buf));
    let t_len = t_digits.map_or(0, |d| 3 + d.len());
    let mut item = Vec::with_capacity(member.len() + r_digits.len() + t_len);
    item.extend_from_slice(member);
    item.extend_from_slice(r_digits);
    if let Some(t) = t_digits {
        item.extend_from_slice(RESET_PARAMETER.as_bytes());
        item.extend_from_slice(t);
    }
    // Names are checked and numbers are digits: always a valid value.
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(item)) {
        headers.append(RATELIMIT, value);
    }
}

/// The legacy fields, for the policy with the fewest tokens left: written
/// when the map has none yet or this one has fewer than those there.
pub(crate) fn insert_legacy(
    headers: &mut HeaderMap,
    limit: u64,
    limit_value: &HeaderValue,
    remaining: u64,
    t: Option<u64>,
    now: SystemTime,
    fresh: bool,
) {
    let remaining = remaining.min(limit);
    if fresh || header_u64(headers, &X_RATELIMIT_REMAINING).is_none_or(|present| remaining < present) {
        let unix_now = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let reset = ceil_secs(unix_now.saturating_add(Duration::from_secs(t.unwrap_or(0))));
        headers.insert(X_RATELIMIT_LIMIT, limit_value.clone());
        headers.insert(X_RATELIMIT_REMAINING, number(remaining));
        headers.insert(X_RATELIMIT_RESET, unix_secs(reset));
    }
}

/// A refusal's wait in whole seconds, rounded up and at least 1; `None`
/// when allowed or when no wait helps.
fn retry_secs(decision: &Decision) -> Option<u64> {
    match (decision.allowed, decision.retry_after) {
        (false, Some(retry)) => Some(ceil_secs(retry).max(1)),
        _ => None,
    }
}

/// `Retry-After` becomes `retry` unless a longer wait is there already.
pub(crate) fn raise_retry_after(headers: &mut HeaderMap, retry: u64, present: Option<u64>) {
    if present.is_none_or(|present| retry > present) {
        headers.insert(RETRY_AFTER, number(retry));
    }
}

/// Numbers below this are header values without an allocation.
const SMALL: u64 = 10_000;
/// Bytes of the decimal digits of 0 to 9,999, one number after another.
const SMALL_DIGITS_LEN: usize = 10 + 90 * 2 + 900 * 3 + 9000 * 4;
/// 0 to 9,999 in decimal, written out at compile time (39 KB of the binary).
static SMALL_DIGITS: [u8; SMALL_DIGITS_LEN] = {
    let mut out = [0u8; SMALL_DIGITS_LEN];
    let (mut n, mut at) = (0u64, 0usize);
    while n < SMALL {
        let width = small_width(n);
        let mut i = width;
        let mut rest = n;
        while i > 0 {
            i -= 1;
            out[at + i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += width;
        n += 1;
    }
    out
};

const fn small_width(n: u64) -> usize {
    match n {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        _ => 4,
    }
}

/// `n` as a header value: below [`SMALL`] a view of the static digits (no
/// allocation, nothing counted on clone or drop), above it a new value.
pub(crate) fn number(n: u64) -> HeaderValue {
    if n >= SMALL {
        return HeaderValue::from(n);
    }
    // Where n's digits start: the widths of every number before it.
    let at = match n {
        0..=9 => n,
        10..=99 => 10 + (n - 10) * 2,
        100..=999 => 190 + (n - 100) * 3,
        _ => 2890 + (n - 1000) * 4,
    } as usize;
    let digits = &SMALL_DIGITS[at..at + small_width(n)];
    // Only ASCII digits: always UTF-8 and a valid value.
    match std::str::from_utf8(digits) {
        Ok(text) => HeaderValue::from_static(text),
        Err(_) => HeaderValue::from(n),
    }
}

thread_local! {
    /// The last `X-RateLimit-Reset` value this thread made: responses of
    /// the same second share it (a clone of shared bytes, no allocation).
    static LAST_RESET: std::cell::RefCell<Option<(u64, HeaderValue)>> = const { std::cell::RefCell::new(None) };
}

/// Unix seconds as a header value, reused while the second is the same.
fn unix_secs(secs: u64) -> HeaderValue {
    LAST_RESET.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some((at, value)) if *at == secs => value.clone(),
            _ => {
                let value = number(secs);
                *last = Some((secs, value.clone()));
                value
            }
        }
    })
}

impl Announced {
    /// `policy`'s fixed header parts for `view`; `None` for a policy that
    /// enforces nothing.
    fn new(policy: &Policy, view: Option<View>) -> Option<Announced> {
        let enforced = || policy.rules().iter().filter(|r| !r.is_shadow());
        let limit = enforced().map(Rule::capacity).min()?;
        let mut value = String::new();
        for rule in enforced() {
            if !value.is_empty() {
                value.push_str(", ");
            }
            let name = identifier_of(policy, view, rule);
            push_policy_member(&mut value, &name, rule.capacity(), Some(rule.window_secs()), policy.unit().parameter());
        }
        let members = policy
            .rules()
            .iter()
            .map(|rule| {
                let mut member = String::new();
                push_limit_member_prefix(&mut member, &identifier_of(policy, view, rule));
                member.into_bytes().into_boxed_slice()
            })
            .collect();
        Some(Announced {
            policy: HeaderValue::from_str(&value).ok()?,
            members,
            limit,
            // Below 10,000 a static value: its clones count no references.
            limit_value: number(limit),
        })
    }
}

/// How headers name rule `index` of `policy` for `view`: `rule`,
/// `label.rule` or `view.label.rule`.
pub fn identifier(policy: &Policy, view: Option<View>, index: usize) -> String {
    policy.rule(index).map(|rule| identifier_of(policy, view, rule)).unwrap_or_default()
}

fn identifier_of(policy: &Policy, view: Option<View>, rule: &Rule) -> String {
    dotted_name(view, policy.label(), rule.name())
}

/// `name`, `label.name` or `view.label.name` (checked name characters): how
/// headers name a rule of a labelled policy seen through a view.
pub(crate) fn dotted_name(view: Option<View>, label: Option<&str>, name: &str) -> String {
    let mut out = String::new();
    if let Some(view) = view {
        out.push_str(view.name());
        out.push('.');
    }
    if let Some(label) = label {
        out.push_str(label);
        out.push('.');
    }
    out.push_str(name);
    out
}

/// Seconds until an allowed request's binding rule has more quota: a
/// bucket gains a token every period / refill; a window frees one by the
/// time it is empty again, at most one window on.
fn next_quota_secs(rule: &Rule, decision: &Decision) -> u64 {
    let period = rule.period();
    match rule.window_mode() {
        None => {
            let per_token_ms = period.as_millis().div_ceil(u128::from(rule.refill().max(1)));
            ceil_secs(Duration::from_millis(u64::try_from(per_token_ms).unwrap_or(u64::MAX)))
        }
        Some(_) => ceil_secs(decision.reset_after.min(period)),
    }
}

pub(crate) fn header_u64(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{QuotaUnit, Source};
    use rl_core::WindowMode;

    fn decision(allowed: bool, retry_ms: Option<u64>) -> Decision {
        Decision {
            allowed,
            remaining: 7,
            retry_after: retry_ms.map(Duration::from_millis),
            reset_after: Duration::from_millis(2500),
            limit: 200,
            rule: 1,
            source: Source::Redis,
            shadow_refused: None,
        }
    }

    fn policy() -> PolicyHeaders {
        headed(
            Policy::builder("api")
                .rule(Rule::per_minute("per_minute", 5000))
                .rule(Rule::per_second("per_second", 100).burst(200))
                .rule(Rule::per_hour("trial", 1).shadow()),
        )
    }

    fn headed(policy: crate::PolicyBuilder) -> PolicyHeaders {
        PolicyHeaders::new(policy.build().unwrap())
    }

    fn all(h: &HeaderMap, name: &HeaderName) -> Vec<String> {
        h.get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect()
    }

    const NOW: SystemTime = SystemTime::UNIX_EPOCH;

    #[test]
    fn policy_field_lists_every_enforced_rule_with_q_and_w() {
        // Draft 3.1: q required, w in seconds; a shadow rule is not a quota.
        let h = for_decision(&policy(), &decision(true, Some(0)), NOW);
        assert_eq!(all(&h, &RATELIMIT_POLICY), [r#""per_minute";q=5000;w=60, "per_second";q=200;w=2"#]);
    }

    #[test]
    fn policy_field_is_built_once_and_stays_the_same() {
        // Draft 3: the field SHOULD remain consistent over responses.
        let p = policy();
        let one = for_decision(&p, &decision(true, Some(0)), NOW);
        let two = for_decision(&p, &Decision { rule: 0, remaining: 4000, ..decision(true, Some(0)) }, NOW);
        assert_eq!(one[&RATELIMIT_POLICY], two[&RATELIMIT_POLICY]);
        let built = || p.announced[0].get().unwrap().as_ref().unwrap().policy.as_bytes().as_ptr();
        let first = built();
        for_decision(&p, &decision(false, Some(5)), NOW);
        assert_eq!(built(), first, "not rebuilt");
    }

    #[test]
    fn quota_units_other_than_requests_are_announced() {
        // Draft 3.1.2: qu, default "requests".
        let bytes = headed(Policy::builder("up").unit(QuotaUnit::ContentBytes).rule(Rule::per_second("bytes", 65_535)));
        let h = for_decision(&bytes, &Decision { rule: 0, ..decision(true, Some(0)) }, NOW);
        assert_eq!(h[&RATELIMIT_POLICY], r#""bytes";q=65535;w=1;qu="content-bytes""#);
    }

    #[test]
    fn a_refusal_says_t_is_the_retry_time_and_retry_after_is_not_earlier() {
        // Draft 4.1.2 (t: until more quota) and 6 (Retry-After not before t).
        for (ms, secs) in [(1, 1), (999, 1), (1000, 1), (1001, 2), (59_000, 59)] {
            let h = for_decision(&policy(), &Decision { remaining: 0, ..decision(false, Some(ms)) }, NOW);
            assert_eq!(h[&RATELIMIT], format!("\"per_second\";r=0;t={secs}").as_str(), "{ms} ms");
            assert_eq!(h[RETRY_AFTER], secs.to_string().as_str());
            assert_eq!(h[&X_RATELIMIT_RESET], secs.to_string().as_str(), "the same moment in Unix seconds");
        }
    }

    #[test]
    fn allowed_responses_say_when_one_more_token_comes() {
        // A bucket of 100 a second gains a token every 10 ms: t=1, not the 2.5 s to full.
        let h = for_decision(&policy(), &decision(true, Some(0)), SystemTime::UNIX_EPOCH + Duration::from_secs(10));
        assert_eq!(h[&RATELIMIT], r#""per_second";r=7;t=1"#);
        assert_eq!(h[&X_RATELIMIT_RESET], "11");
        assert!(!h.contains_key(RETRY_AFTER), "Retry-After on refusals only");
        let slow = headed(Policy::builder("s").rule(Rule::per_hour("hourly", 2)));
        let h = for_decision(&slow, &Decision { rule: 0, remaining: 1, ..decision(true, Some(0)) }, NOW);
        assert_eq!(h[&RATELIMIT], r#""hourly";r=1;t=1800"#);
    }

    #[test]
    fn a_window_frees_quota_by_its_reset_at_most_one_window_on() {
        let w = headed(Policy::builder("w").rule(Rule::window(
            "daily",
            10,
            Duration::from_secs(86_400),
            WindowMode::Fixed,
        )));
        let d = Decision { rule: 0, reset_after: Duration::from_millis(3_600_500), ..decision(true, Some(0)) };
        assert_eq!(for_decision(&w, &d, NOW)[&RATELIMIT], r#""daily";r=7;t=3601"#);
    }

    #[test]
    fn a_request_that_can_never_succeed_promises_no_time() {
        let h = for_decision(&policy(), &Decision { remaining: 0, ..decision(false, None) }, NOW);
        assert_eq!(h[&RATELIMIT], r#""per_second";r=0"#);
        assert!(!h.contains_key(RETRY_AFTER));
    }

    #[test]
    fn the_fallback_never_announces_its_scaled_bucket() {
        // One gateway, slack 2: the local bucket holds 400 of a 200 rule.
        let local = Decision { remaining: 390, limit: 400, source: Source::Fallback, ..decision(true, Some(0)) };
        let h = for_decision(&policy(), &local, NOW);
        assert_eq!(h[&RATELIMIT], r#""per_second";r=200;t=1"#);
        assert_eq!(h[&X_RATELIMIT_LIMIT], "200");
        assert_eq!(h[&X_RATELIMIT_REMAINING], "200");
        assert_eq!(h[&RATELIMIT_POLICY], r#""per_minute";q=5000;w=60, "per_second";q=200;w=2"#);
    }

    #[test]
    fn legacy_limit_stays_the_same_while_the_binding_rule_changes() {
        let p = policy();
        let by_second = for_decision(&p, &Decision { rule: 1, remaining: 150, ..decision(true, Some(0)) }, NOW);
        let by_minute = for_decision(&p, &Decision { rule: 0, remaining: 120, ..decision(true, Some(0)) }, NOW);
        assert_eq!(by_second[&X_RATELIMIT_LIMIT], "200");
        assert_eq!(by_minute[&X_RATELIMIT_LIMIT], "200");
        assert_eq!(by_minute[&X_RATELIMIT_REMAINING], "120");
    }

    #[test]
    fn several_policies_append_members_and_the_tightest_wins_the_legacy_fields() {
        // Draft 3 and 4: lists; a refusal first, then an allowed policy.
        let ip = headed(Policy::builder("ip").label("ip").rule(Rule::per_second("per_second", 10)));
        let key = headed(Policy::builder("key").label("key").rule(Rule::per_hour("per_hour", 100)));
        let mut h = HeaderMap::new();
        let refused = Decision { rule: 0, remaining: 0, ..decision(false, Some(1500)) };
        insert(&mut h, &key, &refused, NOW);
        insert(&mut h, &ip, &Decision { rule: 0, remaining: 9, ..decision(true, Some(0)) }, NOW);
        assert_eq!(all(&h, &RATELIMIT_POLICY), [r#""key.per_hour";q=100;w=3600"#, r#""ip.per_second";q=10;w=1"#]);
        assert_eq!(all(&h, &RATELIMIT), [r#""key.per_hour";r=0;t=2"#, r#""ip.per_second";r=9;t=1"#]);
        assert_eq!(h[&X_RATELIMIT_LIMIT], "100", "the refusing policy's, not the IP's");
        assert_eq!(h[&X_RATELIMIT_REMAINING], "0");
        assert_eq!(h[RETRY_AFTER], "2");
        // An allowed policy whose next token is later than Retry-After: capped.
        let slow = headed(Policy::builder("day").label("day").rule(Rule::per_hour("h", 1)));
        insert(&mut h, &slow, &Decision { rule: 0, remaining: 1, ..decision(true, Some(0)) }, NOW);
        assert_eq!(all(&h, &RATELIMIT)[2], r#""day.h";r=1;t=2"#);
        // A second refusal with a longer wait raises Retry-After.
        insert(&mut h, &ip, &Decision { rule: 0, remaining: 0, ..decision(false, Some(4000)) }, NOW);
        assert_eq!(h[RETRY_AFTER], "4");
    }

    #[test]
    fn a_response_map_with_the_services_own_fields_gets_the_same_headers_as_a_fresh_one() {
        let d = Decision { remaining: 3, ..decision(false, Some(1500)) };
        let fresh = for_decision(&policy(), &d, NOW);
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        insert(&mut h, &policy(), &d, NOW);
        h.remove(http::header::CONTENT_TYPE);
        assert_eq!(h, fresh);
    }

    #[test]
    fn one_policy_reached_by_two_views_names_two_members() {
        // Live rules: a key and an address on the same rule, own buckets.
        let rule = headed(Policy::builder("default").label("default").rule(Rule::per_hour("h", 3)));
        let mut h = HeaderMap::new();
        let refused = Decision { rule: 0, remaining: 0, ..decision(false, Some(1500)) };
        insert_view(&mut h, &rule, Some(View::Ip), &refused, NOW);
        insert_view(
            &mut h,
            &rule,
            Some(View::Key),
            &Decision { rule: 0, remaining: 2, ..decision(true, Some(0)) },
            NOW,
        );
        assert_eq!(all(&h, &RATELIMIT_POLICY), [r#""ip.default.h";q=3;w=3600"#, r#""key.default.h";q=3;w=3600"#]);
        assert_eq!(all(&h, &RATELIMIT), [r#""ip.default.h";r=0;t=2"#, r#""key.default.h";r=2;t=2"#]);
        assert_eq!(identifier(rule.policy(), Some(View::Ip), 0), "ip.default.h");
        // Stable: the same names on the next response, and the plain name untouched.
        let again = for_decision(&rule, &Decision { rule: 0, ..decision(true, Some(0)) }, NOW);
        assert_eq!(again[&RATELIMIT_POLICY], r#""default.h";q=3;w=3600"#);
        let mut h2 = HeaderMap::new();
        insert_view(
            &mut h2,
            &rule,
            Some(View::Key),
            &Decision { rule: 0, remaining: 1, ..decision(true, Some(0)) },
            NOW,
        );
        assert_eq!(all(&h2, &RATELIMIT_POLICY), [r#""key.default.h";q=3;w=3600"#]);
    }

    #[test]
    fn every_number_reads_as_itself_from_the_table_and_above_it() {
        for n in (0..=SMALL + 10).chain([99_999, 1_700_000_000, u64::MAX]) {
            assert_eq!(number(n), n.to_string().as_str(), "{n}");
        }
        // The reset value is reused within a second, and changes with it.
        assert_eq!(unix_secs(1_700_000_000), "1700000000");
        assert_eq!(unix_secs(1_700_000_000), "1700000000");
        assert_eq!(unix_secs(1_700_000_001), "1700000001");
        assert_eq!(unix_secs(5), "5");
    }

    #[test]
    fn draft_fields_leave_out_the_legacy_ones_and_retry_after_stays() {
        let p = policy();
        let refused = Decision { remaining: 0, ..decision(false, Some(1500)) };
        let mut h = HeaderMap::new();
        insert_fields(&mut h, &p, None, Fields::Draft, &refused, NOW);
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["ratelimit", "ratelimit-policy", "retry-after"]);
        assert_eq!(h[&RATELIMIT], r#""per_second";r=0;t=2"#);
        assert_eq!(h[RETRY_AFTER], "2");
        // The same fields as the full set, less the three legacy ones.
        let mut full = for_decision(&p, &refused, NOW);
        for legacy in [X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET] {
            full.remove(legacy);
        }
        assert_eq!(h, full);
        // An allowed policy after the refusal still caps its t at Retry-After.
        let slow = headed(Policy::builder("day").label("day").rule(Rule::per_hour("h", 1)));
        insert_fields(
            &mut h,
            &slow,
            None,
            Fields::Draft,
            &Decision { rule: 0, remaining: 1, ..decision(true, Some(0)) },
            NOW,
        );
        assert_eq!(all(&h, &RATELIMIT)[1], r#""day.h";r=1;t=2"#);
    }

    #[test]
    fn retry_after_alone_discloses_no_limit() {
        let p = policy();
        let mut h = HeaderMap::new();
        insert_fields(&mut h, &p, None, Fields::RetryAfter, &decision(true, Some(0)), NOW);
        assert!(h.is_empty(), "an allowed request says nothing");
        // One field; the longest wait of several refusals, never a shorter one.
        for (retry_ms, expected) in [(1500, "2"), (500, "2"), (7000, "7")] {
            let refused = Decision { remaining: 0, ..decision(false, Some(retry_ms)) };
            insert_fields(&mut h, &p, None, Fields::RetryAfter, &refused, NOW);
            assert_eq!(h.len(), 1);
            assert_eq!(h[RETRY_AFTER], expected, "after a refusal of {retry_ms} ms");
        }
    }

    #[test]
    fn a_dry_run_announces_nothing() {
        let dry = headed(Policy::builder("dry").rule(Rule::per_hour("trial", 1).shadow()));
        let d = Decision { rule: 0, ..decision(true, Some(0)) };
        assert!(for_decision(&dry, &d, SystemTime::now()).is_empty());
    }
}
