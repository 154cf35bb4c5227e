//! Which rules take traffic off an endpoint's rule: a more specific rule
//! (a network, a subject, a plan from a network...) wins for the requests
//! it matches, so a harmless "this office gets more" rule can take an
//! office's logins off a fail-closed login rule. Said as warnings, by
//! rule and traffic, when the rule that loses them is fail-closed or
//! stricter; `rlctl validate` and `rlctl publish` print them, gateways
//! log them when they install the set.

use std::sync::Arc;

use crate::FailMode;
use ipnet::IpNet;

use crate::live::snapshot::{CompiledRule, Scope};
use crate::live::spec::Mode;

/// A warning per pair of enforced rules where the first takes some of an
/// endpoint rule's traffic and is either fail-open against a fail-closed
/// rule, looser than it, or without the in-flight limit it has.
pub(crate) fn shadowing_warnings(rules: &[Arc<CompiledRule>]) -> Vec<String> {
    let enforced = || rules.iter().filter(|r| r.mode() == Mode::Enforce);
    let mut out = Vec::new();
    for loser in enforced() {
        let Some(endpoint) = endpoint_of(loser.scope()) else { continue };
        for winner in enforced().filter(|w| w.id() != loser.id()) {
            let Some(traffic) = taken(winner, loser, endpoint) else { continue };
            if kept(rules, winner, loser, endpoint) {
                continue;
            }
            let mut why = Vec::new();
            if loser.fail() == FailMode::Closed && winner.fail() == FailMode::Open {
                why.push(format!("'{}' is fail-closed and '{}' fails open", loser.id(), winner.id()));
            }
            // A rule written for the endpoint, or for one subject (the
            // customer's own limits), is looser on purpose; a network's
            // rule is rarely written with each endpoint in mind.
            if by_network(winner) {
                if let Some(looser) = looser(winner, loser) {
                    why.push(looser);
                }
                if loser.inflight().is_some() && winner.inflight().is_none() {
                    why.push(format!("'{}' has no in-flight limit", winner.id()));
                }
            }
            if why.is_empty() {
                continue;
            }
            out.push(format!(
                "rule '{}' ({}) takes {traffic} off rule '{}' ({}): {}; {}",
                winner.id(),
                winner.scope(),
                loser.id(),
                loser.scope(),
                why.join(", and "),
                remedy(winner, loser, endpoint),
            ));
        }
    }
    out
}

fn endpoint_of(scope: &Scope) -> Option<&str> {
    match scope {
        Scope::Endpoint(e) | Scope::PlanEndpoint { endpoint: e, .. } | Scope::IpEndpoint { endpoint: e, .. } => Some(e),
        _ => None,
    }
}

/// The traffic to `endpoint` that `winner` takes off `loser` (an endpoint
/// rule), in words; `None` when it takes none (it matches other requests,
/// or ranks below).
fn taken(winner: &CompiledRule, loser: &CompiledRule, endpoint: &str) -> Option<String> {
    let to = format!("requests to {endpoint:?}");
    let loser_net = match loser.scope() {
        Scope::IpEndpoint { net, .. } => Some(*net),
        _ => None,
    };
    let loser_plan = match loser.scope() {
        Scope::PlanEndpoint { plan, .. } => Some(plan.as_str()),
        _ => None,
    };
    // An override outranks every rule of the set.
    if winner.is_override() || matches!(winner.scope(), Scope::Subject(_)) {
        return match winner.scope() {
            Scope::Subject(s) => Some(format!("{to} by subject {s:?}")),
            Scope::Ip(net) if loser_net.is_none_or(|l| overlap(*net, l)) => Some(format!("{to} from {net}")),
            _ => None,
        };
    }
    match (winner.scope(), loser.scope()) {
        (Scope::IpEndpoint { net, endpoint: e }, _) if e == endpoint => match loser_net {
            None => Some(format!("{to} from {net}")),
            Some(l) if l != *net && l.contains(net) => Some(format!("{to} from {net}")),
            Some(_) => None,
        },
        (Scope::PlanIp { plan, net }, Scope::Endpoint(_) | Scope::PlanEndpoint { .. })
            if loser_plan.is_none_or(|p| p == plan) =>
        {
            Some(format!("{to} by plan {plan:?} from {net}"))
        }
        (Scope::Ip(net), Scope::Endpoint(_) | Scope::PlanEndpoint { .. }) => Some(format!("{to} from {net}")),
        (Scope::PlanEndpoint { plan, endpoint: e }, Scope::Endpoint(_)) if e == endpoint => {
            Some(format!("{to} by plan {plan:?}"))
        }
        _ => None,
    }
}

