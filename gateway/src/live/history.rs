//! Past rule sets kept in Redis (`<key>:history`, newest first, at most
//! [`HISTORY_LEN`]), and what changed between two sets.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::live::spec::{RuleSetSpec, RuleSpec};

/// Rule sets kept: each is at most 1 MiB, so the list stays bounded.
pub const HISTORY_LEN: usize = 10;

/// One published rule set.
#[derive(Clone, Debug)]
pub struct HistoryEntry {
    /// The version it was published as.
    pub version: u64,
    /// Its lineage.
    pub lineage: String,
    /// When.
    pub published_at: SystemTime,
    /// The set.
    pub rules: RuleSetSpec,
}

impl HistoryEntry {
    /// `VERSION LINEAGE MS`, a newline, the set as JSON (the store's script
    /// writes it); `None` if it does not parse.
    pub(crate) fn parse(raw: &str) -> Option<HistoryEntry> {
        let (head, json) = raw.split_once('\n')?;
        let mut parts = head.split(' ');
        let version = parts.next()?.parse().ok()?;
        let lineage = parts.next()?.to_owned();
        let ms: u64 = parts.next()?.parse().ok()?;
        let rules = RuleSetSpec::from_json(json).ok()?;
        Some(HistoryEntry { version, lineage, published_at: UNIX_EPOCH + Duration::from_millis(ms), rules })
    }
}

/// What changed from `old` to `new`, one line per setting or rule
/// (`+` added, `-` removed, `~` changed); empty when they are the same.
pub fn diff(old: &RuleSetSpec, new: &RuleSetSpec) -> Vec<String> {
    let mut out = Vec::new();
    let settings = |s: &RuleSetSpec| {
        let json = RuleSetSpec { version: None, rules: Vec::new(), ..s.clone() }.to_json();
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&json).unwrap_or_default()
    };
    let (a, b) = (settings(old), settings(new));
    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        match (a.get(name), b.get(name)) {
            (Some(x), Some(y)) if x != y => out.push(format!("~ {name}: {x} -> {y}")),
            (Some(x), None) => out.push(format!("- {name}: {x}")),
            (None, Some(y)) => out.push(format!("+ {name}: {y}")),
            _ => {}
        }
    }
    let find = |set: &RuleSetSpec, id: &str| set.rules.iter().find(|r| r.id == id).cloned();
    let mut ids: Vec<&str> = old.rules.iter().chain(&new.rules).map(|r| r.id.as_str()).collect();
    ids.sort();
    ids.dedup();
    for id in ids {
        match (find(old, id), find(new, id)) {
            (Some(x), Some(y)) if x.to_json() != y.to_json() => {
                out.push(format!("~ rule '{id}': {}", described(&x)));
                out.push(format!("  {:>width$}  {}", "->", described(&y), width = id.len() + 8));
            }
            (Some(x), None) => out.push(format!("- rule '{id}': {}", described(&x))),
            (None, Some(y)) => out.push(format!("+ rule '{id}': {}", described(&y))),
            _ => {}
        }
    }
    out
}

/// A rule in one line: its match, limits and the rest as JSON fields.
fn described(rule: &RuleSpec) -> String {
    let limits: Vec<String> = rule.limits.iter().map(ToString::to_string).collect();
    let json = RuleSpec { limits: Vec::new(), id: String::new(), ..rule.clone() }.to_json();
    let mut rest = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&json).unwrap_or_default();
    rest.remove("id");
    rest.remove("limits");
    format!("{} {}", limits.join(", "), serde_json::Value::Object(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(toml: &str) -> RuleSetSpec {
        RuleSetSpec::from_text(std::path::Path::new("t.toml"), toml).unwrap()
    }

    #[test]
    fn entries_parse_and_diffs_name_what_changed() {
        let a = set(
            "key_prefix = \"api\"\n[[rules]]\nid = \"default\"\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 10, per = \"1s\" }]\n\
             [[rules]]\nid = \"gone\"\nmatch = { plan = \"free\" }\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 1, per = \"1s\" }]\n",
        );
        let b = set(
            "key_prefix = \"api2\"\n[[rules]]\nid = \"default\"\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 20, per = \"1s\" }]\n",
        );
        let lines = diff(&a, &b);
        assert_eq!(lines[0], r#"~ key_prefix: "api" -> "api2""#);
        assert!(lines[1].starts_with("~ rule 'default': s=10/1s"), "{lines:?}");
        assert!(lines[2].contains("s=20/1s"), "{lines:?}");
        assert!(lines[3].starts_with("- rule 'gone': s=1/1s"), "{lines:?}");
        assert!(diff(&a, &a).is_empty());
        let raw = format!("7 abc 1700000000000\n{}", a.to_json());
        let e = HistoryEntry::parse(&raw).unwrap();
        assert_eq!((e.version, e.lineage.as_str()), (7, "abc"));
        assert!(HistoryEntry::parse("7 abc\n{}").is_none());
    }
}
