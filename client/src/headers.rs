//! HTTP headers from a [`Decision`].
//!
//! - `RateLimit-Policy` and `RateLimit` as the IETF httpapi draft
//!   ("RateLimit header fields for HTTP") spells them:
//!   `RateLimit-Policy: "per_minute";q=5000;w=60` for every enforced rule
//!   (`q` its capacity, `w` the seconds it takes to refill from empty), and
//!   `RateLimit: "per_minute";r=42;t=3` for the binding rule (`r` tokens
//!   left, `t` seconds until every bucket of the policy is full again: the
//!   module's reset_after, not the named rule's own).
//! - The legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
//!   `X-RateLimit-Reset` (Unix seconds).
//! - `Retry-After` in whole seconds, rounded up, on refusals only (a wait
//!   of 200 ms says 1, never 0).
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use rl_client::{headers, Decision, Policy, Rule, Source};
//!
//! let policy = Policy::builder("api").rule(Rule::per_minute("per_minute", 5000)).build()?;
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
//! assert_eq!(h["ratelimit"], r#""per_minute";r=0;t=60"#);
//! assert_eq!(h["x-ratelimit-reset"], "1700000060");
//! assert_eq!(h["retry-after"], "1");
//! # Ok::<(), rl_client::Error>(())
//! ```

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::decision::Decision;
use crate::policy::Policy;

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

/// The headers for `decision` on `policy`, at `now` (for the Unix reset time).
pub fn for_decision(policy: &Policy, decision: &Decision, now: SystemTime) -> HeaderMap {
    let mut headers = HeaderMap::new();
    insert(&mut headers, policy, decision, now);
    headers
}

/// Adds the headers to `headers`. A policy of shadow rules only enforces
/// nothing, so it announces nothing.
pub fn insert(headers: &mut HeaderMap, policy: &Policy, decision: &Decision, now: SystemTime) {
    let enforced: Vec<String> = policy
        .rules()
        .iter()
        .filter(|r| !r.is_shadow())
        .map(|r| format!("\"{}\";q={};w={}", r.name(), r.capacity(), r.window_secs()))
        .collect();
    if enforced.is_empty() {
        return;
    }
    let reset_s = ceil_secs(decision.reset_after);
    let binding = policy.rule(decision.rule).map_or("", |r| r.name());
    let unix_now = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let fields = [
        (RATELIMIT_POLICY, enforced.join(", ")),
        (RATELIMIT, format!("\"{binding}\";r={};t={reset_s}", decision.remaining)),
        (X_RATELIMIT_LIMIT, decision.limit.to_string()),
        (X_RATELIMIT_REMAINING, decision.remaining.to_string()),
        (X_RATELIMIT_RESET, ceil_secs(unix_now.saturating_add(decision.reset_after)).to_string()),
    ];
    for (name, value) in fields {
        // Rule names are plain ASCII (checked when the policy was built).
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    if let (false, Some(retry)) = (decision.allowed, decision.retry_after) {
        headers.insert(RETRY_AFTER, HeaderValue::from(ceil_secs(retry).max(1)));
    }
}

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Rule, Source};

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

    fn policy() -> Policy {
        Policy::builder("api")
            .rule(Rule::per_minute("per_minute", 5000))
            .rule(Rule::per_second("per_second", 100).burst(200))
            .rule(Rule::per_hour("trial", 1).shadow())
            .build()
            .unwrap()
    }

    #[test]
    fn allowed_responses_carry_every_header_but_retry_after() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_000_500);
        let h = for_decision(&policy(), &decision(true, Some(0)), now);
        assert_eq!(h[&RATELIMIT_POLICY], r#""per_minute";q=5000;w=60, "per_second";q=200;w=2"#);
        assert_eq!(h[&RATELIMIT], r#""per_second";r=7;t=3"#);
        assert_eq!(h[&X_RATELIMIT_LIMIT], "200");
        assert_eq!(h[&X_RATELIMIT_REMAINING], "7");
        assert_eq!(h[&X_RATELIMIT_RESET], "1000003", "1,000,000.5 s + 2.5 s");
        assert!(!h.contains_key(RETRY_AFTER));
    }

    #[test]
    fn retry_after_is_rounded_up_and_only_on_refusals() {
        let now = SystemTime::UNIX_EPOCH;
        for (ms, secs) in [(1, "1"), (999, "1"), (1000, "1"), (1001, "2"), (59_000, "59")] {
            let h = for_decision(&policy(), &decision(false, Some(ms)), now);
            assert_eq!(h[RETRY_AFTER], secs, "{ms} ms");
        }
        // A cost above capacity never succeeds: no time is promised.
        assert!(!for_decision(&policy(), &decision(false, None), now).contains_key(RETRY_AFTER));
    }

    #[test]
    fn a_dry_run_announces_nothing() {
        let dry = Policy::builder("dry").rule(Rule::per_hour("trial", 1).shadow()).build().unwrap();
        let d = Decision { rule: 0, ..decision(true, Some(0)) };
        assert!(for_decision(&dry, &d, SystemTime::now()).is_empty());
    }
}
