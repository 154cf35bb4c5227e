//! Prometheus text, the one piece every exporter of the tree shares.

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
    fn label_values_escape_what_the_text_format_reads_as_syntax() {
        assert_eq!(prometheus_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(prometheus_label("line\nnext"), "line\\nnext");
        assert_eq!(prometheus_label("plain {x=1}"), "plain {x=1}");
    }
}
