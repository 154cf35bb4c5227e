//! A compiled rule set (`compile.rs` makes it), indexed by match: a
//! request reads one immutable `Snapshot` and never touches a rule file or
//! a store.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use crate::http::{InflightHeaders, PolicyHeaders};
use crate::{Error, FailMode, InflightPolicy, Policy, Result, Rule};
use ipnet::IpNet;

use crate::global::GlobalSpec;
use crate::live::scaling::Scaling;
use crate::live::spec::{IpTier, Mode};

/// Which requests a compiled rule matches, from the most specific to the
/// least: a subject, a network and an endpoint, a plan and a network, a
/// network (networks the longest prefix first), a plan and an endpoint,
/// an endpoint, a plan, every request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// One subject (API key, user, tenant).
    Subject(String),
    /// One endpoint called from an IP network.
    IpEndpoint {
        /// The network.
        net: IpNet,
        /// The endpoint.
        endpoint: String,
    },
    /// One plan tier calling from an IP network.
    PlanIp {
        /// The plan tier.
        plan: String,
        /// The network.
        net: IpNet,
    },
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
            Scope::IpEndpoint { net, endpoint } => write!(f, "ip {net} and endpoint {endpoint:?}"),
            Scope::PlanIp { plan, net } => write!(f, "plan {plan:?} and ip {net}"),
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
    pub(crate) id: String,
    pub(crate) scope: Scope,
    pub(crate) mode: Mode,
    pub(crate) shared: bool,
    pub(crate) ip_tier: IpTier,
    pub(crate) fail: FailMode,
    pub(crate) expires: Option<SystemTime>,
    pub(crate) reason: String,
    pub(crate) is_override: bool,
    /// Its rate limits as a policy, with its headers' fixed parts; none
    /// for a rule of in-flight limits only.
    pub(crate) rates: Option<Arc<PolicyHeaders>>,
    /// Its in-flight limits, with their headers and release rate.
    pub(crate) inflight: Option<Arc<InflightHeaders>>,
    pub(crate) global: Option<GlobalSpec>,
    /// A global rule's limits and its scaled policies (regional.rs).
    pub(crate) scaling: Option<Arc<Scaling>>,
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

    /// Which requests it limits by their address, when the tower layer's
    /// decider reaches it through one.
    pub fn ip_tier(&self) -> IpTier {
        self.ip_tier
    }

    /// Whether it refuses (`closed`) or limits locally (`open`) while Redis
    /// is down.
    pub fn fail(&self) -> FailMode {
        self.fail
    }

    /// Whether it has rate limits (a rule may have in-flight limits only).
    pub fn has_rates(&self) -> bool {
        self.rates.is_some()
    }

    /// Its rate limits as a policy: for [`Limiter`](crate::Limiter)
    /// calls. Its prefix is `key_prefix:id`. A rule of in-flight limits
    /// only has none ([`has_rates`](Self::has_rates) is false): this is
    /// then a policy that enforces nothing and announces nothing, which
    /// live rules never ask.
    pub fn policy(&self) -> &Policy {
        self.headers().policy()
    }

    /// Its policy with the headers' fixed parts, built once when the rule
    /// was compiled: for [`headers`](crate::http::headers).
    pub fn headers(&self) -> &Arc<PolicyHeaders> {
        self.rates.as_ref().unwrap_or_else(|| no_rates())
    }

    /// Its in-flight limits, if it has any: for
    /// [`Limiter::acquire`](crate::Limiter::acquire) (as
    /// [`LiveRules::acquire`](crate::live::LiveRules::acquire) does). Same
    /// prefix as [`policy`](Self::policy): a subject's keys of both share
    /// one hash tag.
    pub fn inflight(&self) -> Option<&InflightPolicy> {
        self.inflight.as_deref().map(InflightHeaders::policy)
    }

    /// Its in-flight limits with their headers' fixed parts and the rate
    /// their slots were seen to free on this gateway (kept across versions
    /// while the limits are unchanged).
    pub fn inflight_headers(&self) -> Option<&Arc<InflightHeaders>> {
        self.inflight.as_ref()
    }

    /// Its split between regions, if its limits are global: a gateway
    /// enforces its region's share of [`policy`](Self::policy).
    pub fn global(&self) -> Option<&GlobalSpec> {
        self.global.as_ref()
    }

    /// Whether it has stopped applying at `now`.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        self.expires.is_some_and(|at| now >= at)
    }
}

