//! A rule set checked and compiled once, when it is loaded: every rule's
//! limits become a [`Policy`], every match goes into an index. A request
//! reads one immutable `Snapshot` and never touches a rule file or a store.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ipnet::IpNet;
use rl_client::{check_name, period_ms, subject_fault, Backend, Error, Policy, Result, Rule};
use rl_core::limits::{MAX_KEYS, MAX_LOG_LIMIT, MAX_PERIOD_MS, MAX_TOKENS, MAX_WINDOW_LIMIT};
use rl_core::WindowMode;

#[cfg(test)]
use crate::spec::MatchSpec;
use crate::spec::{Fail, LimitKind, LimitSpec, Mode, RuleSetSpec, RuleSpec, MAX_VERSION};

/// Which requests a compiled rule matches, from the most specific to the
/// least: a subject, an IP network (the longest prefix first), a plan and
/// an endpoint, an endpoint, a plan, every request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// One subject (API key, user, tenant).
    Subject(String),
    /// An IP network.
    Ip(IpNet),
    /// One endpoint for one plan.
    PlanEndpoint {
        /// The plan tier.
        plan: String,
        /// The endpoint.
        endpoint: String,
    },
    /// One endpoint, every plan.
    Endpoint(String),
    /// One plan tier, every endpoint.
    Plan(String),
    /// Every request: the default rule.
    Default,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Subject(s) => write!(f, "subject {s:?}"),
            Scope::Ip(net) => write!(f, "ip {net}"),
            Scope::PlanEndpoint { plan, endpoint } => write!(f, "plan {plan:?} and endpoint {endpoint:?}"),
            Scope::Endpoint(e) => write!(f, "endpoint {e:?}"),
            Scope::Plan(p) => write!(f, "plan {p:?}"),
            Scope::Default => f.write_str("every request (default)"),
        }
    }
}

/// One rule, checked and compiled.
#[derive(Debug)]
pub struct CompiledRule {
    id: String,
    scope: Scope,
    mode: Mode,
    shared: bool,
    expires: Option<SystemTime>,
    reason: String,
    is_override: bool,
    policy: Policy,
}

impl CompiledRule {
    /// The rule's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Which requests it matches.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Enforced or shadow.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether every request it matches shares one set of buckets.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// When it stops applying, if ever.
    pub fn expires(&self) -> Option<SystemTime> {
        self.expires
    }

    /// Why it exists.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether it is an emergency override (added apart from the rule file).
    pub fn is_override(&self) -> bool {
        self.is_override
    }

    /// Its limits as a policy: for [`headers`](rl_client::headers) and
    /// [`Limiter`](rl_client::Limiter) calls. Its prefix is `key_prefix:id`.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether it has stopped applying at `now`.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        self.expires.is_some_and(|at| now >= at)
    }
}

/// The rules a request matched in a snapshot.
#[derive(Clone, Debug)]
pub struct Match {
    /// The most specific enforced rule: it decides.
    pub enforced: Arc<CompiledRule>,
    /// A shadow rule at least as specific as `enforced`: the rule that
    /// would decide were it enforced. Evaluated and reported only.
    pub shadow: Option<Arc<CompiledRule>>,
}

/// What a request is, as far as rules are concerned. Every field is
/// optional; a request needs a subject or an IP for its own buckets.
///
/// ```
/// use rl_rules::Request;
///
/// let ip = "2001:db8:1:2::7".parse().unwrap();
/// let req = Request::new().subject("key_8f3").ip(ip).plan("pro").endpoint("GET /search");
/// # let _ = req;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Request<'a> {
    /// The API key, user or tenant, if known.
    pub subject: Option<&'a str>,
    /// The client's address.
    pub ip: Option<IpAddr>,
    /// The subject's plan tier.
    pub plan: Option<&'a str>,
    /// The endpoint (route) called.
    pub endpoint: Option<&'a str>,
}

impl<'a> Request<'a> {
    /// A request with nothing known yet.
    pub fn new() -> Request<'a> {
        Request::default()
    }

    /// Sets the subject.
    pub fn subject(self, subject: &'a str) -> Request<'a> {
        Request { subject: Some(subject), ..self }
    }

    /// Sets the client address.
    pub fn ip(self, ip: IpAddr) -> Request<'a> {
        Request { ip: Some(ip), ..self }
    }

    /// Sets the plan tier.
    pub fn plan(self, plan: &'a str) -> Request<'a> {
        Request { plan: Some(plan), ..self }
    }

    /// Sets the endpoint.
    pub fn endpoint(self, endpoint: &'a str) -> Request<'a> {
        Request { endpoint: Some(endpoint), ..self }
    }
}

/// An enforced and a shadow rule for one match.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    enforce: Option<usize>,
    shadow: Option<usize>,
}

