//! What the alert and dashboard tests share: a file of the repository,
//! promtool, the metric names of a PromQL expression, and
//! deploy/grafana/metrics.txt read by section.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A path in the repository.
pub fn repo_path(path: &str) -> PathBuf {
    repo().join(path)
}

/// The workspace's version (every crate's, the archives' and images').
pub fn version() -> String {
    let cargo = repo_file("Cargo.toml");
    let line = cargo.lines().find(|l| l.starts_with("version = ")).expect("the workspace's version");
    line.trim_start_matches("version = ").trim_matches('"').to_string()
}

/// Runs `program` with `args`: its status and its output (stdout then stderr).
pub fn run(program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// A file of the repository, as text.
pub fn repo_file(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Runs promtool (Debian's prometheus package: `make deps` installs it)
/// with `args` in `dir`; its status and output.
pub fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool").args(args).current_dir(dir).output().unwrap_or_else(|e| {
        panic!("promtool: {e}: run `make deps` (it installs Debian's prometheus package, which has promtool)")
    });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The metric names a PromQL expression reads: label matchers, ranges,
/// grouping clauses and strings left out, and every word followed by `(`
/// (a function or an aggregation) or a keyword.
pub fn promql_metrics(expr: &str) -> Vec<String> {
    const KEYWORDS: [&str; 11] =
        ["by", "without", "and", "or", "unless", "bool", "on", "ignoring", "offset", "group_left", "group_right"];
    let mut names = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let skip_to = |close: char, from: usize| {
            chars[from..].iter().position(|&c| c == close).map_or(chars.len(), |p| from + p + 1)
        };
        if c == '{' {
            i = skip_to('}', i);
        } else if c == '[' {
            i = skip_to(']', i);
        } else if c == '"' {
            i = skip_to('"', i + 1);
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' || c == '$' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':' || chars[i] == '$')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let grouping = ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&word.as_str());
            let rest: String = chars[next..].iter().collect();
            // `sum by (x) (...)`: an aggregation with its clause first.
            let aggregation =
                ["by", "without"].iter().any(|k| rest.strip_prefix(k).is_some_and(|r| r.trim_start().starts_with('(')));
            if grouping && chars.get(next) == Some(&'(') {
                i = skip_to(')', next);
            } else if chars.get(next) != Some(&'(')
                && !aggregation
                && !KEYWORDS.contains(&word.as_str())
                && !word.starts_with('$')
            {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// deploy/grafana/metrics.txt: each component's section and the names under it.
pub fn expected_metrics() -> Vec<(String, Vec<String>)> {
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for line in repo_file("deploy/grafana/metrics.txt").lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            sections.push((name.to_owned(), Vec::new()));
        } else {
            sections.last_mut().expect("a name before any [section]").1.push(line.to_owned());
        }
    }
    sections
}

/// Whether `name` is one of the listed metrics, or a summary's or
/// histogram's own series of one (`_sum`, `_count`, `_bucket`).
pub fn listed(name: &str, sections: &[(String, Vec<String>)]) -> bool {
    let base = ["_sum", "_count", "_bucket"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
    sections.iter().any(|(_, names)| names.iter().any(|n| n == name || n == base))
}