/// What [`CompiledRule::headers`] is for a rule of in-flight limits only:
/// one shadow rule, never asked, so it enforces and announces nothing.
fn no_rates() -> &'static Arc<PolicyHeaders> {
    static NO_RATES: OnceLock<Arc<PolicyHeaders>> = OnceLock::new();
    NO_RATES.get_or_init(|| {
        let never = Rule::new("none", 1, 1, Duration::from_secs(1)).shadow();
        // A fixed, valid policy: building it cannot fail.
        let policy = Policy::builder("rl-rules:no-rates").rule(never).build().unwrap_or_else(|_| unreachable!());
        Arc::new(PolicyHeaders::new(policy))
    })
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
/// use rl_gateway::live::Request;
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
pub(crate) struct Index {
    override_subject: HashMap<String, Slot>,
    override_ip: IpIndex,
    subject: HashMap<String, Slot>,
    /// Endpoint, then network.
    ip_endpoint: HashMap<String, IpIndex>,
    /// Plan, then network.
    plan_ip: HashMap<String, IpIndex>,
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
    pub(crate) version: u64,
    pub(crate) rules: Vec<Arc<CompiledRule>>,
    pub(crate) index: Index,
    pub(crate) ipv4_prefix: u8,
    pub(crate) ipv6_prefix: u8,
    pub(crate) warnings: Vec<String>,
}

impl Snapshot {
    /// What was accepted but looks wrong: a rule that has already expired,
    /// an IPv4-mapped network read as IPv4. One line each, naming the rule.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
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
    /// rule, a network's with the endpoint, a plan's from the network, a
    /// network's, plan and endpoint, endpoint, plan, the default), and a
    /// shadow rule at least as specific, if any.
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
        // The networks of an endpoint's (or a plan's) rules holding the address.
        let by_ip = |name: Option<&str>, map: &HashMap<String, IpIndex>, visit: &mut dyn FnMut(&Slot) -> bool| {
            let index = name.and_then(|n| map.get(n));
            index.zip(request.ip).is_some_and(|(index, ip)| index.visit(canonical(ip), &mut |s| visit(s)))
        };
        let _stopped = by_subject(&x.override_subject).is_some_and(|s| visit(&s))
            || request.ip.is_some_and(|ip| x.override_ip.visit(canonical(ip), &mut visit))
            || by_subject(&x.subject).is_some_and(|s| visit(&s))
            || by_ip(request.endpoint, &x.ip_endpoint, &mut visit)
            || by_ip(request.plan, &x.plan_ip, &mut visit)
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
        match request.ip {
            // One grouping for rules and the client's extractors.
            Some(ip) => crate::ip_subject(ip, self.ipv4_prefix, self.ipv6_prefix),
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

impl Index {
    /// Indexes rules by match, refusing two rules of one mode for one match,
    /// and a set without an enforced default rule.
    pub(crate) fn build(rules: &[Arc<CompiledRule>], now: SystemTime, errors: &mut Vec<String>) -> Index {
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
                (Scope::IpEndpoint { net, endpoint }, _) => {
                    index.ip_endpoint.entry(endpoint.clone()).or_default().slot(*net)
                }
                (Scope::PlanIp { plan, net }, _) => index.plan_ip.entry(plan.clone()).or_default().slot(*net),
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
                    // An expired rule still holds its match: say so, or the
                    // conflict makes no sense to whoever reads it.
                    let expired: String = [&rules[*other], rule]
                        .iter()
                        .filter(|r| r.is_expired(now))
                        .map(|r| {
                            let at = r.expires.map(humantime::format_rfc3339_seconds);
                            format!(
                                "; '{}' expired at {}: remove it",
                                r.id,
                                at.map(|t| t.to_string()).unwrap_or_default()
                            )
                        })
                        .collect();
                    errors.push(format!(
                        "{kind} '{}' and '{}' both match {} in {mode} mode: one rule of each mode per match{expired}",
                        rules[*other].id, rule.id, rule.scope
                    ));
                }
                None => *place = Some(i),
            }
        }
        if errors.is_empty() && index.default.enforce.is_none() {
            errors.push(
                "the rule set needs a default rule (no match) in enforce mode: every request must find a rule"
                    .to_owned(),
            );
        }
        index
    }
}

/// How long until `at`, for listings (zero once past).
pub fn remaining(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap_or(Duration::ZERO)
}
