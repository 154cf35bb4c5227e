//! Which requests a rule matches: a subject, a network, a plan and an
//! endpoint, or every request; networks compared as networks.

use std::net::IpAddr;

use crate::subject_fault;
use ipnet::{IpNet, Ipv4Net};

use super::SetContext;
use crate::live::snapshot::Scope;
use crate::live::spec::RuleSpec;

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

pub(super) fn scope_of(
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
        (None, Some(ip), None, endpoint @ Some(_)) => {
            let endpoint = named("endpoint", endpoint, errors)?;
            Some(Scope::IpEndpoint { net: ip_scope(ip, set, at, errors, warnings)?, endpoint })
        }
        (None, Some(ip), plan @ Some(_), None) => {
            let plan = named("plan", plan, errors)?;
            Some(Scope::PlanIp { plan, net: ip_scope(ip, set, at, errors, warnings)? })
        }
        (None, Some(_), Some(_), Some(_)) => {
            errors.push(format!(
                "{at}: match.ip goes with an endpoint or with a plan, not both: write one rule per endpoint of the network"
            ));
            None
        }
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
        (Some(_), ..) => {
            errors.push(format!(
                "{at}: match.subject stands alone: a subject's rule applies to all its requests (a rule matches one subject, a network with or without an endpoint or a plan, or a plan and/or an endpoint)"
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
