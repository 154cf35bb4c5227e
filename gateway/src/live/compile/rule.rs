//! One rule compiled: its id, reason and expiry, what an override may be,
//! and its limits made a rate policy (with its headers) and, if it has
//! in-flight limits, an in-flight policy. A rule unchanged since the
//! previous snapshot keeps its policies, so its local state carries over.

use std::sync::Arc;

use crate::http::{InflightHeaders, PolicyHeaders};
use crate::{validate_name, InflightPolicy, InflightRule, Policy, Rule};
use ipnet::IpNet;

use super::global::check_global;
use super::limit::compile_limits;
use super::scope::scope_of;
use super::SetContext;
use crate::live::scaling::Scaling;
use crate::live::snapshot::{CompiledRule, Scope};
use crate::live::spec::{IpTier, Mode, RuleSpec};

/// Checks one rule, pushing every fault found (named with `at`).
pub(super) fn compile_rule(
    spec: &RuleSpec,
    is_override: bool,
    set: &SetContext<'_>,
    at: &str,
    errors: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Option<CompiledRule> {
    let before = errors.len();
    if let Err(why) = validate_name(&spec.id) {
        errors.push(format!("{at}: id {why}"));
    }
    if spec.reason.trim().is_empty() {
        errors.push(format!("{at}: reason is required: why the rule exists (a ticket, an incident)"));
    }
    let scope = scope_of(spec, set, at, errors, warnings);
    let expires = expiry(spec, set, at, errors, warnings);
    if is_override {
        check_override(spec, scope.as_ref(), set, at, errors);
    } else if spec.broad {
        errors.push(format!("{at}: broad is for overrides: a rule file's networks are reviewed with the file"));
    }
    if let Some(global) = &spec.global {
        check_global(global, spec, is_override, at, errors);
    }
    if scope == Some(Scope::Default) && spec.mode == Mode::Enforce && spec.expires.is_some() {
        errors.push(format!("{at}: the enforced default rule cannot expire: every request must find a rule"));
    }
    let (limits, inflight) = compile_limits(spec, at, errors)?;
    let scope = scope?;
    check_ip_tier(spec, &scope, at, errors);
    if errors.len() > before {
        return None;
    }
    let prefix = format!("{}:{}", set.key_prefix, spec.id);
    let previous = set.previous.and_then(|p| p.rule(&spec.id));
    let inflight = inflight_policy(previous, &prefix, &spec.id, inflight, at, errors)?;
    let unchanged =
        previous.filter(|p| p.has_rates() && p.policy().prefix() == prefix && p.policy().rules() == limits.as_slice());
    let rates = match unchanged {
        Some(p) => p.rates.clone(),
        None if limits.is_empty() => None,
        None => Some(rate_policy(&prefix, &spec.id, limits, at, errors)?),
    };
    if let Some(rates) = &rates {
        check_lua(set, rates.policy(), at, errors);
    }
    // A global rule's scaled policies carry over with its policy.
    let scaling = match (&spec.global, &rates) {
        (Some(_), Some(rates)) => {
            Some(unchanged.and_then(|p| p.scaling.clone()).unwrap_or_else(|| Arc::new(Scaling::new(rates.policy()))))
        }
        _ => None,
    };
    Some(CompiledRule {
        id: spec.id.clone(),
        scope,
        mode: spec.mode,
        shared: spec.shared,
        ip_tier: spec.ip_tier,
        fail: spec.fail,
        expires,
        reason: spec.reason.clone(),
        is_override,
        rates,
        inflight,
        global: spec.global.clone(),
        scaling,
    })
}

/// `ip_tier` is for rules a request's address can reach through the tower
/// layer's view by IP (which knows no subject and no plan).
fn check_ip_tier(spec: &RuleSpec, scope: &Scope, at: &str, errors: &mut Vec<String>) {
    if spec.ip_tier == IpTier::Keyless {
        return;
    }
    let reached_by_address =
        matches!(scope, Scope::Default | Scope::Ip(_) | Scope::IpEndpoint { .. } | Scope::Endpoint(_));
    if !reached_by_address {
        errors.push(format!(
            "{at}: ip_tier is for rules a request's address reaches (the default, a network, an endpoint, a network and an endpoint): the view by address has no subject and no plan, so this rule ({scope}) is never reached through it"
        ));
    }
}

/// When the rule stops applying, if it says so.
fn expiry(
    spec: &RuleSpec,
    set: &SetContext<'_>,
    at: &str,
    errors: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Option<std::time::SystemTime> {
    let text = spec.expires.as_ref()?;
    match humantime::parse_rfc3339(text) {
        Ok(when) => {
            // Not refused: a gateway restarting with a file must still
            // load it after one of its rules expired.
            if when <= set.now {
                warnings.push(format!("{at}: expired at {text}: it never applies; remove it"));
            }
            Some(when)
        }
        Err(_) => {
            errors.push(format!("{at}: expires {text:?} is not a UTC time like \"2026-10-28T09:00:00Z\""));
            None
        }
    }
}

/// An override matches one subject or one network (a broad one only when
/// it says so), expires, and is enforced.
fn check_override(spec: &RuleSpec, scope: Option<&Scope>, set: &SetContext<'_>, at: &str, errors: &mut Vec<String>) {
    if !matches!(scope, Some(Scope::Subject(_) | Scope::Ip(_))) {
        errors.push(format!("{at}: an override matches one subject or one ip"));
    }
    if spec.expires.is_none() {
        errors.push(format!("{at}: an override needs expires, so a forgotten one stops by itself"));
    }
    if spec.mode == Mode::Shadow {
        errors.push(format!("{at}: an override is enforced at once; shadow rules belong in the rule file"));
    }
    if let Some(Scope::Ip(net)) = scope {
        let (broad, field) = match net {
            IpNet::V4(_) => (set.broad_ipv4, "broad_ipv4_prefix"),
            IpNet::V6(_) => (set.broad_ipv6, "broad_ipv6_prefix"),
        };
        if net.prefix_len() < broad && !spec.broad {
            errors.push(format!(
                "{at}: ip {net} is broader than /{broad} ({field}): an override outranks every rule for every client in it; if that is meant, say so with broad = true (rlctl: --broad)"
            ));
        }
    }
}

/// The rule's in-flight policy: none without in-flight limits, the
/// previous snapshot's when unchanged, else a new one. `None` (a fault
/// pushed) when it cannot be built.
fn inflight_policy(
    previous: Option<&Arc<CompiledRule>>,
    prefix: &str,
    id: &str,
    rules: Vec<InflightRule>,
    at: &str,
    errors: &mut Vec<String>,
) -> Option<Option<Arc<InflightHeaders>>> {
    if rules.is_empty() {
        return Some(None);
    }
    // Reused with its release rate: what was seen still holds.
    let reused = previous
        .and_then(|p| p.inflight.as_ref())
        .filter(|p| p.policy().prefix() == prefix && p.policy().rules() == rules.as_slice())
        .cloned();
    if reused.is_some() {
        return Some(reused);
    }
    match rules.into_iter().fold(InflightPolicy::builder(prefix), |b, r| b.rule(r)).build() {
        Ok(policy) => Some(Some(Arc::new(InflightHeaders::new(policy, Some(id))))),
        Err(e) => {
            errors.push(format!("{at}: {e}"));
            None
        }
    }
}

/// A new rate policy of `rules`, labelled with the rule `id`, and its
/// headers; `None` (a fault pushed) when it cannot be built.
fn rate_policy(
    prefix: &str,
    id: &str,
    rules: Vec<Rule>,
    at: &str,
    errors: &mut Vec<String>,
) -> Option<Arc<PolicyHeaders>> {
    match rules.into_iter().fold(Policy::builder(prefix).label(id), |b, r| b.rule(r)).build() {
        Ok(policy) => Some(Arc::new(PolicyHeaders::new(policy))),
        Err(e) => {
            errors.push(format!("{at}: {e}"));
            None
        }
    }
}

/// What the Lua backend cannot count, when its bounds apply (its scripts
/// run buckets, windows and quotas, within them).
fn check_lua(set: &SetContext<'_>, policy: &Policy, at: &str, errors: &mut Vec<String>) {
    let Some(why) = set.lua else { return };
    if let Some(beyond) = policy.beyond_lua() {
        errors.push(format!("{at}: a limit the Lua backend cannot count exactly: {beyond}; {why}"));
    }
}
