//! Prometheus text, the pieces every exporter of the tree shares: a
//! family's HELP and TYPE lines, and a label value escaped.

use std::fmt::Write;

/// Starts a metric family in Prometheus' text format (version 0.0.4): its
/// `# HELP` and `# TYPE` lines; its samples follow, together.
pub fn prometheus_family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
}

/// A Prometheus label value as the text format wants it: backslash, quote
/// and newline escaped (for a team exporting a limiter's counters by name,
/// and the project's own exporters).
pub fn prometheus_label(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_starts_with_its_help_and_type() {
        let mut out = String::new();
        prometheus_family(&mut out, "rl_up", "gauge", "1 when Redis answered.");
        assert_eq!(out, "# HELP rl_up 1 when Redis answered.\n# TYPE rl_up gauge\n");
    }

    #[test]
    fn label_values_escape_what_the_text_format_reads_as_syntax() {
        assert_eq!(prometheus_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(prometheus_label("line\nnext"), "line\\nnext");
        assert_eq!(prometheus_label("plain {x=1}"), "plain {x=1}");
    }
}
