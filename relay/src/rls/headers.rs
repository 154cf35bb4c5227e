//! Response headers the RLS front asks Envoy to add
//! (`response_headers_to_add`), built from a request's limits:
//!
//! - `off` (the default, as envoyproxy/ratelimit without
//!   LIMIT_RESPONSE_HEADERS_ENABLED): none. (Envoy makes `x-ratelimit-*`
//!   itself from the statuses with `enable_x_ratelimit_headers`.)
//! - `draft`: the IETF draft's `RateLimit-Policy` (every
//!   enforced limit: `"name";q=<requests_per_unit>;w=<unit seconds>`) and
//!   `RateLimit` (the binding limit: `"name";r=<left>;t=<seconds until
//!   more quota>`), and `Retry-After` on OVER_LIMIT (whole seconds,
//!   rounded up, at least one), the longest wait of the refusing limits. A
//!   limit is named by its `name`, else by its quota (`"100-per-minute"`):
//!   never by its descriptor, whose values (a tenant, a user) are not the
//!   client's to read.
//! - `envoyproxy`: envoyproxy/ratelimit's three (`RateLimit-Limit`,
//!   `RateLimit-Remaining`, `RateLimit-Reset`, the names of its
//!   LIMIT_RESPONSE_HEADERS_ENABLED, named as its LIMIT_*_HEADER), for the
//!   limit it picks: the fewest left, a refusing one over any other.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use rl_core::ratelimit_header::{push_limit_member, push_policy_member};

/// Which headers to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Style {
    Draft,
    Envoyproxy(Names),
    #[default]
    Off,
}

impl Style {
    pub fn parse(text: &str) -> Result<Style, String> {
        match text {
            "draft" => Ok(Style::Draft),
            "envoyproxy" => Ok(Style::Envoyproxy(Names::default())),
            "off" => Ok(Style::Off),
            _ => Err(format!("'{text}': draft, envoyproxy or off")),
        }
    }

    /// The style with `names` for envoyproxy/ratelimit's three headers.
    pub fn named(self, names: Names) -> Style {
        match self {
            Style::Envoyproxy(_) => Style::Envoyproxy(names),
            other => other,
        }
    }
}

/// The names of envoyproxy/ratelimit's three headers (its
/// `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
/// Read once at start and kept for the process's life (so a style is
/// `Copy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Names {
    pub limit: &'static str,
    pub remaining: &'static str,
    pub reset: &'static str,
}

impl Default for Names {
    fn default() -> Names {
        Names { limit: "RateLimit-Limit", remaining: "RateLimit-Remaining", reset: "RateLimit-Reset" }
    }
}

impl Names {
    /// `LIMIT,REMAINING,RESET`: three header names (RFC 9110 tokens).
    pub fn parse(text: &str) -> Result<Names, String> {
        let names: Vec<&str> = text.split(',').map(str::trim).collect();
        let token =
            |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        match names[..] {
            [limit, remaining, reset] if names.iter().all(|n| token(n)) => Ok(Names {
                limit: Box::leak(limit.into()),
                remaining: Box::leak(remaining.into()),
                reset: Box::leak(reset.into()),
            }),
            _ => Err(format!("'{text}': three header names, LIMIT,REMAINING,RESET")),
        }
    }
}

/// One limited descriptor of the answer, as the headers see it.
#[derive(Clone, Debug)]
pub struct Limited<'a> {
    /// The limit's `name` (empty: none; it is then named by its quota).
    pub name: &'a str,
    pub requests_per_unit: u32,
    pub unit_seconds: u64,
    pub remaining: u64,
    /// This limit refused the request.
    pub over: bool,
    /// Ms until it admits again (over), or until more quota (admitted).
    pub wait_ms: u64,
    /// Ms until its window resets.
    pub reset_ms: u64,
}

/// A limit's name in the draft's headers: its `name`, else its quota.
fn policy_name(l: &Limited) -> String {
    if !l.name.is_empty() {
        return l.name.to_string();
    }
    let unit = match l.unit_seconds {
        1 => "second",
        60 => "minute",
        3600 => "hour",
        86_400 => "day",
        604_800 => "week",
        2_592_000 => "month",
        31_536_000 => "year",
        _ => return format!("{}-per-{}s", l.requests_per_unit, l.unit_seconds),
    };
    format!("{}-per-{unit}", l.requests_per_unit)
}

fn seconds_up(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue { key: key.into(), value, ..HeaderValue::default() }
}

