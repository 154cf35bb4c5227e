//! What rl-client's Lua scripts can count (`--redis-backend lua`): their
//! bounds beyond the module's (`rl_client::internal::beyond_lua`, the one
//! statement of them) applied to a config's limits, so a config they
//! cannot serve is refused when it loads (a file, an xDS version), never
//! found out call by call, each call then answered by the failure mode.

use std::sync::Arc;

use rl_client::internal::beyond_lua;

use super::{Algorithm, ConfigError, Descriptor, Limit, Problem, RlsConfig};

impl Limit {
    /// The field the scripts cannot count, and why; None when they can (or
    /// when it counts nothing: unlimited, zero).
    pub fn beyond_lua(&self) -> Option<(&'static str, String)> {
        let unit = self.unit.filter(|_| !self.unlimited && self.requests_per_unit > 0)?;
        let rpu = u64::from(self.requests_per_unit);
        let (field, n, exact_log) = match (self.algorithm, self.burst) {
            // A slot set holds its limit's members: the module's bounds.
            (Algorithm::Concurrency, _) => return None,
            (Algorithm::TokenBucket, Some(burst)) => ("burst", u64::from(burst), false),
            (Algorithm::ExactWindow, _) => ("requests_per_unit", rpu, true),
            _ => ("requests_per_unit", rpu, false),
        };
        let why = beyond_lua(n, unit.ms(), exact_log)?;
        Some((
            field,
            format!("{field} {n} with unit {}: {why} (--redis-backend lua)", unit.name().to_ascii_lowercase()),
        ))
    }
}

impl RlsConfig {
    /// The limits the scripts cannot count, each as the refusal that names
    /// its file, line and path; in file order.
    pub fn beyond_lua(&self) -> Vec<ConfigError> {
        let mut limits = Vec::new();
        for root in self.domains.values() {
            walk(root, &mut limits);
        }
        let mut found: Vec<ConfigError> = limits
            .into_iter()
            .filter_map(|limit| {
                let (field, reason) = limit.beyond_lua()?;
                let o = &limit.origin;
                let path = format!("{}.{field}", o.path);
                let problem = Problem { line: o.line, path, reason: reason.clone() };
                Some(ConfigError { file: o.file.clone(), problem: Some(problem), reason })
            })
            .collect();
        found.sort_by(|a, b| {
            let at = |e: &ConfigError| e.problem.as_ref().map_or(0, |p| p.line);
            (self.files.iter().position(|f| *f == a.file), at(a))
                .cmp(&(self.files.iter().position(|f| *f == b.file), at(b)))
        });
        found
    }
}

impl RlsConfig {
    /// Refused when a limit is beyond the scripts: the first one, and how
    /// many more.
    pub fn fits_lua(&self) -> Result<(), ConfigError> {
        let mut found = self.beyond_lua();
        if found.is_empty() {
            return Ok(());
        }
        let more = found.len() - 1;
        let mut first = found.swap_remove(0);
        if more > 0 {
            let also = format!(" (and {more} more limits beyond them)");
            first.reason.push_str(&also);
            if let Some(p) = &mut first.problem {
                p.reason.push_str(&also);
            }
        }
        Err(first)
    }
}

fn walk<'a>(node: &'a Descriptor, out: &mut Vec<&'a Arc<Limit>>) {
    out.extend(&node.limit);
    for children in node.children.values() {
        for child in children.values.values().chain(&children.default) {
            walk(child, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YEARLY: &str = "domain: d
descriptors:
  - key: fits
    rate_limit: {unit: year, requests_per_unit: 142808}
  - key: tenant
    descriptors:
      - key: plan
        value: big
        rate_limit: {unit: year, requests_per_unit: 142809}
  - key: log
    rate_limit: {unit: second, requests_per_unit: 10001, algorithm: exact_window}
  - key: bucket
    rate_limit: {unit: day, requests_per_unit: 10, burst: 60000000, algorithm: token_bucket}
  - key: slots
    descriptors:
      - key: request_id
        rate_limit: {unit: year, requests_per_unit: 100000, algorithm: concurrency}
  - key: open
    rate_limit: {unlimited: true}
";

    #[test]
    fn the_limits_beyond_the_scripts_are_named_where_they_are_written() {
        let config = RlsConfig::from_texts([("a.yaml", YEARLY)], false).unwrap();
        let found: Vec<String> = config.beyond_lua().iter().map(ToString::to_string).collect();
        assert_eq!(found.len(), 3, "{found:#?}");
        let first =
            "a.yaml:9: descriptors[1].descriptors[0].rate_limit.requests_per_unit: requests_per_unit 142809 with \
                     unit year: limit x period_ms must be at most 2^52 on the Lua scripts: at most 142808 per \
                     31536000000 ms, got 142809 (--redis-backend lua)";
        assert_eq!(found[0], first);
        let exact =
            "a.yaml:11: descriptors[2].rate_limit.requests_per_unit: requests_per_unit 10001 with unit second: \
                     an EXACT window's limit must be at most 10000";
        assert!(found[1].starts_with(exact), "{}", found[1]);
        let burst = "a.yaml:13: descriptors[3].rate_limit.burst: burst 60000000 with unit day: limit x period_ms";
        assert!(found[2].starts_with(burst), "{}", found[2]);
        let refused = config.fits_lua().unwrap_err().to_string();
        assert_eq!(refused, format!("{} (and 2 more limits beyond them)", found[0]));
        let fits = YEARLY.split("  - key: tenant").next().unwrap();
        assert!(RlsConfig::from_texts([("a.yaml", fits)], false).unwrap().beyond_lua().is_empty());
        assert!(RlsConfig::from_texts([("a.yaml", fits)], false).unwrap().fits_lua().is_ok());
    }
}