/// Rules by network: one hash look-up per prefix length in use.
#[derive(Debug, Default)]
struct IpIndex {
    nets: HashMap<IpNet, Slot>,
    /// Prefix lengths in use per family, longest first.
    v4: Vec<u8>,
    v6: Vec<u8>,
}

impl IpIndex {
    fn slot(&mut self, net: IpNet) -> &mut Slot {
        let lens = if matches!(net, IpNet::V4(_)) { &mut self.v4 } else { &mut self.v6 };
        if !lens.contains(&net.prefix_len()) {
            lens.push(net.prefix_len());
            lens.sort_unstable_by(|a, b| b.cmp(a));
        }
        self.nets.entry(net).or_default()
    }

    /// Visits the networks holding `ip`, the longest prefix first, until
    /// `visit` says stop.
    fn visit(&self, ip: IpAddr, visit: &mut impl FnMut(&Slot) -> bool) -> bool {
        let lens = if ip.is_ipv4() { &self.v4 } else { &self.v6 };
        lens.iter().any(|&len| {
            let net = IpNet::new(ip, len).map(|n| n.trunc());
            net.ok().and_then(|n| self.nets.get(&n)).is_some_and(&mut *visit)
        })
    }
}

#[derive(Debug, Default)]
struct Index {
    override_subject: HashMap<String, Slot>,
    override_ip: IpIndex,
    subject: HashMap<String, Slot>,
    ip: IpIndex,
    /// Plan, then endpoint: looked up without building a key.
    plan_endpoint: HashMap<String, HashMap<String, Slot>>,
    endpoint: HashMap<String, Slot>,
    plan: HashMap<String, Slot>,
    default: Slot,
}

/// A checked, compiled rule set of one version: immutable, shared by every
/// request that started while it was current.
#[derive(Debug)]
pub struct Snapshot {
    version: u64,
    rules: Vec<Arc<CompiledRule>>,
    index: Index,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

/// The defaults of a rule set's optional settings.
const DEFAULT_KEY_PREFIX: &str = "rl";
const DEFAULT_IPV4_PREFIX: u8 = 32;
const DEFAULT_IPV6_PREFIX: u8 = 64;

impl Snapshot {
    /// Checks `spec` and `overrides` together, as a gateway on the module
    /// backend would load them as `version`; every fault is named, one per
    /// line, in the error.
    pub fn compile(spec: &RuleSetSpec, overrides: &[RuleSpec], version: u64) -> Result<Snapshot> {
        Snapshot::compile_for(spec, overrides, version, Backend::Module)
    }

