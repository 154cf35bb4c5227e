//! Compiling a rule set: every rule and limit checked, with every fault
//! named, and every rule's limits made a [`Policy`]. What comes out is a
//! [`Snapshot`], indexed for matching (`snapshot.rs`).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use ipnet::{IpNet, Ipv4Net};
use rl_client::{
    period_ms, subject_fault, validate_name, Backend, Error, FailMode, InflightPolicy, InflightRule, Policy, Result,
    Rule,
};
use rl_core::inflight::{InflightParams, MAX_INFLIGHT_LIMIT};
use rl_core::limits::{in_range, MAX_KEYS, MAX_LOG_LIMIT, MAX_PERIOD_MS, MAX_TOKENS};
use rl_core::ParamError;
use rl_http::PolicyHeaders;

use crate::regional::Scaling;
use crate::snapshot::{CompiledRule, Index, Scope, Snapshot};
#[cfg(test)]
use crate::spec::MatchSpec;
use crate::spec::{
    FleetBackend, GlobalSpec, LimitKind, LimitSpec, Mode, RuleSetSpec, RuleSpec, MAX_VERSION, MAX_WRITTEN_VERSION,
};

/// The defaults of a rule set's optional settings.
const DEFAULT_KEY_PREFIX: &str = "rl";
const DEFAULT_IPV4_PREFIX: u8 = 32;
const DEFAULT_IPV6_PREFIX: u8 = 64;
const DEFAULT_BROAD_IPV4_PREFIX: u8 = 16;
const DEFAULT_BROAD_IPV6_PREFIX: u8 = 32;

impl Snapshot {
    /// Checks `spec` and `overrides` together, as a gateway on the backend
    /// the set declares (`backend`, default the module) would load them as
    /// `version`; every fault is named, one per line, in the error.
    pub fn compile(spec: &RuleSetSpec, overrides: &[RuleSpec], version: u64) -> Result<Snapshot> {
        Snapshot::compile_for(spec, overrides, version, Backend::Module)
    }

    /// Like [`Snapshot::compile`], as a gateway on `backend` would load it:
    /// the Lua backend (this one, or the one the set declares) has no
    /// windows and counts buckets exactly only up to burst x period_ms = 2^52.
    pub fn compile_for(spec: &RuleSetSpec, overrides: &[RuleSpec], version: u64, backend: Backend) -> Result<Snapshot> {
        Snapshot::compile_with(spec, overrides, version, backend == Backend::Lua, None)
    }

    /// Compiles for a gateway: `lua` refuses what the Lua backend cannot
    /// count; rules unchanged since `previous` keep their policy, so their
    /// leases and deny-cache entries carry over.
    pub(crate) fn compile_with(
        spec: &RuleSetSpec,
        overrides: &[RuleSpec],
        version: u64,
        lua: bool,
        previous: Option<&Snapshot>,
    ) -> Result<Snapshot> {
        Snapshot::build(spec, overrides, version, lua, previous).map_err(|faults| refused("rule set", &faults))
    }

    /// Checks and compiles; the faults, one per entry, if any.
    pub(crate) fn build(
        spec: &RuleSetSpec,
        overrides: &[RuleSpec],
        version: u64,
        lua: bool,
        previous: Option<&Snapshot>,
    ) -> std::result::Result<Snapshot, Vec<String>> {
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        if version > MAX_VERSION {
            errors.push(format!("version {version} is above {MAX_VERSION} (2^53 - 1), the largest a version may be"));
        }
        if let Some(written) = spec.version.filter(|&v| v > MAX_WRITTEN_VERSION) {
            errors.push(format!(
                "version {written} leaves no room for later changes: a rule file names at most version {MAX_WRITTEN_VERSION} (2^52), and the store counts on to {MAX_VERSION}"
            ));
        }
        let key_prefix = spec.key_prefix.as_deref().unwrap_or(DEFAULT_KEY_PREFIX);
        if key_prefix.is_empty()
            || key_prefix.len() > 64
            || key_prefix.contains(['{', '}'])
            || key_prefix.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            errors.push(format!(
                "key_prefix must be 1 to 64 characters without '{{', '}}' or spaces, got {key_prefix:?}"
            ));
        }
        let ipv4_prefix = spec.ipv4_prefix.unwrap_or(DEFAULT_IPV4_PREFIX);
        let ipv6_prefix = spec.ipv6_prefix.unwrap_or(DEFAULT_IPV6_PREFIX);
        let broad_ipv4 = spec.broad_ipv4_prefix.unwrap_or(DEFAULT_BROAD_IPV4_PREFIX);
        let broad_ipv6 = spec.broad_ipv6_prefix.unwrap_or(DEFAULT_BROAD_IPV6_PREFIX);
        for (field, value, min, max) in [
            ("ipv4_prefix", ipv4_prefix, 1, 32),
            ("ipv6_prefix", ipv6_prefix, 1, 128),
            ("broad_ipv4_prefix", broad_ipv4, 0, 32),
            ("broad_ipv6_prefix", broad_ipv6, 0, 128),
        ] {
            if let Err(e) = in_range(field, value.into(), min, max) {
                errors.push(out_of_range(e));
            }
        }
        let declared = spec.backend.unwrap_or_default();
        let lua = match (lua, declared) {
            (_, FleetBackend::Lua) => Some("the rule set declares backend = \"lua\""),
            (true, FleetBackend::Module) => Some(
                "this gateway runs the Lua backend (declare backend = \"lua\" in the rule file, so publishing refuses this)",
            ),
            (false, FleetBackend::Module) => None,
        };
        let now = SystemTime::now();
        let set = SetContext { key_prefix, ipv4_prefix, ipv6_prefix, broad_ipv4, broad_ipv6, lua, previous, now };
        let written = spec.rules.iter().enumerate().map(|(i, r)| (i, r, false));
        let added = overrides.iter().enumerate().map(|(i, r)| (i, r, true));
        let mut rules: Vec<Arc<CompiledRule>> = Vec::new();
        for (i, spec, is_override) in written.chain(added) {
            let label = match (spec.id.is_empty(), is_override) {
                (true, false) => format!("rule {}", i + 1),
                (true, true) => format!("override {}", i + 1),
                (false, false) => format!("rule '{}'", spec.id),
                (false, true) => format!("override '{}'", spec.id),
            };
            let before = errors.len();
            let rule = compile_rule(spec, is_override, &set, &label, &mut errors, &mut warnings);
            if let (Some(rule), true) = (rule, errors.len() == before) {
                rules.push(Arc::new(rule));
            }
        }
        if spec.rules.is_empty() {
            errors.push("the rule set has no rules".to_owned());
        }
        let index = Index::build(&rules, now, &mut errors);
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Snapshot { version, rules, index, ipv4_prefix, ipv6_prefix, warnings })
    }
}

