//! How the reports write numbers, verdicts and Markdown tables.

use std::fmt::Write as _;

/// A check's verdict; the runs fail on `FAIL`.
pub fn pass(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "FAIL"
    }
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `n` over `seconds`, a whole number with thousands.
pub fn per_second(n: u64, seconds: f64) -> String {
    thousands((n as f64 / seconds).round() as u64)
}

/// A Markdown table's head: its columns (`"phase | requests"`, an empty
/// one left blank), then one letter a column for the alignment (`l` left,
/// `r` right).
pub fn head(w: &mut String, columns: &str, align: &str) {
    let columns: Vec<&str> = columns.split('|').map(str::trim).collect();
    assert_eq!(columns.len(), align.len(), "one alignment a column: {columns:?}");
    w.push('|');
    for c in columns {
        let _ = if c.is_empty() { write!(w, " |") } else { write!(w, " {c} |") };
    }
    w.push_str("\n|");
    for a in align.chars() {
        w.push_str(if a == 'r' { "---:|" } else { "---|" });
    }
    w.push('\n');
}

/// A Markdown table's row.
pub fn row<T: std::fmt::Display>(w: &mut String, cells: &[T]) {
    w.push('|');
    for c in cells {
        let _ = write!(w, " {c} |");
    }
    w.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_and_tables() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(30_000_000), "30,000,000");
        let mut w = String::new();
        head(&mut w, " | design | here", "llr");
        row(&mut w, &["a", "", "2"]);
        assert_eq!(w, "| | design | here |\n|---|---|---:|\n| a |  | 2 |\n");
    }
}
