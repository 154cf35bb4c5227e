//! A rule's limits compiled: each a bucket, a window (sliding, exact, a
//! quota) or an in-flight limit, checked in the module's words.

use crate::{period_ms, validate_name, FailMode, InflightRule, Rule};
use rl_core::inflight::{InflightParams, MAX_INFLIGHT_LIMIT};
use rl_core::limits::{in_range, MAX_KEYS, MAX_LOG_LIMIT, MAX_PERIOD_MS, MAX_TOKENS};
use rl_core::ParamError;

use super::out_of_range;
use crate::live::spec::{LimitKind, LimitSpec, Mode, RuleSpec};

/// A rule's limits, each checked (faults pushed, named with `at`), with
/// the rule's fail mode and mode: its rate limits and its in-flight limits.
/// `None` when the rule has no limits or too many to check one by one.
pub(super) fn compile_limits(
    spec: &RuleSpec,
    at: &str,
    errors: &mut Vec<String>,
) -> Option<(Vec<Rule>, Vec<InflightRule>)> {
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
    Some((limits, inflight))
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
