//! What goes into keys and headers (policy prefixes, rule names) and a
//! policy's list of rules, checked the same way for rate policies and
//! in-flight policies, with the same words.

use rl_core::limits::MAX_KEYS;

use rl_client::{Error, Result};

/// Rule names (and rule ids) go into keys and into HTTP headers: keep them
/// plain.
pub fn validate_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) {
        return Err("may hold only ASCII letters, digits, '_', '-' and '.'");
    }
    Ok(())
}

/// Checks a policy of `kind` (`policy`, `in-flight policy`: how errors name
/// it) under `prefix`: the prefix, 1 to 32 rules, each rule's name (plain,
/// never twice), then the rest of each rule with `params`. The parameters,
/// in rule order, or an error naming the rule and the value at fault.
pub(crate) fn validate_rules<R, P>(
    kind: &str,
    prefix: &str,
    rules: &[R],
    name: impl Fn(&R) -> &str,
    params: impl Fn(&R) -> std::result::Result<P, String>,
) -> Result<Vec<P>> {
    if prefix.is_empty() || prefix.contains(['{', '}']) || prefix.bytes().any(|b| b.is_ascii_control()) {
        return Err(Error::invalid(format!(
            "{kind} prefix must be non-empty, without '{{', '}}' or control characters, got {prefix:?}"
        )));
    }
    if rules.is_empty() || rules.len() > MAX_KEYS {
        return Err(Error::invalid(format!("{kind} '{prefix}' needs 1 to {MAX_KEYS} rules, got {}", rules.len())));
    }
    let mut checked = Vec::with_capacity(rules.len());
    for (i, rule) in rules.iter().enumerate() {
        let rule_name = name(rule);
        validate_name(rule_name).map_err(|why| Error::invalid(format!("rule {}: name {why}", i + 1)))?;
        if rules[..i].iter().any(|r| name(r) == rule_name) {
            return Err(Error::invalid(format!("{kind} '{prefix}' names rule '{rule_name}' twice")));
        }
        checked.push(params(rule).map_err(|why| Error::invalid(format!("rule '{rule_name}': {why}")))?);
    }
    Ok(checked)
}
