//! The headers of in-flight limits, beside the rates': `RateLimit-Policy:
//! "concurrent";q=20` for every rule (no `w`: a concurrency limit has no
//! window), `RateLimit: "concurrent";r=5` for the binding rule (slots
//! left), and on a refusal `r=0;t=N` with `Retry-After: N`, N from how
//! fast slots were seen to free ([`ReleaseRate`]). Members are named as a
//! rate policy's are (`view.label.rule`).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use crate::{InflightPolicy, NoPermit, Permit};
use http::header::{HeaderMap, HeaderValue, RETRY_AFTER};

use rl_core::ratelimit_header::{push_limit_member_prefix, push_policy_member};

use super::{
    append_member, ceil_secs, dotted_name, header_u64, insert_legacy, number, raise_retry_after, Fields, View,
    RATELIMIT_POLICY,
};
use crate::http::release::ReleaseRate;

/// An in-flight policy with its headers' fixed parts and the rate its
/// slots were seen to free: made once where the policy is registered (a
/// layer, a compiled rule), so its estimate lives as long as the policy.
#[derive(Debug)]
pub struct InflightHeaders {
    policy: Arc<InflightPolicy>,
    label: Option<Box<str>>,
    releases: ReleaseRate,
    /// Per view (none, key, ip), built on first use.
    announced: [OnceLock<Option<Announced>>; 3],
}

#[derive(Debug)]
struct Announced {
    policy: HeaderValue,
    /// Per rule: `"name";r=`, the start of its member.
    members: Vec<Box<[u8]>>,
    /// Per rule: its limit as a value.
    limits: Vec<HeaderValue>,
}

impl InflightHeaders {
    /// The headers of `policy`, its members named `label.rule` when it has
    /// a label (live rules: the rule id).
    pub fn new(policy: impl Into<Arc<InflightPolicy>>, label: Option<&str>) -> InflightHeaders {
        InflightHeaders {
            policy: policy.into(),
            label: label.map(Into::into),
            releases: ReleaseRate::default(),
            announced: Default::default(),
        }
    }

    /// The policy they announce.
    pub fn policy(&self) -> &InflightPolicy {
        &self.policy
    }

    /// How fast its slots were seen to free on this gateway.
    pub fn releases(&self) -> &ReleaseRate {
        &self.releases
    }

    /// How headers name rule `index` for `view`: `rule`, `label.rule` or
    /// `view.label.rule`.
    pub fn identifier(&self, view: Option<View>, index: usize) -> String {
        let name = self.policy.rule(index).map_or("", |r| r.name());
        dotted_name(view, self.label.as_deref(), name)
    }

    fn announced(&self, view: Option<View>) -> Option<&Announced> {
        self.announced[View::slot(view)]
            .get_or_init(|| {
                let rules = self.policy.rules();
                let mut value = String::new();
                let mut members = Vec::with_capacity(rules.len());
                for rule in rules {
                    if !value.is_empty() {
                        value.push_str(", ");
                    }
                    let name = dotted_name(view, self.label.as_deref(), rule.name());
                    push_policy_member(&mut value, &name, rule.limit(), None, None);
                    let mut member = String::new();
                    push_limit_member_prefix(&mut member, &name);
                    members.push(member.into_bytes().into_boxed_slice());
                }
                let limits = rules.iter().map(|r| number(r.limit())).collect();
                Some(Announced { policy: HeaderValue::from_str(&value).ok()?, members, limits })
            })
            .as_ref()
    }
}

/// What an in-flight decision tells a client: the binding rule, what is in
/// flight in it and its limit, and for a refusal when to come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slots {
    /// Index of the binding rule in the policy's rules.
    pub rule: usize,
    /// Requests in flight in it.
    pub in_flight: u64,
    /// Its limit.
    pub limit: u64,
    /// `None`: the slots were taken; `Some(retry)`: refused, come back
    /// after `retry` (`None`: the cost never fits).
    pub refused: Option<Option<Duration>>,
}

impl Slots {
    /// The slots `permit` holds.
    pub fn held(permit: &Permit) -> Slots {
        Slots { rule: permit.rule(), in_flight: permit.in_flight(), limit: permit.limit(), refused: None }
    }

    /// A refusal, to come back after `headers`' estimate of the next
    /// release ([`ReleaseRate::retry_after`]).
    pub fn refused(no: &NoPermit, headers: &InflightHeaders) -> Slots {
        Slots {
            rule: no.rule,
            in_flight: no.in_flight,
            limit: no.limit,
            refused: Some(headers.releases.retry_after(no)),
        }
    }