/// Whether a rule for a network and the endpoint, ranked above `winner`,
/// takes all the traffic `winner` would take (the remedy, written).
fn kept(rules: &[Arc<CompiledRule>], winner: &CompiledRule, loser: &CompiledRule, endpoint: &str) -> bool {
    let (Scope::Ip(net) | Scope::PlanIp { net, .. }) = winner.scope() else { return false };
    if winner.is_override() {
        return false;
    }
    rules.iter().any(|r| {
        r.mode() == Mode::Enforce
            && r.id() != loser.id()
            && matches!(r.scope(), Scope::IpEndpoint { net: n, endpoint: e } if e == endpoint && n.contains(net))
    })
}

fn overlap(a: IpNet, b: IpNet) -> bool {
    a.contains(&b) || b.contains(&a)
}

/// How `winner` is looser than `loser`, if it is: no rate where the loser
/// has one, a higher sustained rate, or a larger burst.
fn looser(winner: &CompiledRule, loser: &CompiledRule) -> Option<String> {
    let loser_limits = Limits::of(loser)?;
    let Some(winner_limits) = Limits::of(winner) else {
        return Some(format!("'{}' has no rate limit", winner.id()));
    };
    let mut how = Vec::new();
    if winner_limits.per_second > loser_limits.per_second {
        how.push(format!(
            "{}/s sustained against {}/s",
            round(winner_limits.per_second),
            round(loser_limits.per_second)
        ));
    }
    if winner_limits.burst > loser_limits.burst {
        how.push(format!("a burst of {} against {}", winner_limits.burst, loser_limits.burst));
    }
    (!how.is_empty()).then(|| format!("'{}' is looser ({})", winner.id(), how.join(", ")))
}

/// What a rule's enforced rate limits allow at most, together.
struct Limits {
    per_second: f64,
    burst: u64,
}

impl Limits {
    fn of(rule: &CompiledRule) -> Option<Limits> {
        if !rule.has_rates() {
            return None;
        }
        let limits = || rule.policy().rules().iter().filter(|r| !r.is_shadow());
        let per_second = limits()
            .map(|r| r.refill() as f64 / r.period().as_secs_f64().max(f64::MIN_POSITIVE))
            .fold(f64::INFINITY, f64::min);
        let burst = limits().map(|r| r.capacity()).min()?;
        Some(Limits { per_second, burst })
    }
}

