//! The Redis key of a descriptor's counter: the prefix, then in a hash tag
//! the domain and the request's entries (a `share_threshold` entry's
//! pattern in place of its value), then the algorithm and the unit:
//! `rl:rls:{edge|remote_address=10.0.0.1}:fixed:second`. Unlike
//! envoyproxy/ratelimit's `edge_remote_address_10.0.0.1_1700000000`, the
//! parts are escaped, so no two descriptors share a counter by accident
//! (`a_b`+`c` and `a`+`b_c`); the window's start lives in the value (the
//! module's fixed window), not in the name. The hash tag is the whole
//! descriptor: one key, one slot, spread over a cluster.

use super::config::{Algorithm, Unit};

/// `%`, the tag's braces and the separators, escaped as `%XX`, with
/// control bytes.
fn escape(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '%' | '{' | '}' | '|' | '=' | '\u{0}'..='\u{1f}' | '\u{7f}' => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            _ => out.push(c),
        }
    }
}

/// The counter key of `entries` (key, value or its shared pattern).
pub fn counter_key(prefix: &str, domain: &str, entries: &[(&str, &str)], algorithm: Algorithm, unit: Unit) -> String {
    let mut key = String::with_capacity(prefix.len() + domain.len() + 32 + entries.len() * 24);
    key.push_str(prefix);
    key.push('{');
    escape(&mut key, domain);
    for (k, v) in entries {
        key.push('|');
        escape(&mut key, k);
        key.push('=');
        escape(&mut key, v);
    }
    key.push_str("}:");
    key.push_str(match algorithm {
        Algorithm::FixedWindow => "fixed",
        Algorithm::TokenBucket => "bucket",
        Algorithm::SlidingWindow => "sliding",
        Algorithm::ExactWindow => "exact",
        Algorithm::Concurrency => "inflight",
    });
    key.push(':');
    key.push_str(&unit.name().to_ascii_lowercase());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unambiguous_and_tagged() {
        let k = |entries: &[(&str, &str)]| counter_key("rls:", "d", entries, Algorithm::FixedWindow, Unit::Minute);
        assert_eq!(k(&[("remote_address", "10.0.0.1")]), "rls:{d|remote_address=10.0.0.1}:fixed:minute");
        assert_ne!(k(&[("a_b", "c")]), k(&[("a", "b_c")]));
        assert_ne!(k(&[("a", "b|c=d")]), k(&[("a", "b"), ("c", "d")]));
        assert_eq!(k(&[("k", "{x}%\n")]), "rls:{d|k=%7Bx%7D%25%0A}:fixed:minute");
        assert_eq!(
            counter_key("p:", "d", &[("k", "")], Algorithm::TokenBucket, Unit::Second),
            "p:{d|k=}:bucket:second"
        );
    }
}