    /// A refusal's wait in whole seconds, rounded up and at least 1.
    pub fn retry_secs(&self) -> Option<u64> {
        self.refused.flatten().map(|d| ceil_secs(d).max(1))
    }
}

/// Adds the policy's `RateLimit-Policy` members for `view`, and nothing else.
pub fn announce_inflight(headers: &mut HeaderMap, policy: &InflightHeaders, view: Option<View>) {
    if let Some(announced) = policy.announced(view) {
        headers.append(RATELIMIT_POLICY, announced.policy.clone());
    }
}

/// The numbers of an in-flight decision: the binding rule's `RateLimit`
/// member (slots left, and `t` on a refusal), `Retry-After` on a refusal,
/// and the legacy fields when it leaves fewer than what is there. Its
/// members are announced apart ([`announce_inflight`]); `fresh` as for
/// [`insert_decision`](super::insert_decision).
pub fn insert_inflight(
    headers: &mut HeaderMap,
    policy: &InflightHeaders,
    view: Option<View>,
    fields: Fields,
    slots: &Slots,
    now: SystemTime,
    fresh: bool,
) {
    let retry = slots.retry_secs();
    let present_retry = if fresh { None } else { header_u64(headers, &RETRY_AFTER) };
    if let Some(retry) = retry {
        raise_retry_after(headers, retry, present_retry);
    }
    if fields == Fields::RetryAfter {
        return;
    }
    let Some(announced) = policy.announced(view) else { return };
    let (Some(rule), Some(member)) = (policy.policy.rule(slots.rule), announced.members.get(slots.rule)) else {
        return;
    };
    // The local share of the fallback is never announced above the rule.
    let left = if slots.refused.is_some() { 0 } else { slots.limit.saturating_sub(slots.in_flight) };
    let left = left.min(rule.limit());
    append_member(headers, member, left, retry);
    if fields == Fields::Draft {
        return;
    }
    insert_legacy(headers, rule.limit(), &announced.limits[slots.rule], left, retry, now, fresh);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::headers::{RATELIMIT, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
    use crate::{InflightRule, Source};

    fn reports() -> InflightHeaders {
        let policy = InflightPolicy::builder("rl:reports")
            .rule(InflightRule::new("concurrent", 5, Duration::from_secs(30)))
            .rule(InflightRule::new("heavy", 2, Duration::from_secs(30)))
            .build()
            .unwrap();
        InflightHeaders::new(policy, Some("reports"))
    }

    #[test]
    fn members_are_named_by_view_and_label_and_a_refusal_shows_no_slot_left() {
        let h = reports();
        let mut map = HeaderMap::new();
        announce_inflight(&mut map, &h, Some(View::Key));
        assert_eq!(map[&RATELIMIT_POLICY], r#""key.reports.concurrent";q=5, "key.reports.heavy";q=2"#);
        let held = Slots { rule: 0, in_flight: 3, limit: 5, refused: None };
        insert_inflight(&mut map, &h, Some(View::Key), Fields::DraftAndLegacy, &held, SystemTime::UNIX_EPOCH, true);
        assert_eq!(map[&RATELIMIT], r#""key.reports.concurrent";r=2"#);
        assert_eq!((&map[&X_RATELIMIT_LIMIT], &map[&X_RATELIMIT_REMAINING]), (&number(5), &number(2)));
        assert!(!map.contains_key(RETRY_AFTER));

        // Refused after slots were seen to free in 4 s each, 2 held: 2 s.
        h.releases().observe(Duration::from_secs(4));
        let no = NoPermit {
            rule: 1,
            in_flight: 2,
            limit: 2,
            retry_after: Some(Duration::from_secs(29)),
            source: Source::Redis,
        };
        let refused = Slots::refused(&no, &h);
        assert_eq!(refused.retry_secs(), Some(2));
        let mut map = HeaderMap::new();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        insert_inflight(&mut map, &h, None, Fields::DraftAndLegacy, &refused, now, true);
        assert_eq!(map[&RATELIMIT], r#""reports.heavy";r=0;t=2"#);
        assert_eq!(map[RETRY_AFTER], "2");
        assert_eq!(map[&X_RATELIMIT_REMAINING], "0");
        assert_eq!(map[&X_RATELIMIT_RESET], "102");
        assert_eq!(h.identifier(Some(View::Ip), 1), "ip.reports.heavy");
    }
}