    /// Like [`Snapshot::compile`], as a gateway on `backend` would load it:
    /// the Lua backend has no windows and counts buckets exactly only up to
    /// burst x period_ms = 2^52.
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
        let mut errors = Vec::new();
        if version > MAX_VERSION {
            errors.push(format!("version {version} is above {MAX_VERSION} (2^53 - 1), the largest a version may be"));
        }
        let key_prefix = spec.key_prefix.as_deref().unwrap_or(DEFAULT_KEY_PREFIX);
        if key_prefix.is_empty()
            || key_prefix.len() > 64
            || key_prefix.contains(['{', '}'])
            || key_prefix.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            errors.push(format!("key_prefix must be 1 to 64 characters without '{{', '}}' or spaces, got {key_prefix:?}"));
        }
        let ipv4_prefix = spec.ipv4_prefix.unwrap_or(DEFAULT_IPV4_PREFIX);
        let ipv6_prefix = spec.ipv6_prefix.unwrap_or(DEFAULT_IPV6_PREFIX);
        if !(1..=32).contains(&ipv4_prefix) {
            errors.push(format!("ipv4_prefix must be from 1 to 32, got {ipv4_prefix}"));
        }
        if !(1..=128).contains(&ipv6_prefix) {
            errors.push(format!("ipv6_prefix must be from 1 to 128, got {ipv6_prefix}"));
        }
        let set = SetContext { key_prefix, ipv4_prefix, ipv6_prefix, lua, previous };
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
            let rule = compile_rule(spec, is_override, &set, &label, &mut errors);
            if let (Some(rule), true) = (rule, errors.len() == before) {
                rules.push(Arc::new(rule));
            }
        }
        if spec.rules.is_empty() {
            errors.push("the rule set has no rules".to_owned());
        }
        let index = build_index(&rules, &mut errors);
        if errors.is_empty() && index.default.enforce.is_none() {
            errors.push("the rule set needs a default rule (no match) in enforce mode: every request must find a rule".to_owned());
        }
        if !errors.is_empty() {
            return Err(Error::Rules(errors.join("\n")));
        }
        Ok(Snapshot { version, rules, index, ipv4_prefix, ipv6_prefix })
    }

    /// The version this snapshot was loaded as.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Every rule, the written ones first, then the overrides.
    pub fn rules(&self) -> &[Arc<CompiledRule>] {
        &self.rules
    }

    /// A rule by id.
    pub fn rule(&self, id: &str) -> Option<&Arc<CompiledRule>> {
        self.rules.iter().find(|r| r.id == id)
    }

    /// The rules `request` matches at `now`: the most specific enforced
    /// rule that has not expired (an override first, then a subject's own
    /// rule, an IP network's, plan and endpoint, endpoint, plan, the
    /// default), and a shadow rule at least as specific, if any.
    pub fn matching(&self, request: &Request<'_>, now: SystemTime) -> Match {
        let (mut enforce, mut shadow) = (None, None);
        // A shadow rule comes first within its match: it is the candidate
        // that would replace the enforced rule beside it.
        let mut visit = |slot: &Slot| {
            for i in [slot.shadow, slot.enforce].into_iter().flatten() {
                let rule = &self.rules[i];
                if rule.is_expired(now) {
                    continue;
                }
                match rule.mode {
                    Mode::Shadow => shadow = shadow.or(Some(i)),
                    Mode::Enforce => {
                        enforce = Some(i);
                        return true;
                    }
                }
            }
            false
        };
        let x = &self.index;
        let by_subject = |map: &HashMap<String, Slot>| request.subject.and_then(|s| map.get(s)).copied();
        let plan_endpoint = request.plan.zip(request.endpoint).and_then(|(p, e)| x.plan_endpoint.get(p)?.get(e));
        let _stopped = by_subject(&x.override_subject).is_some_and(|s| visit(&s))
            || request.ip.is_some_and(|ip| x.override_ip.visit(canonical(ip), &mut visit))
            || by_subject(&x.subject).is_some_and(|s| visit(&s))
            || request.ip.is_some_and(|ip| x.ip.visit(canonical(ip), &mut visit))
            || plan_endpoint.is_some_and(&mut visit)
            || request.endpoint.and_then(|e| x.endpoint.get(e)).is_some_and(&mut visit)
            || request.plan.and_then(|p| x.plan.get(p)).is_some_and(&mut visit)
            || visit(&x.default);
        // Compilation guarantees an enforced default that never expires.
        let enforced = enforce.or(x.default.enforce).unwrap_or(0);
        Match { enforced: self.rules[enforced].clone(), shadow: shadow.map(|i| self.rules[i].clone()) }
    }

    /// The subject whose buckets `rule` uses for `request`: everyone's one
    /// set for a shared rule (`*:` and the rule's id, so each shared rule
    /// has a hash tag, and a cluster slot, of its own), else the request's
    /// subject, else its address grouped by prefix (an IPv6 client is its
    /// /64 by default).
    pub fn bucket_subject(&self, rule: &CompiledRule, request: &Request<'_>) -> Result<String> {
        if rule.shared {
            return Ok(format!("*:{}", rule.id));
        }
        if let Some(subject) = request.subject {
            return Ok(subject.to_owned());
        }
        match request.ip.map(canonical) {
            Some(ip) => {
                let len = if ip.is_ipv4() { self.ipv4_prefix } else { self.ipv6_prefix };
                let net = IpNet::new(ip, len).map_err(|e| Error::invalid(e.to_string()))?;
                Ok(format!("ip:{}", net.trunc()))
            }
            None => Err(Error::invalid(format!(
                "rule '{}' limits each subject: the request needs a subject or an IP address",
                rule.id
            ))),
        }
    }
}