/// `what` (a rule set, an override) refused, with every fault on its own line.
pub(crate) fn refused(what: &str, faults: &[String]) -> Error {
    Error::Rules(format!("{what} rejected: {}", faults.join("\n")))
}

/// An address or a network as the rules mean it: an address is its /32 or
/// /128, and an IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) is the
/// IPv4 network it holds (`10.0.0.0/8`), as a dual-stack client's address
/// is its IPv4 address. Host bits are kept, for the caller to refuse.
pub fn parse_network(text: &str) -> Option<IpNet> {
    let net = text.parse::<IpNet>().or_else(|_| text.parse::<IpAddr>().map(IpNet::from)).ok()?;
    Some(match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => IpNet::V4(Ipv4Net::new(v4, v6.prefix_len() - 96).ok()?),
            None => net,
        },
        _ => net,
    })
}

struct SetContext<'a> {
    key_prefix: &'a str,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
    broad_ipv4: u8,
    broad_ipv6: u8,
    /// Why the Lua backend's bounds apply, if they do.
    lua: Option<&'static str>,
    previous: Option<&'a Snapshot>,
    now: SystemTime,
}

/// Checks one rule, pushing every fault found (named with `at`).
fn compile_rule(
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
    let expires = match &spec.expires {
        None => None,
        Some(text) => match humantime::parse_rfc3339(text) {
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
        },
    };
    if is_override {
        if !matches!(scope, Some(Scope::Subject(_) | Scope::Ip(_))) {
            errors.push(format!("{at}: an override matches one subject or one ip"));
        }
        if spec.expires.is_none() {
            errors.push(format!("{at}: an override needs expires, so a forgotten one stops by itself"));
        }
        if spec.mode == Mode::Shadow {
            errors.push(format!("{at}: an override is enforced at once; shadow rules belong in the rule file"));
        }
        if let Some(Scope::Ip(net)) = &scope {
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
    } else if spec.broad {
        errors.push(format!("{at}: broad is for overrides: a rule file's networks are reviewed with the file"));
    }
    if let Some(global) = &spec.global {
        check_global(global, spec, is_override, at, errors);
    }
    if scope == Some(Scope::Default) && spec.mode == Mode::Enforce && spec.expires.is_some() {
        errors.push(format!("{at}: the enforced default rule cannot expire: every request must find a rule"));
    }
    if spec.limits.is_empty() || spec.limits.len() > MAX_KEYS {
        errors.push(format!("{at}: limits: a rule has 1 to {MAX_KEYS} limits, got {}", spec.limits.len()));
        // Not checked one by one: the duplicate check compares each with each.
        return None;
    }
    let mut limits = Vec::with_capacity(spec.limits.len());
    let mut inflight = Vec::new();
    for (j, limit) in spec.limits.iter().enumerate() {
        let lat = if limit.name.is_empty() {
            format!("{at} limit {}", j + 1)
        } else {
            format!("{at} limit '{}'", limit.name)
        };
        if spec.limits[..j].iter().any(|other| other.name == limit.name) {
            errors.push(format!("{lat}: the name is used twice in the rule"));
        }
        match compile_limit(limit, &lat, errors) {
            Some(Limit::Rate(mut rule)) => {
                if spec.fail == FailMode::Closed {
                    rule = rule.fail_closed();
                }
                if spec.mode == Mode::Shadow {
                    rule = rule.shadow();
                }
                limits.push(rule);
            }
            Some(Limit::Inflight(mut rule)) => {
                if spec.fail == FailMode::Closed {
                    rule = rule.fail_closed();
                }
                inflight.push(rule);
            }
            None => {}
        }
    }
    let has_inflight = spec.limits.iter().any(|l| l.kind == LimitKind::Inflight);
    if has_inflight && spec.mode == Mode::Shadow {
        errors.push(format!(
            "{at}: in-flight limits are enforced only: a shadow rule would hold slots it never refuses with; keep them in the enforced rule"
        ));
    }
    if spec.limits.iter().all(|l| l.kind == LimitKind::Inflight) {
        errors.push(format!(
            "{at}: a rule needs a rate limit (bucket, window, exact or quota) beside its in-flight limits: LiveRules::check decides by it"
        ));
    }
    let scope = scope?;
    if errors.len() > before {
        return None;
    }
    let prefix = format!("{}:{}", set.key_prefix, spec.id);
    let inflight = if inflight.is_empty() {
        None
    } else {
        let reused = set
            .previous
            .and_then(|p| p.rule(&spec.id))
            .and_then(|p| p.inflight.as_ref())
            .filter(|p| p.prefix() == prefix && p.rules() == inflight.as_slice())
            .cloned();
        match reused {
            Some(policy) => Some(policy),
            None => {
                let built = inflight.into_iter().fold(InflightPolicy::builder(prefix.clone()), |b, r| b.rule(r));
                match built.build() {
                    Ok(policy) => Some(policy),
                    Err(e) => {
                        errors.push(format!("{at}: {e}"));
                        return None;
                    }
                }
            }
        }
    };
    let unchanged = set
        .previous
        .and_then(|p| p.rule(&spec.id))
        .filter(|p| p.policy().prefix() == prefix && p.policy().rules() == limits.as_slice());
    let reused = unchanged.map(|p| p.headers.clone());
    let headers = match reused {
        Some(headers) => headers,
        None => {
            let built = limits.into_iter().fold(Policy::builder(prefix).label(&spec.id), |b, r| b.rule(r)).build();
            match built {
                Ok(policy) => Arc::new(PolicyHeaders::new(policy)),
                Err(e) => {
                    errors.push(format!("{at}: {e}"));
                    return None;
                }
            }
        }
    };
    let policy = headers.policy();
    if let Some(why) = set.lua {
        if policy.has_windows() {
            errors.push(format!("{at}: window and quota limits need the module (RL.WINDOW); {why}"));
        }
        if !policy.fits_lua() {
            errors.push(format!(
                "{at}: a limit's burst x period in ms is above 2^52: the Lua backend cannot count it exactly; {why}"
            ));
        }
    }
    // A global rule's scaled policies carry over with its policy.
    let scaling = spec
        .global
        .as_ref()
        .map(|_| unchanged.and_then(|p| p.scaling.clone()).unwrap_or_else(|| Arc::new(Scaling::new(policy))));
    Some(CompiledRule {
        id: spec.id.clone(),
        scope,
        mode: spec.mode,
        shared: spec.shared,
        expires,
        reason: spec.reason.clone(),
        is_override,
        headers,
        inflight,
        global: spec.global.clone(),
        scaling,
    })
}

/// Checks a rule's `global` field, naming the field at fault.
fn check_global(g: &GlobalSpec, spec: &RuleSpec, is_override: bool, at: &str, errors: &mut Vec<String>) {
    let at = format!("{at}: global");
    if is_override {
        errors.push(format!(
            "{at}: an override is enforced as written in every region at once; global limits belong in the rule file"
        ));
    }
    if g.regions.is_empty() {
        errors.push(format!("{at}.regions: name at least one region, like [\"eu\", \"us\"]"));
    }
    for (i, region) in g.regions.iter().enumerate() {
        if let Err(why) = validate_name(region) {
            errors.push(format!("{at}.regions: region {} {why}", i + 1));
        } else if g.regions[..i].contains(region) {
            errors.push(format!("{at}.regions: {region:?} is named twice"));
        }
    }
    let n = g.regions.len().max(1) as f64;
    if !g.floor.is_finite() || g.floor < 0.0 || g.floor * n > 1.0 + 1e-9 {
        errors.push(format!(
            "{at}.floor: the fraction each region always keeps is 0 to 1/{} ({:.4}) for {} regions, got {}",
            n,
            1.0 / n,
            g.regions.len(),
            g.floor
        ));
    }
    if let Some(weights) = &g.weights {
        if weights.len() != g.regions.len() {
            errors.push(format!(
                "{at}.weights: one weight per region: {} weights for {} regions",
                weights.len(),
                g.regions.len()
            ));
        } else if weights.iter().all(|&w| w == 0) {
            errors.push(format!("{at}.weights: all 0: at least one region must have a positive weight"));
        }
    }
    for limit in spec.limits.iter().filter(|l| l.kind != LimitKind::Bucket) {
        errors.push(format!(
            "{at}: limit '{}' is a {}: a global rule's limits are buckets, whose share can move between regions at any moment; a window's count cannot (for a daily quota across regions, add gateway counts in batches: rl-balancer's README)",
            limit.name,
            limit.kind.name()
        ));
    }
}

fn scope_of(
    spec: &RuleSpec,
    set: &SetContext<'_>,
    at: &str,
    errors: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Option<Scope> {
    let m = &spec.scope;
    let named = |what: &str, value: &Option<String>, errors: &mut Vec<String>| -> Option<String> {
        let v = value.as_ref()?;
        if v.is_empty() || v.len() > 512 || v.chars().any(char::is_control) {
            errors
                .push(format!("{at}: match.{what} must be 1 to 512 characters without control characters, got {v:?}"));
        }
        Some(v.clone())
    };
    match (&m.subject, &m.ip, &m.plan, &m.endpoint) {
        (None, None, None, None) => Some(Scope::Default),
        (Some(s), None, None, None) => {
            if let Some(why) = subject_fault(s) {
                errors.push(format!("{at}: match.{why}"));
                return None;
            }
            Some(Scope::Subject(s.clone()))
        }
        (None, Some(ip), None, None) => ip_scope(ip, set, at, errors, warnings).map(Scope::Ip),
        (None, None, plan, endpoint) => {
            let plan = named("plan", plan, errors);
            let endpoint = named("endpoint", endpoint, errors);
            Some(match (plan, endpoint) {
                (Some(plan), Some(endpoint)) => Scope::PlanEndpoint { plan, endpoint },
                (Some(plan), None) => Scope::Plan(plan),
                (None, Some(endpoint)) => Scope::Endpoint(endpoint),
                (None, None) => Scope::Default,
            })
        }
        _ => {
            errors.push(format!(
                "{at}: match.subject and match.ip stand alone: a rule matches one subject, one network, or a plan and/or an endpoint"
            ));
            None
        }
    }
}

fn ip_scope(
    text: &str,
    set: &SetContext<'_>,
    at: &str,
    errors: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Option<IpNet> {
    let Some(net) = parse_network(text) else {
        errors.push(format!(
            "{at}: match.ip {text:?} is not an address or a network like \"203.0.113.0/24\" or \"2001:db8::/48\""
        ));
        return None;
    };
    if net != net.trunc() {
        errors.push(format!("{at}: match.ip {text} has host bits set: the network is {}", net.trunc()));
        return None;
    }
    if matches!(net, IpNet::V4(_)) && text.contains(':') {
        warnings.push(format!("{at}: match.ip {text} is IPv4-mapped: it matches the IPv4 network {net}"));
    }
    let (group, family) = match net {
        IpNet::V4(_) => (set.ipv4_prefix, "ipv4_prefix"),
        IpNet::V6(_) => (set.ipv6_prefix, "ipv6_prefix"),
    };
    if net.prefix_len() > group {
        errors.push(format!(
            "{at}: match.ip {net} is narrower than {family} /{group}: the addresses of one /{group} are one client"
        ));
        return None;
    }
    Some(net)
}

/// One limit compiled: a rule of the rate policy, or an in-flight rule.
enum Limit {
    Rate(Rule),
    Inflight(InflightRule),
}

fn compile_limit(limit: &LimitSpec, at: &str, errors: &mut Vec<String>) -> Option<Limit> {
    if let Err(why) = validate_name(&limit.name) {
        errors.push(format!("{at}: name {why}"));
    }
    if limit.kind == LimitKind::Inflight {
        return compile_inflight(limit, at, errors).map(Limit::Inflight);
    }
    if limit.timeout.is_some() {
        errors
            .push(format!("{at}: timeout is for in-flight limits (kind = \"inflight\"); this limit counts every per"));
    }
    let per = match humantime::parse_duration(&limit.per) {
        _ if limit.per.is_empty() => {
            errors.push(format!("{at}: per is required: the period, like \"1s\", \"15m\", \"1d\""));
            None
        }
        Ok(per) if period_ms(per).is_ok() => Some(per),
        Ok(_) => {
            let days = MAX_PERIOD_MS / 86_400_000;
            errors.push(format!("{at}: per must be whole milliseconds from 1ms to {days}d, got {:?}", limit.per));
            None
        }
        Err(e) => {
            errors.push(format!("{at}: per {:?} is not a duration like \"1s\", \"15m\", \"1d\" ({e})", limit.per));
            None
        }
    };
    let count = |what: &'static str, value: u64, max: u64, errors: &mut Vec<String>| {
        if let Err(e) = in_range(what, value, 1, max) {
            errors.push(format!("{at}: {}", out_of_range(e)));
        }
    };
    let rule = match limit.kind.window_mode() {
        None => {
            let Some(rate) = limit.rate else {
                errors.push(format!("{at}: a bucket needs rate (tokens every per), and takes burst; not limit"));
                return None;
            };
            if limit.limit.is_some() {
                errors.push(format!("{at}: a bucket takes rate and burst, not limit"));
            }
            count("rate", rate, MAX_TOKENS, errors);
            // Without its own burst, a bad rate is reported once.
            if let Some(burst) = limit.burst {
                count("burst", burst, MAX_TOKENS, errors);
            }
            let burst = limit.burst.unwrap_or(rate);
            Rule::new(limit.name.clone(), burst, rate, per?)
        }
        Some(mode) => {
            let word = match limit.kind {
                LimitKind::Exact => "exact window",
                LimitKind::Quota => "quota",
                _ => "window",
            };
            let Some(n) = limit.limit else {
                errors.push(format!("{at}: a {word} needs limit (requests every per); not rate"));
                return None;
            };
            if limit.rate.is_some() || limit.burst.is_some() {
                errors.push(format!("{at}: a {word} takes limit, not rate or burst"));
            }
            // An EXACT limit above the server's max-log-limit is the
            // server's to refuse.
            count("limit", n, mode.max_limit(MAX_LOG_LIMIT), errors);
            Rule::window(limit.name.clone(), n, per?, mode)
        }
    };
    Some(Limit::Rate(rule))
}

/// An in-flight limit: `limit` at once, each slot held at most `timeout`,
/// checked by the module's own [`InflightParams`].
fn compile_inflight(limit: &LimitSpec, at: &str, errors: &mut Vec<String>) -> Option<InflightRule> {
    if limit.rate.is_some() || limit.burst.is_some() || !limit.per.is_empty() {
        errors.push(format!("{at}: an in-flight limit takes limit and timeout, not rate, burst or per"));
    }
    let Some(n) = limit.limit else {
        errors.push(format!("{at}: an in-flight limit needs limit (requests at once)"));
        return None;
    };
    let Some(text) = &limit.timeout else {
        errors.push(format!(
            "{at}: an in-flight limit needs timeout: how long a slot is held at most, like \"30s\" (above the endpoint's p99.9)"
        ));
        return None;
    };
    let timeout = match humantime::parse_duration(text) {
        Ok(timeout) if timeout.subsec_nanos() % 1_000_000 == 0 => timeout,
        Ok(_) => {
            errors.push(format!("{at}: timeout must be whole milliseconds, got {text:?}"));
            return None;
        }
        Err(e) => {
            errors.push(format!("{at}: timeout {text:?} is not a duration like \"30s\", \"2m\" ({e})"));
            return None;
        }
    };
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    // A limit above the server's max-inflight-limit is the server's to refuse.
    let fault = |e: ParamError| match e.field {
        "timeout_ms" => format!("{at}: timeout {text:?}: {}", out_of_range(e)),
        _ => format!("{at}: {}", out_of_range(e)),
    };
    match InflightParams::new(n, ms, MAX_INFLIGHT_LIMIT) {
        Ok(_) => Some(InflightRule::new(limit.name.clone(), n, timeout)),
        Err(e) => {
            // The limit is checked first: a bad timeout beside it is named too.
            let timeout_fault = (e.field == "limit").then(|| InflightParams::new(1, ms, MAX_INFLIGHT_LIMIT).err());
            errors.push(fault(e));
            errors.extend(timeout_fault.flatten().map(fault));
            None
        }
    }
}
/// A count out of range, in the words rule files have always used.
fn out_of_range(e: ParamError) -> String {
    format!("{} must be from {} to {}, got {}", e.field, e.min, e.max, e.value)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn set(toml: &str) -> RuleSetSpec {
        RuleSetSpec::from_toml(toml).unwrap()
    }

    const BASE: &str = r#"
        [[rules]]
        id = "default"
        reason = "r"
        limits = [{ name = "s", rate = 10, per = "1s" }]
        [[rules]]
        id = "pro"
        match = { plan = "pro" }
        reason = "r"
        limits = [{ name = "s", rate = 20, per = "1s" }]
    "#;

    #[test]
    fn unchanged_rules_keep_their_local_state_across_versions() {
        let v1 = Snapshot::compile(&set(BASE), &[], 1).unwrap();
        let changed = BASE.replace("rate = 20", "rate = 30");
        let v2 = Snapshot::compile_with(&set(&changed), &[], 2, false, Some(&v1)).unwrap();
        let same = |id: &str| v1.rule(id).unwrap().policy().shares_state_with(v2.rule(id).unwrap().policy());
        assert!(same("default"), "same limits: same leases and deny cache");
        assert!(!same("pro"), "new limits start fresh");
    }

    /// `toml` (BASE, changed) with the pro rule's limits replaced by `limits`.
    fn pro_limits(toml: &str, limits: &str) -> RuleSetSpec {
        set(&toml.replace("limits = [{ name = \"s\", rate = 20, per = \"1s\" }]", &format!("limits = [{limits}]")))
    }

    #[test]
    fn in_flight_limits_compile_beside_the_rate_policy() {
        let limits =
            r#"{ name = "s", rate = 20, per = "1s" }, { name = "c", kind = "inflight", limit = 20, timeout = "30s" }"#;
        let spec = pro_limits(BASE, limits);
        let v1 = Snapshot::compile(&spec, &[], 1).unwrap();
        let pro = v1.rule("pro").unwrap();
        assert_eq!(pro.policy().rules().len(), 1, "the in-flight limit is not a rate");
        let inflight = pro.inflight().unwrap();
        assert_eq!(inflight.prefix(), "rl:pro");
        assert_eq!(inflight.keys("k").unwrap(), ["rl:pro:{k}:c"]);
        let rule = &inflight.rules()[0];
        assert_eq!((rule.name(), rule.limit(), rule.timeout()), ("c", 20, Duration::from_secs(30)));
        assert_eq!(rule.fail_mode(), FailMode::Open);
        assert!(v1.rule("default").unwrap().inflight().is_none());
        // The Lua backend has in-flight limits too (inflight.lua).
        assert!(Snapshot::compile_for(&spec, &[], 1, Backend::Lua).is_ok());
        let closed = BASE.replace("match = { plan = \"pro\" }", "match = { plan = \"pro\" }\nfail = \"closed\"");
        let closed = Snapshot::compile(&pro_limits(&closed, limits), &[], 1).unwrap();
        assert_eq!(closed.rule("pro").unwrap().inflight().unwrap().rules()[0].fail_mode(), FailMode::Closed);
    }

    #[test]
    fn bad_in_flight_limits_are_named_in_the_module_words() {
        let e = |limits: &str| Snapshot::compile(&pro_limits(BASE, limits), &[], 1).unwrap_err().to_string();
        let rate = r#"{ name = "s", rate = 20, per = "1s" }, "#;
        let at = "rule 'pro' limit 'c': ";
        let cases = [
            (
                r#"{ name = "c", kind = "inflight", limit = 20, timeout = "800d" }"#,
                "timeout \"800d\": timeout_ms must be from 1 to 63072000000, got 69120000000",
            ),
            (
                r#"{ name = "c", kind = "inflight", limit = 20, timeout = "0s" }"#,
                "timeout \"0s\": timeout_ms must be from 1 to 63072000000, got 0",
            ),
            (
                r#"{ name = "c", kind = "inflight", limit = 0, timeout = "30s" }"#,
                "limit must be from 1 to 100000, got 0",
            ),
            (
                r#"{ name = "c", kind = "inflight", limit = 100001, timeout = "30s" }"#,
                "limit must be from 1 to 100000, got 100001",
            ),
            (
                r#"{ name = "c", kind = "inflight", limit = 20, timeout = "soon" }"#,
                "timeout \"soon\" is not a duration like \"30s\"",
            ),
            (
                r#"{ name = "c", kind = "inflight", limit = 20, timeout = "1500us" }"#,
                "timeout must be whole milliseconds, got \"1500us\"",
            ),
            (r#"{ name = "c", kind = "inflight", limit = 20 }"#, "an in-flight limit needs timeout"),
            (
                r#"{ name = "c", kind = "inflight", timeout = "30s" }"#,
                "an in-flight limit needs limit (requests at once)",
            ),
            (
                r#"{ name = "c", kind = "inflight", limit = 2, timeout = "3s", per = "1s" }"#,
                "an in-flight limit takes limit and timeout, not rate, burst or per",
            ),
            (
                r#"{ name = "c", rate = 2, per = "1s", timeout = "3s" }"#,
                "timeout is for in-flight limits (kind = \"inflight\")",
            ),
            (r#"{ name = "c", rate = 2 }"#, "per is required: the period"),
        ];
        for (limit, fault) in cases {
            let text = e(&format!("{rate}{limit}"));
            assert!(text.contains(&format!("{at}{fault}")), "{limit}: {text}");
        }
        // Both faults of one limit are named.
        let text = e(&format!("{rate}{{ name = \"c\", kind = \"inflight\", limit = 0, timeout = \"0s\" }}"));
        assert!(
            text.contains("limit must be from 1 to 100000, got 0") && text.contains("timeout_ms must be from 1"),
            "{text}"
        );
        let text = e(r#"{ name = "c", kind = "inflight", limit = 2, timeout = "3s" }"#);
        assert!(
            text.contains(
                "rule 'pro': a rule needs a rate limit (bucket, window, exact or quota) beside its in-flight limits"
            ),
            "{text}"
        );
        let text = e(&format!("{rate}{{ name = \"s\", kind = \"inflight\", limit = 2, timeout = \"3s\" }}"));
        assert!(text.contains("rule 'pro' limit 's': the name is used twice in the rule"), "{text}");
        let shadow =
            BASE.replace("match = { plan = \"pro\" }", "match = { plan = \"pro\" }\nmode = \"shadow\"").replace(
                "rate = 20, per = \"1s\" }",
                "rate = 20, per = \"1s\" }, { name = \"c\", kind = \"inflight\", limit = 2, timeout = \"3s\" }",
            );
        let text = Snapshot::compile(&set(&shadow), &[], 1).unwrap_err().to_string();
        assert!(text.contains("rule 'pro': in-flight limits are enforced only"), "{text}");
    }

    #[test]
    fn set_wide_faults_are_named() {
        let e =
            |toml: &str, overrides: &[RuleSpec]| Snapshot::compile(&set(toml), overrides, 1).unwrap_err().to_string();
        let no_default = BASE.replacen("id = \"default\"", "id = \"d\"\nmatch = { plan = \"free\" }", 1);
        assert!(e(&no_default, &[]).contains("needs a default rule (no match) in enforce mode"));
        let twice = format!("{BASE}\n[[rules]]\nid = \"pro2\"\nmatch = {{ plan = \"pro\" }}\nreason = \"r\"\nlimits = [{{ name = \"s\", rate = 1, per = \"1s\" }}]");
        assert!(e(&twice, &[]).contains("rules 'pro' and 'pro2' both match plan \"pro\" in enforce mode"));
        let shadow_beside = twice.replace("id = \"pro2\"", "id = \"pro2\"\nmode = \"shadow\"");
        assert!(Snapshot::compile(&set(&shadow_beside), &[], 1).is_ok(), "one shadow rule beside the enforced one");
        let mixed = BASE.replace("match = { plan = \"pro\" }", "match = { plan = \"pro\", subject = \"k\" }");
        assert!(e(&mixed, &[]).contains("rule 'pro': match.subject and match.ip stand alone"));
        let narrow = BASE.replace("match = { plan = \"pro\" }", "match = { ip = \"2001:db8::/80\" }");
        assert!(e(&narrow, &[]).contains("narrower than ipv6_prefix /64"));
        let expiring_default = BASE.replacen("reason = \"r\"", "reason = \"r\"\nexpires = \"2030-01-01T00:00:00Z\"", 1);
        assert!(e(&expiring_default, &[]).contains("rule 'default': the enforced default rule cannot expire"));
        let plan_override = RuleSpec {
            id: "o".into(),
            scope: MatchSpec { plan: Some("pro".into()), ..MatchSpec::default() },
            limits: set(BASE).rules[0].limits.clone(),
            reason: "r".into(),
            ..RuleSpec::default()
        };
        let text = e(BASE, &[plan_override]);
        assert!(text.contains("override 'o': an override matches one subject or one ip"), "{text}");
        assert!(text.contains("override 'o': an override needs expires"), "{text}");
    }

    #[test]
    fn the_lua_backend_refuses_windows_at_load() {
        let quota = BASE.replace(
            "{ name = \"s\", rate = 20, per = \"1s\" }",
            "{ name = \"d\", kind = \"quota\", limit = 5, per = \"1d\" }",
        );
        assert!(Snapshot::compile(&set(&quota), &[], 1).is_ok());
        let e = Snapshot::compile_for(&set(&quota), &[], 1, Backend::Lua).unwrap_err().to_string();
        assert!(e.contains("rule 'pro': window and quota limits need the module"), "{e}");
    }

    fn ip_override(net: &str, broad: bool) -> RuleSpec {
        RuleSpec {
            id: "o".into(),
            scope: MatchSpec { ip: Some(net.into()), ..MatchSpec::default() },
            limits: set(BASE).rules[0].limits.clone(),
            expires: Some("2999-01-01T00:00:00Z".into()),
            broad,
            reason: "r".into(),
            ..RuleSpec::default()
        }
    }

    #[test]
    fn a_broad_network_override_needs_broad() {
        for net in ["0.0.0.0/0", "10.0.0.0/15", "::/0", "2001:db8::/31"] {
            let e = Snapshot::compile(&set(BASE), &[ip_override(net, false)], 1).unwrap_err().to_string();
            assert!(
                e.contains(&format!("override 'o': ip {net} is broader than /")) && e.contains("broad = true"),
                "{e}"
            );
            assert!(Snapshot::compile(&set(BASE), &[ip_override(net, true)], 1).is_ok(), "{net} with broad");
        }
        for net in ["10.0.0.0/16", "2001:db8::/32"] {
            assert!(Snapshot::compile(&set(BASE), &[ip_override(net, false)], 1).is_ok(), "{net}");
        }
        // The bound is the set's to configure.
        let wide = format!("broad_ipv4_prefix = 8\n{BASE}");
        assert!(Snapshot::compile(&set(&wide), &[ip_override("10.0.0.0/8", false)], 1).is_ok());
        let file_rule = BASE.replace("match = { plan = \"pro\" }", "match = { ip = \"10.0.0.0/8\" }\nbroad = true");
        let e = Snapshot::compile(&set(&file_rule), &[], 1).unwrap_err().to_string();
        assert!(e.contains("rule 'pro': broad is for overrides"), "{e}");
    }

    #[test]
    fn an_expired_rule_is_named_when_it_loads_and_when_it_blocks() {
        let expired = BASE.replace(
            "reason = \"r\"\n        limits = [{ name = \"s\", rate = 20",
            "reason = \"r\"\n        expires = \"2020-01-01T00:00:00Z\"\n        limits = [{ name = \"s\", rate = 20",
        );
        let snapshot = Snapshot::compile(&set(&expired), &[], 1).unwrap();
        assert_eq!(snapshot.warnings(), ["rule 'pro': expired at 2020-01-01T00:00:00Z: it never applies; remove it"]);
        assert!(Snapshot::compile(&set(BASE), &[], 1).unwrap().warnings().is_empty());
        let beside = format!("{expired}\n[[rules]]\nid = \"pro2\"\nmatch = {{ plan = \"pro\" }}\nreason = \"r\"\nlimits = [{{ name = \"s\", rate = 1, per = \"1s\" }}]");
        let e = Snapshot::compile(&set(&beside), &[], 1).unwrap_err().to_string();
        assert!(e.contains("rules 'pro' and 'pro2' both match plan \"pro\" in enforce mode: one rule of each mode per match; 'pro' expired at 2020-01-01T00:00:00Z: remove it"), "{e}");
    }

    #[test]
    fn networks_are_compared_as_networks() {
        // One network written two ways: one match, refused as a pair.
        let two = BASE.replace("match = { plan = \"pro\" }", "match = { ip = \"10.1.2.3\" }")
            + "\n[[rules]]\nid = \"b\"\nmatch = { ip = \"10.1.2.3/32\" }\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 1, per = \"1s\" }]";
        let e = Snapshot::compile(&set(&two), &[], 1).unwrap_err().to_string();
        assert!(e.contains("rules 'pro' and 'b' both match ip 10.1.2.3/32"), "{e}");
        // An IPv4-mapped network is the IPv4 network, whatever ipv6_prefix.
        let mapped = format!(
            "ipv6_prefix = 128\n{}",
            BASE.replace("match = { plan = \"pro\" }", "match = { ip = \"::ffff:10.0.0.0/104\" }")
        );
        let snapshot = Snapshot::compile(&set(&mapped), &[], 1).unwrap();
        assert_eq!(snapshot.rule("pro").unwrap().scope(), &Scope::Ip("10.0.0.0/8".parse().unwrap()));
        assert!(snapshot.warnings()[0].contains("is IPv4-mapped: it matches the IPv4 network 10.0.0.0/8"));
        let request = crate::Request::new().ip("10.9.9.9".parse().unwrap());
        assert_eq!(snapshot.matching(&request, SystemTime::now()).enforced.id(), "pro");
        let mapped_client = crate::Request::new().ip("::ffff:10.9.9.9".parse().unwrap());
        assert_eq!(snapshot.matching(&mapped_client, SystemTime::now()).enforced.id(), "pro");
        assert_eq!(parse_network("::ffff:10.1.2.3"), Some("10.1.2.3/32".parse().unwrap()));
        assert_eq!(parse_network("::/0"), Some("::/0".parse().unwrap()), "not mapped: stays IPv6");
    }

    #[test]
    fn a_written_version_leaves_room_for_changes() {
        let at = |v: u64| RuleSetSpec { version: Some(v), ..set(BASE) };
        assert!(Snapshot::compile(&at(MAX_WRITTEN_VERSION), &[], MAX_WRITTEN_VERSION).is_ok());
        let e = Snapshot::compile(&at(MAX_VERSION), &[], MAX_VERSION).unwrap_err().to_string();
        assert!(
            e.contains("version 9007199254740991 leaves no room for later changes")
                && e.contains("at most version 4503599627370496"),
            "{e}"
        );
        // The store's own versions go on to the largest.
        assert!(Snapshot::compile(&set(BASE), &[], MAX_VERSION).is_ok());
    }

    #[test]
    fn a_set_declared_for_lua_is_checked_for_lua_everywhere() {
        let lua = format!("backend = \"lua\"\n{BASE}");
        let quota = RuleSpec {
            id: "o".into(),
            scope: MatchSpec { subject: Some("k".into()), ..MatchSpec::default() },
            limits: vec![LimitSpec::parse_short("daily=1000/1d,quota").unwrap()],
            expires: Some("2999-01-01T00:00:00Z".into()),
            reason: "r".into(),
            ..RuleSpec::default()
        };
        assert!(Snapshot::compile(&set(BASE), std::slice::from_ref(&quota), 1).is_ok(), "a module fleet");
        let e = Snapshot::compile(&set(&lua), std::slice::from_ref(&quota), 1).unwrap_err().to_string();
        assert!(e.starts_with("rule set rejected: override 'o': window and quota limits need the module (RL.WINDOW); the rule set declares backend = \"lua\""), "{e}");
        // burst x period above 2^52 ms: 2^40 tokens a day.
        let huge = lua.replace("rate = 20, per = \"1s\"", "rate = 1, burst = 1099511627776, per = \"1d\"");
        let e = Snapshot::compile(&set(&huge), &[], 1).unwrap_err().to_string();
        assert!(e.contains("rule 'pro': a limit's burst x period in ms is above 2^52"), "{e}");
        // An undeclared set on a Lua gateway says how to catch it earlier.
        let quota_rule = BASE.replace(
            "{ name = \"s\", rate = 20, per = \"1s\" }",
            "{ name = \"d\", kind = \"quota\", limit = 5, per = \"1d\" }",
        );
        let e = Snapshot::compile_for(&set(&quota_rule), &[], 1, Backend::Lua).unwrap_err().to_string();
        assert!(e.contains("declare backend = \"lua\" in the rule file"), "{e}");
        let e = RuleSetSpec::from_toml("backend = \"redis\"").unwrap_err().to_string();
        assert!(e.contains("unknown variant `redis`, expected `module` or `lua`"), "{e}");
    }

    const GLOBAL: &str = r#"
        [[rules]]
        id = "default"
        reason = "one limit across regions"
        limits = [{ name = "s", rate = 100, per = "1s" }]
        global = { regions = ["eu", "us", "ap"], floor = 0.1, weights = [5, 3, 2] }
    "#;

    #[test]
    fn a_global_rule_compiles_with_its_split() {
        let snapshot = Snapshot::compile(&set(GLOBAL), &[], 1).unwrap();
        let global = snapshot.rule("default").unwrap().global().unwrap();
        assert_eq!((global.regions.len(), global.floor_ppm(), global.weights()), (3, 100_000, vec![5, 3, 2]));
        assert_eq!(global.to_string(), "eu 50%, us 30%, ap 20% (fixed split), floor 10%");
        let even = GLOBAL.replace(", floor = 0.1, weights = [5, 3, 2]", "");
        let snapshot = Snapshot::compile(&set(&even), &[], 1).unwrap();
        let global = snapshot.rule("default").unwrap().global().unwrap();
        assert_eq!((global.floor_ppm(), global.weights()), (0, vec![1, 1, 1]));
        assert_eq!(global.to_string(), "eu 33.3%, us 33.3%, ap 33.3% (fixed split), floor 0%");
        assert_eq!(
            crate::global_rules(&set(GLOBAL)),
            vec![("default".to_owned(), set(GLOBAL).rules[0].global.clone().unwrap())]
        );
        assert!(crate::global_rules(&set(BASE)).is_empty());
        assert!(Snapshot::compile(&set(BASE), &[], 1).unwrap().rule("default").unwrap().scaling.is_none());
    }

    #[test]
    fn a_global_rules_scaled_policies_carry_over_while_it_is_unchanged() {
        let scaling = |s: &Snapshot| s.rule("default").unwrap().scaling.clone().unwrap();
        let v1 = Snapshot::compile(&set(GLOBAL), &[], 1).unwrap();
        let v2 = Snapshot::compile_with(&set(GLOBAL), &[], 2, false, Some(&v1)).unwrap();
        assert!(Arc::ptr_eq(&scaling(&v1), &scaling(&v2)), "same limits: same scaled policies and their leases");
        let changed = GLOBAL.replace("rate = 100", "rate = 200");
        let v3 = Snapshot::compile_with(&set(&changed), &[], 3, false, Some(&v2)).unwrap();
        assert!(!Arc::ptr_eq(&scaling(&v2), &scaling(&v3)), "new limits start fresh");
    }

    #[test]
    fn bad_global_fields_are_named() {
        let faults = |from: &str, to: &str| {
            let text = GLOBAL.replace(from, to);
            Snapshot::compile(&set(&text), &[], 1).unwrap_err().to_string()
        };
        let split = "regions = [\"eu\", \"us\", \"ap\"], floor = 0.1, weights = [5, 3, 2]";
        for (to, fault) in [
            ("regions = []", "rule 'default': global.regions: name at least one region"),
            ("regions = [\"eu\", \"eu\"]", "global.regions: \"eu\" is named twice"),
            ("regions = [\"eu west\"]", "global.regions: region 1 "),
            (
                "regions = [\"eu\", \"us\", \"ap\"], floor = 0.4",
                "global.floor: the fraction each region always keeps is 0 to 1/3 (0.3333) for 3 regions, got 0.4",
            ),
            (
                "regions = [\"eu\", \"us\"], floor = -0.1",
                "global.floor: the fraction each region always keeps is 0 to 1/2 (0.5000) for 2 regions, got -0.1",
            ),
            (
                "regions = [\"eu\", \"us\", \"ap\"], weights = [1, 2]",
                "global.weights: one weight per region: 2 weights for 3 regions",
            ),
            (
                "regions = [\"eu\", \"us\"], weights = [0, 0]",
                "global.weights: all 0: at least one region must have a positive weight",
            ),
        ] {
            let e = faults(split, to);
            assert!(e.contains(fault), "{to}: {e}");
        }
        let typo = RuleSetSpec::from_toml(&GLOBAL.replace("weights", "weight")).unwrap_err().to_string();
        assert!(typo.contains("unknown field `weight`, expected one of `regions`, `floor`, `weights`"), "{typo}");
    }

    #[test]
    fn a_global_rule_has_bucket_limits_and_is_no_override() {
        let quota = GLOBAL.replace(
            "limits = [{ name = \"s\", rate = 100, per = \"1s\" }]",
            "limits = [{ name = \"s\", rate = 100, per = \"1s\" }, { name = \"daily\", kind = \"quota\", limit = 1000, per = \"1d\" }]",
        );
        let e = Snapshot::compile(&set(&quota), &[], 1).unwrap_err().to_string();
        assert!(
            e.contains("rule 'default': global: limit 'daily' is a quota: a global rule's limits are buckets"),
            "{e}"
        );
        let global = set(GLOBAL).rules[0].global.clone();
        let o = RuleSpec {
            id: "o".into(),
            scope: MatchSpec { subject: Some("acme".into()), ..MatchSpec::default() },
            limits: set(GLOBAL).rules[0].limits.clone(),
            expires: Some("2099-01-01T00:00:00Z".into()),
            reason: "r".into(),
            global,
            ..RuleSpec::default()
        };
        let e = Snapshot::compile(&set(GLOBAL), &[o], 1).unwrap_err().to_string();
        assert!(e.contains("override 'o': global: an override is enforced as written"), "{e}");
    }
}
