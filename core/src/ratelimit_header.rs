//! The IETF draft's RateLimit header fields (draft-ietf-httpapi-ratelimit-headers),
//! written in one place for every front that sends them: rl-gateway's HTTP
//! headers and the relay's answers to Envoy.
//!
//! - a `RateLimit-Policy` member: `"name";q=<quota>;w=<window seconds>`,
//!   with `;qu="<unit>"` when the quota is not counted in requests;
//! - a `RateLimit` member: `"name";r=<remaining>;t=<seconds>`, `t` left out
//!   when no time can be promised.
//!
//! Names are structured-field strings: printable ASCII, `"` and `\`
//! escaped, anything else replaced by `?`, so a member is always a valid
//! header value.

use std::fmt::Write;

/// Appends `text` as a structured-field string (quoted, escaped).
pub fn push_sf_string(out: &mut String, text: &str) {
    out.reserve(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

/// Appends a `RateLimit-Policy` member: `"name";q=..;w=..` (and
/// `;qu="unit"`); no `w` for a limit without a window (in-flight requests).
pub fn push_policy_member(
    out: &mut String,
    name: &str,
    quota: u64,
    window_secs: Option<u64>,
    quota_unit: Option<&str>,
) {
    push_sf_string(out, name);
    let _ = write!(out, ";q={quota}");
    if let Some(w) = window_secs {
        let _ = write!(out, ";w={w}");
    }
    if let Some(unit) = quota_unit {
        out.push_str(";qu=");
        push_sf_string(out, unit);
    }
}

/// Appends the start of a `RateLimit` member, `"name";r=`: a writer that
/// keeps it adds the remaining count and [`RESET_PARAMETER`] per response.
pub fn push_limit_member_prefix(out: &mut String, name: &str) {
    push_sf_string(out, name);
    out.push_str(";r=");
}

/// What comes between the remaining count and the seconds of a `RateLimit` member.
pub const RESET_PARAMETER: &str = ";t=";

/// Appends a whole `RateLimit` member: `"name";r=..;t=..` (no `t` when `None`).
pub fn push_limit_member(out: &mut String, name: &str, remaining: u64, reset_secs: Option<u64>) {
    push_limit_member_prefix(out, name);
    let _ = write!(out, "{remaining}");
    if let Some(t) = reset_secs {
        let _ = write!(out, "{RESET_PARAMETER}{t}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(f: impl FnOnce(&mut String)) -> String {
        let mut out = String::new();
        f(&mut out);
        out
    }

    #[test]
    fn names_are_quoted_and_escaped() {
        assert_eq!(written(|o| push_sf_string(o, "per-ip")), r#""per-ip""#);
        assert_eq!(written(|o| push_sf_string(o, "a\"b\\c")), r#""a\"b\\c""#);
        assert_eq!(written(|o| push_sf_string(o, "caf\u{e9}\n")), r#""caf??""#);
    }

    #[test]
    fn policy_and_limit_members() {
        assert_eq!(
            written(|o| push_policy_member(o, "per_minute", 5000, Some(60), None)),
            r#""per_minute";q=5000;w=60"#
        );
        assert_eq!(
            written(|o| push_policy_member(o, "bytes", 65535, Some(1), Some("content-bytes"))),
            r#""bytes";q=65535;w=1;qu="content-bytes""#
        );
        assert_eq!(written(|o| push_policy_member(o, "streams", 20, None, None)), r#""streams";q=20"#);
        assert_eq!(written(|o| push_limit_member(o, "per_second", 7, Some(1))), r#""per_second";r=7;t=1"#);
        assert_eq!(written(|o| push_limit_member(o, "per_second", 0, None)), r#""per_second";r=0"#);
        assert_eq!(written(|o| push_limit_member_prefix(o, "x")), r#""x";r="#);
    }
}