fn round(x: f64) -> String {
    let text = format!("{x:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A rule by network (not an override: a clamp is meant to win).
fn by_network(rule: &CompiledRule) -> bool {
    !rule.is_override() && matches!(rule.scope(), Scope::Ip(_) | Scope::PlanIp { .. })
}

/// What would keep the traffic under the endpoint's rule.
fn remedy(winner: &CompiledRule, loser: &CompiledRule, endpoint: &str) -> String {
    match winner.scope() {
        Scope::Ip(net) | Scope::PlanIp { net, .. } if !winner.is_override() => format!(
            "to keep them under '{}', add a rule that matches both (match = {{ ip = \"{net}\", endpoint = {endpoint:?} }})",
            loser.id()
        ),
        Scope::Subject(_) | Scope::Ip(_) => {
            format!("it covers every endpoint: make '{}' fail-closed if these must be refused during an outage", winner.id())
        }
        _ => format!("make '{}' fail-closed too if these must be refused during an outage", winner.id()),
    }
}

#[cfg(test)]
mod tests {
    use crate::live::snapshot::Snapshot;
    use crate::live::spec::RuleSetSpec;

    const SET: &str = r#"
        [[rules]]
        id = "default"
        reason = "everyone"
        limits = [{ name = "s", rate = 100, per = "1s" }]

        [[rules]]
        id = "login"
        match = { endpoint = "POST /login" }
        fail = "closed"
        reason = "credential stuffing"
        limits = [{ name = "m", rate = 5, per = "1m" }]

        [[rules]]
        id = "office"
        match = { ip = "203.0.113.0/24" }
        reason = "the office gets more"
        limits = [{ name = "s", rate = 500, per = "1s" }]
    "#;

    fn warnings(toml: &str) -> Vec<String> {
        Snapshot::compile(&RuleSetSpec::from_toml(toml).unwrap(), &[], 1).unwrap().warnings().to_vec()
    }

    #[test]
    fn a_network_rule_that_takes_logins_off_a_fail_closed_rule_is_named_with_its_traffic() {
        let w = warnings(SET);
        assert_eq!(w.len(), 1, "{w:#?}");
        assert!(
            w[0].starts_with(
                "rule 'office' (ip 203.0.113.0/24) takes requests to \"POST /login\" from 203.0.113.0/24 off rule 'login' (endpoint \"POST /login\"): 'login' is fail-closed and 'office' fails open, and 'office' is looser (500/s sustained against 0.083/s, a burst of 500 against 5)"
            ),
            "{}",
            w[0]
        );
        assert!(w[0].contains("match = { ip = \"203.0.113.0/24\", endpoint = \"POST /login\" }"), "{}", w[0]);
        // The combined rule, as strict and fail-closed, says nothing more.
        let fixed = format!(
            "{SET}\n[[rules]]\nid = \"office-login\"\nmatch = {{ ip = \"203.0.113.0/24\", endpoint = \"POST /login\" }}\nfail = \"closed\"\nreason = \"r\"\nlimits = [{{ name = \"m\", rate = 5, per = \"1m\" }}]\n"
        );
        // The combined rule takes those logins first: no warning left.
        let w = warnings(&fixed);
        assert!(w.is_empty(), "{w:#?}");
        let snapshot = Snapshot::compile(&RuleSetSpec::from_toml(&fixed).unwrap(), &[], 1).unwrap();
        let ip = "203.0.113.9".parse().unwrap();
        let request = crate::live::snapshot::Request::new().ip(ip).endpoint("POST /login");
        assert_eq!(snapshot.matching(&request, std::time::SystemTime::now()).enforced.id(), "office-login");
    }

    #[test]
    fn a_stricter_or_equal_rule_and_other_endpoints_are_not_warned_about() {
        let tight = SET
            .replace("rate = 500, per = \"1s\"", "rate = 1, per = \"1m\"")
            .replace("reason = \"the office gets more\"", "reason = \"the office gets less\"\nfail = \"closed\"");
        assert!(warnings(&tight).is_empty(), "{:#?}", warnings(&tight));
        let plan =
            SET.replace("match = { ip = \"203.0.113.0/24\" }", "match = { plan = \"pro\", endpoint = \"GET /\" }");
        assert!(warnings(&plan).is_empty(), "another endpoint: {:#?}", warnings(&plan));
        let by_plan = SET
            .replace("match = { ip = \"203.0.113.0/24\" }", "match = { plan = \"pro\", endpoint = \"POST /login\" }");
        let w = warnings(&by_plan);
        assert!(w.len() == 1 && w[0].contains("takes requests to \"POST /login\" by plan \"pro\""), "{w:#?}");
        assert!(
            w[0].contains("fails open; make 'office' fail-closed too"),
            "fail mode only, written for the endpoint: {}",
            w[0]
        );
        // A subject's own rule: only the fail mode is said.
        let subject = SET.replace("match = { ip = \"203.0.113.0/24\" }", "match = { subject = \"k\" }");
        let w = warnings(&subject);
        assert!(w.len() == 1 && w[0].ends_with("'office' fails open; it covers every endpoint: make 'office' fail-closed if these must be refused during an outage"), "{w:#?}");
        let closed = subject.replace("reason = \"the office gets more\"", "reason = \"r\"\nfail = \"closed\"");
        assert!(warnings(&closed).is_empty(), "{:#?}", warnings(&closed));
    }
}
