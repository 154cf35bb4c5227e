//! The debug port's pages (`--debug-listen`, envoyproxy/ratelimit's
//! DEBUG_HOST:DEBUG_PORT), served by the operator endpoint's bounded HTTP
//! handling: `/rlconfig`, the config in force as upstream's `Dump` prints
//! it, and `/`, the list of pages. Upstream's pprof pages
//! (`/debug/pprof/...`) and `/stats` (Go's expvar) have no counterpart:
//! answered 404 naming /metrics. `/rlconfig` shows the config's descriptor
//! values: the port is for operators (loopback unless DEBUG_HOST says
//! otherwise, docs/security.md).

use crate::rls::config::{Descriptor, RlsConfig};
use crate::rls::Rls;

/// The list `/` answers, as upstream's (`path: help`, by path).
const INDEX: &str = "/rlconfig: print out the currently loaded configuration for debugging\n";

/// A page of the debug port: (status, body).
pub fn page(rls: Option<&Rls>, path: &str) -> (&'static str, String) {
    match (path, rls) {
        ("/", _) => ("200 OK", INDEX.into()),
        ("/rlconfig", Some(rls)) => ("200 OK", dump(&rls.config())),
        ("/rlconfig", None) => ("404 Not Found", "no RLS front (--rls-listen): no config\n".into()),
        (p, _) if p == "/stats" || p.starts_with("/debug/pprof") => (
            "404 Not Found",
            format!(
                "{p} is envoyproxy/ratelimit's (Go's pprof and expvar): not served; the statistics are on /metrics\n"
            ),
        ),
        _ => ("404 Not Found", format!("not found: {INDEX}")),
    }
}

/// Every limit of `config`, one line each as upstream's `Dump` writes it:
/// `<full key>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>,
/// quota_mode: <bool>`; domains, keys and values sorted (upstream's Go maps
/// have no order).
pub fn dump(config: &RlsConfig) -> String {
    let mut out = String::new();
    let mut domains: Vec<(&String, &Descriptor)> = config.domains.iter().collect();
    domains.sort_by_key(|(name, _)| *name);
    for (_, root) in domains {
        dump_descriptor(root, &mut out);
    }
    out
}

fn dump_descriptor(descriptor: &Descriptor, out: &mut String) {
    if let Some(limit) = &descriptor.limit {
        out.push_str(&format!(
            "{}: unit={} requests_per_unit={}, shadow_mode: {}, quota_mode: {}\n",
            limit.full_key,
            limit.unit.map_or("UNKNOWN", |u| u.name()),
            limit.requests_per_unit,
            limit.shadow_mode,
            limit.quota_mode
        ));
    }
    let mut keys: Vec<_> = descriptor.children.iter().collect();
    keys.sort_by_key(|(key, _)| *key);
    for (_, children) in keys {
        let mut values: Vec<_> = children.values.iter().collect();
        values.sort_by_key(|(value, _)| *value);
        for (_, child) in values {
            dump_descriptor(child, out);
        }
        if let Some(default) = &children.default {
            dump_descriptor(default, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumped_as_upstream_dumps() {
        let text = "domain: d\ndescriptors:\n  - key: k\n    value: v\n    shadow_mode: true\n    rate_limit: { unit: \
                    minute, requests_per_unit: 5 }\n    descriptors:\n      - key: sub\n        rate_limit: { unit: \
                    second, requests_per_unit: 1 }\n  - key: free\n    rate_limit: { unlimited: true }\n";
        let config = RlsConfig::from_texts([("d.yaml", text)], false).unwrap();
        assert_eq!(
            dump(&config),
            "d.free: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n\
             d.k_v: unit=MINUTE requests_per_unit=5, shadow_mode: true, quota_mode: false\n\
             d.k_v.sub: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false\n"
        );
    }
}