/// The headers of an answer (`refused`: its overall code is OVER_LIMIT).
pub fn headers(style: Style, limits: &[Limited], refused: bool) -> Vec<HeaderValue> {
    if limits.is_empty() {
        return Vec::new();
    }
    match style {
        Style::Off => Vec::new(),
        Style::Envoyproxy(names) => {
            // envoyproxy/ratelimit's pick: the fewest left (the first on
            // ties), and any refusing limit over that (the last one met).
            let mut pick: Option<&Limited> = None;
            for l in limits {
                if l.over || pick.is_none_or(|p| !p.over && l.remaining < p.remaining) {
                    pick = Some(l);
                }
            }
            let Some(l) = pick else { return Vec::new() };
            vec![
                header(names.limit, l.requests_per_unit.to_string()),
                header(names.remaining, l.remaining.to_string()),
                header(names.reset, seconds_up(l.reset_ms).to_string()),
            ]
        }
        Style::Draft => {
            let mut policy = Vec::new();
            for l in limits {
                let mut item = String::new();
                push_policy_member(&mut item, &policy_name(l), l.requests_per_unit.into(), Some(l.unit_seconds), None);
                if !policy.contains(&item) {
                    policy.push(item);
                }
            }
            // The binding limit: the refusing one with the longest wait, or
            // the one with the fewest left.
            let binding = if refused {
                limits.iter().filter(|l| l.over).max_by_key(|l| l.wait_ms)
            } else {
                limits.iter().min_by_key(|l| l.remaining)
            };
            let mut out = vec![header("RateLimit-Policy", policy.join(", "))];
            if let Some(b) = binding {
                let remaining = if refused { 0 } else { b.remaining };
                let mut member = String::new();
                push_limit_member(&mut member, &policy_name(b), remaining, Some(seconds_up(b.wait_ms)));
                out.push(header("RateLimit", member));
                if refused {
                    out.push(header("Retry-After", seconds_up(b.wait_ms).max(1).to_string()));
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(name: &str, remaining: u64, over: bool, wait_ms: u64) -> Limited<'_> {
        Limited { name, requests_per_unit: 10, unit_seconds: 60, remaining, over, wait_ms, reset_ms: 58_000 }
    }

    fn text(h: &[HeaderValue]) -> Vec<String> {
        h.iter().map(|h| format!("{}: {}", h.key, h.value)).collect()
    }

    #[test]
    fn draft_fields_and_retry_after() {
        let limits = [limited("per-ip", 3, false, 58_000), limited("per\"key", 7, false, 58_000)];
        assert_eq!(
            text(&headers(Style::Draft, &limits, false)),
            ["RateLimit-Policy: \"per-ip\";q=10;w=60, \"per\\\"key\";q=10;w=60", "RateLimit: \"per-ip\";r=3;t=58"]
        );
        let limits = [limited("a", 3, false, 58_000), limited("b", 0, true, 200)];
        assert_eq!(
            text(&headers(Style::Draft, &limits, true)),
            ["RateLimit-Policy: \"a\";q=10;w=60, \"b\";q=10;w=60", "RateLimit: \"b\";r=0;t=1", "Retry-After: 1"]
        );
        assert!(headers(Style::Off, &limits, true).is_empty());
        assert_eq!(Style::default(), Style::Off);
        let unnamed = [limited("", 3, false, 1_000)];
        assert_eq!(text(&headers(Style::Draft, &unnamed, false))[0], "RateLimit-Policy: \"10-per-minute\";q=10;w=60");
        assert!(headers(Style::Draft, &[], true).is_empty());
    }

    #[test]
    fn envoyproxy_ratelimit_picks_as_it_does() {
        let limits = [limited("a", 0, true, 58_000), limited("b", 5, false, 58_000)];
        assert_eq!(
            text(&headers(Style::Envoyproxy(Names::default()), &limits, true)),
            ["RateLimit-Limit: 10", "RateLimit-Remaining: 0", "RateLimit-Reset: 58"]
        );
        let limits = [limited("a", 4, false, 1), limited("b", 4, false, 1), limited("c", 2, false, 1)];
        assert_eq!(text(&headers(Style::Envoyproxy(Names::default()), &limits, false))[1], "RateLimit-Remaining: 2");
        let names = Names::parse("X-Limit, X-Left,X-Reset").unwrap();
        assert_eq!(text(&headers(Style::Envoyproxy(names), &limits, false))[1], "X-Left: 2");
        assert!(Names::parse("a,b").is_err() && Names::parse("a,b c,d").is_err() && Names::parse("a,,c").is_err());
    }
}
