//! Compiling a rule set: every rule and limit checked, with every fault
//! named, and every rule's limits made a [`Policy`](crate::Policy).
//! What comes out is a [`Snapshot`], indexed for matching (`snapshot.rs`).
//! Here the set-wide settings; by what they compile, `rule.rs` (a rule),
//! `scope.rs` (what it matches), `limit.rs` (its limits) and `global.rs`
//! (its split between regions).

mod global;
mod limit;
mod rule;
mod scope;
#[cfg(test)]
mod tests;

use crate::live::shadowing::shadowing_warnings;
use std::sync::Arc;
use std::time::SystemTime;

use crate::{Backend, Error, Result};
use rl_core::limits::in_range;
use rl_core::ParamError;

pub use scope::parse_network;

use crate::live::snapshot::{CompiledRule, Index, Snapshot};
use crate::live::spec::{FleetBackend, RuleSetSpec, RuleSpec, MAX_VERSION, MAX_WRITTEN_VERSION};
use rule::compile_rule;

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
                "gateways on the Lua backend refuse it (declare backend = \"lua\" in the rule file, so publishing refuses it)",
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
        warnings.extend(shadowing_warnings(&rules));
        Ok(Snapshot { version, rules, index, ipv4_prefix, ipv6_prefix, warnings })
    }
}

/// `what` (a rule set, an override) refused, with every fault on its own line.
pub(crate) fn refused(what: &str, faults: &[String]) -> Error {
    Error::Rules(format!("{what} rejected: {}", faults.join("\n")))
}

/// What every rule of a set is compiled against.
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

/// A count out of range, in the words rule files have always used.
pub(super) fn out_of_range(e: ParamError) -> String {
    format!("{} must be from {} to {}, got {}", e.field, e.min, e.max, e.value)
}
