//! Which limit a request's descriptor gets, as envoyproxy/ratelimit's
//! `GetLimit` decides it, and the name its statistics go under.
//!
//! At each level, among the descriptors of the entry's key: its exact
//! value, else the first wildcard pattern that matches the value in file
//! order (not the longest), else the key's descriptor without a value. A
//! limit applies only on the node the last entry reaches: a request deeper
//! or shallower than the tree gets none. A node reached with no limit
//! answers no limit (a whitelist).
//!
//! Unlike envoyproxy/ratelimit, which looks the string `key_value` up, the
//! key and the value are matched apart: there, the entry (`a`, `b`) finds
//! the descriptor of key `a_b` (and a pattern `a_b*` the entry
//! (`a_bc`, `x`)) before the one of key `a`. Descriptors whose joined names
//! collide are refused at load, as there: the name is their statistics'.

use std::sync::Arc;

use super::{Descriptor, Limit, RlsConfig, Unit};

/// A limit found for a descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub limit: Arc<Limit>,
    /// Its statistics' key (`domain.key1_value1.subkey1`), before the
    /// stats sanitising.
    pub stats_key: String,
    /// Per request entry: the wildcard pattern that stands for its value
    /// in the counter (`share_threshold`), if any.
    pub shared: Vec<Option<String>>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    UnknownDomain,
    /// The domain is known, nothing limits this descriptor.
    NoLimit,
    Found(Found),
}

/// `*` matches any run of characters, the empty one too; nothing else is
/// special (envoyproxy/ratelimit's `wildcardMatch`).
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, .., last] = parts else { return parts.first().is_some_and(|p| p == value) };
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    if value.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// A request's override: `domain.` and its entries, `key_value` (the
/// value part left out when empty), dot-separated.
pub fn override_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut key = format!("{domain}.");
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            key.push('.');
        }
        key.push_str(k);
        if !v.is_empty() {
            key.push('_');
            key.push_str(v);
        }
    }
    key
}

impl RlsConfig {
    /// The limit of descriptor `entries` in `domain`; `override_limit` is
    /// the request's own (it applies whatever the tree says, in a known
    /// domain).
    pub fn lookup(&self, domain: &str, entries: &[(&str, &str)], override_limit: Option<(u32, Unit)>) -> Lookup {
        let Some(root) = self.domains.get(domain) else { return Lookup::UnknownDomain };
        if let Some((requests_per_unit, unit)) = override_limit {
            let key = override_key(domain, entries);
            let limit = Limit::override_of(requests_per_unit, unit, key.clone());
            return Lookup::Found(Found { limit: Arc::new(limit), stats_key: key, shared: Vec::new() });
        }
        let mut level: &Descriptor = root;
        let mut found: Option<Arc<Limit>> = None;
        let mut detailed_key = domain.to_string();
        let mut metric_key = domain.to_string();
        let mut shared: Vec<Option<String>> = Vec::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            detailed_key.push('.');
            detailed_key.push_str(key);
            detailed_key.push('_');
            detailed_key.push_str(value);
            let children = level.children.get(*key);
            let mut next = children.and_then(|c| c.values.get(*value));
            let mut wildcard: Option<&str> = None;
            if let (None, Some(c)) = (next, children) {
                if let Some((pattern, _)) = c.wildcards.iter().find(|(_, parts)| wildcard_match(parts, value)) {
                    next = c.values.get(pattern);
                    wildcard = Some(pattern);
                }
            }
            let by_value = next.is_some();
            if next.is_none() {
                next = children.and_then(|c| c.default.as_ref());
            }
            if let (Some(pattern), Some(node)) = (wildcard, next) {
                if node.share_threshold {
                    shared.resize(entries.len(), None);
                    shared[i] = Some(pattern.to_string());
                }
            }
            metric_key.push('.');
            metric_key.push_str(key);
            if let Some(node) = next {
                let shown = match wildcard {
                    Some(pattern) => match &shared.get(i) {
                        Some(Some(p)) => p.clone(),
                        _ if node.value_to_metric => value.to_string(),
                        _ => pattern.to_string(),
                    },
                    None if by_value => value.to_string(),
                    None if node.value_to_metric => value.to_string(),
                    None => String::new(),
                };
                if !shown.is_empty() {
                    metric_key.push('_');
                    metric_key.push_str(&shown);
                }
            }
            match next {
                Some(node) => {
                    if i == entries.len() - 1 {
                        found = node.limit.clone();
                    }
                    if node.children.is_empty() {
                        break;
                    }
                    level = node;
                }
                None => break,
            }
        }
        let Some(limit) = found else { return Lookup::NoLimit };
        let stats_key = if limit.detailed_metric {
            if shared.iter().any(Option::is_some) {
                let mut key = domain.to_string();
                for (i, (k, v)) in entries.iter().enumerate() {
                    key.push('.');
                    key.push_str(k);
                    match shared.get(i) {
                        Some(Some(pattern)) => {
                            key.push('_');
                            key.push_str(pattern);
                        }
                        _ if !v.is_empty() => {
                            key.push('_');
                            key.push_str(v);
                        }
                        _ => {}
                    }
                }
                key
            } else {
                detailed_key
            }
        } else if metric_key != limit.full_key {
            metric_key
        } else {
            limit.full_key.clone()
        };
        Lookup::Found(Found { limit, stats_key, shared })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(pattern: &str) -> Vec<String> {
        pattern.split('*').map(str::to_string).collect()
    }

    #[test]
    fn wildcards_match_as_envoyproxy_ratelimit_matches_them() {
        for (pattern, value, expected) in [
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("foo*", "fo", false),
            ("bar*b", "barb", true),
            ("bar*b", "barab", true),
            ("bar*b", "bara", false),
            ("bar*b", "xbarb", false),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foo123bar456baz", true),
            ("foo*bar*baz", "foo123baz", false),
            ("ab*ba", "aba", false),
            ("k_*", "k_", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("*", "", true),
        ] {
            assert_eq!(wildcard_match(&parts(pattern), value), expected, "{pattern} ~ {value}");
        }
    }
}