/// An IPv4 client seen through a dual-stack socket (`::ffff:a.b.c.d`) is
/// an IPv4 client.
fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

struct SetContext<'a> {
    key_prefix: &'a str,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
    lua: bool,
    previous: Option<&'a Snapshot>,
}

/// Checks one rule, pushing every fault found (named with `at`).
fn compile_rule(spec: &RuleSpec, is_override: bool, set: &SetContext<'_>, at: &str, errors: &mut Vec<String>) -> Option<CompiledRule> {
    let before = errors.len();
    if let Err(why) = check_name(&spec.id) {
        errors.push(format!("{at}: id {why}"));
    }
    if spec.reason.trim().is_empty() {
        errors.push(format!("{at}: reason is required: why the rule exists (a ticket, an incident)"));
    }
    let scope = scope_of(spec, set, at, errors);
    let expires = match &spec.expires {
        None => None,
        Some(text) => match humantime::parse_rfc3339(text) {
            Ok(at) => Some(at),
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
    }
    if scope == Some(Scope::Default) && spec.mode == Mode::Enforce && spec.expires.is_some() {
        errors.push(format!("{at}: the enforced default rule cannot expire: every request must find a rule"));
    }
    if spec.limits.is_empty() || spec.limits.len() > MAX_KEYS {
        errors.push(format!("{at}: limits: a rule has 1 to {MAX_KEYS} limits, got {}", spec.limits.len()));
    }
    let mut limits = Vec::with_capacity(spec.limits.len());
    for (j, limit) in spec.limits.iter().enumerate() {
        let lat = if limit.name.is_empty() { format!("{at} limit {}", j + 1) } else { format!("{at} limit '{}'", limit.name) };
        if spec.limits[..j].iter().any(|other| other.name == limit.name) {
            errors.push(format!("{lat}: the name is used twice in the rule"));
        }
        if let Some(mut rule) = compile_limit(limit, &lat, errors) {
            if spec.fail == Fail::Closed {
                rule = rule.fail_closed();
            }
            if spec.mode == Mode::Shadow {
                rule = rule.shadow();
            }
            limits.push(rule);
        }
    }
    let scope = scope?;
    if errors.len() > before {
        return None;
    }
    let prefix = format!("{}:{}", set.key_prefix, spec.id);
    let reused = set
        .previous
        .and_then(|p| p.rule(&spec.id))
        .filter(|p| p.policy.prefix() == prefix && p.policy.rules() == limits.as_slice())
        .map(|p| p.policy.clone());
    let policy = match reused {
        Some(policy) => policy,
        None => {
            let built = limits.into_iter().fold(Policy::builder(prefix), |b, r| b.rule(r)).build();
            match built {
                Ok(policy) => policy,
                Err(e) => {
                    errors.push(format!("{at}: {e}"));
                    return None;
                }
            }
        }
    };
    if set.lua && policy.has_windows() {
        errors.push(format!("{at}: window and quota limits need the module (RL.WINDOW); this gateway runs the Lua backend"));
    }
    if set.lua && !policy.fits_lua() {
        errors.push(format!("{at}: a limit's burst x period in ms is above 2^52: the Lua backend cannot count it exactly"));
    }
    Some(CompiledRule {
        id: spec.id.clone(),
        scope,
        mode: spec.mode,
        shared: spec.shared,
        expires,
        reason: spec.reason.clone(),
        is_override,
        policy,
    })
}

fn scope_of(spec: &RuleSpec, set: &SetContext<'_>, at: &str, errors: &mut Vec<String>) -> Option<Scope> {
    let m = &spec.scope;
    let named = |what: &str, value: &Option<String>, errors: &mut Vec<String>| -> Option<String> {
        let v = value.as_ref()?;
        if v.is_empty() || v.len() > 512 || v.chars().any(char::is_control) {
            errors.push(format!("{at}: match.{what} must be 1 to 512 characters without control characters, got {v:?}"));
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
        (None, Some(ip), None, None) => ip_scope(ip, set, at, errors).map(Scope::Ip),
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

fn ip_scope(text: &str, set: &SetContext<'_>, at: &str, errors: &mut Vec<String>) -> Option<IpNet> {
    let parsed = text.parse::<IpNet>().or_else(|_| text.parse::<IpAddr>().map(IpNet::from));
    let Ok(net) = parsed else {
        errors.push(format!("{at}: match.ip {text:?} is not an address or a network like \"203.0.113.0/24\" or \"2001:db8::/48\""));
        return None;
    };
    if net != net.trunc() {
        errors.push(format!("{at}: match.ip {text} has host bits set: the network is {}", net.trunc()));
        return None;
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

fn compile_limit(limit: &LimitSpec, at: &str, errors: &mut Vec<String>) -> Option<Rule> {
    if let Err(why) = check_name(&limit.name) {
        errors.push(format!("{at}: name {why}"));
    }
    let per = match humantime::parse_duration(&limit.per) {
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
    let count = |what: &str, value: u64, max: u64, errors: &mut Vec<String>| {
        if !(1..=max).contains(&value) {
            errors.push(format!("{at}: {what} must be from 1 to {max}, got {value}"));
        }
    };
    let rule = match limit.kind {
        LimitKind::Bucket => {
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
        kind => {
            let (word, mode, max) = match kind {
                LimitKind::Window => ("window", WindowMode::Sliding, MAX_WINDOW_LIMIT),
                LimitKind::Exact => ("exact window", WindowMode::Exact, MAX_LOG_LIMIT),
                _ => ("quota", WindowMode::Fixed, MAX_WINDOW_LIMIT),
            };
            let Some(n) = limit.limit else {
                errors.push(format!("{at}: a {word} needs limit (requests every per); not rate"));
                return None;
            };
            if limit.rate.is_some() || limit.burst.is_some() {
                errors.push(format!("{at}: a {word} takes limit, not rate or burst"));
            }
            count("limit", n, max, errors);
            Rule::window(limit.name.clone(), n, per?, mode)
        }
    };
    Some(rule)
}

/// Indexes rules by match, refusing two rules of one mode for one match.
fn build_index(rules: &[Arc<CompiledRule>], errors: &mut Vec<String>) -> Index {
    let mut index = Index::default();
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, rule) in rules.iter().enumerate() {
        if let Some(&first) = ids.get(rule.id.as_str()) {
            errors.push(format!("rule id '{}' is used twice (rules {} and {})", rule.id, first + 1, i + 1));
            continue;
        }
        ids.insert(&rule.id, i);
        let slot = match (&rule.scope, rule.is_override) {
            (Scope::Subject(s), true) => index.override_subject.entry(s.clone()).or_default(),
            (Scope::Ip(net), true) => index.override_ip.slot(*net),
            (Scope::Subject(s), false) => index.subject.entry(s.clone()).or_default(),
            (Scope::Ip(net), false) => index.ip.slot(*net),
            (Scope::PlanEndpoint { plan, endpoint }, _) => {
                index.plan_endpoint.entry(plan.clone()).or_default().entry(endpoint.clone()).or_default()
            }
            (Scope::Endpoint(e), _) => index.endpoint.entry(e.clone()).or_default(),
            (Scope::Plan(p), _) => index.plan.entry(p.clone()).or_default(),
            (Scope::Default, _) => &mut index.default,
        };
        let place = match rule.mode {
            Mode::Enforce => &mut slot.enforce,
            Mode::Shadow => &mut slot.shadow,
        };
        match place {
            Some(other) => {
                let kind = if rule.is_override { "overrides" } else { "rules" };
                let mode = if rule.mode == Mode::Enforce { "enforce" } else { "shadow" };
                errors.push(format!(
                    "{kind} '{}' and '{}' both match {} in {mode} mode: one rule of each mode per match",
                    rules[*other].id, rule.id, rule.scope
                ));
            }
            None => *place = Some(i),
        }
    }
    index
}

/// How long until `at`, for listings (zero once past).
pub fn remaining(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn set_wide_faults_are_named() {
        let e = |toml: &str, overrides: &[RuleSpec]| Snapshot::compile(&set(toml), overrides, 1).unwrap_err().to_string();
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
        let quota = BASE.replace("{ name = \"s\", rate = 20, per = \"1s\" }", "{ name = \"d\", kind = \"quota\", limit = 5, per = \"1d\" }");
        assert!(Snapshot::compile(&set(&quota), &[], 1).is_ok());
        let e = Snapshot::compile_for(&set(&quota), &[], 1, Backend::Lua).unwrap_err().to_string();
        assert!(e.contains("rule 'pro': window and quota limits need the module"), "{e}");
    }
}
