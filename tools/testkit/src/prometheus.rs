//! Prometheus text as Prometheus' Python parser (prometheus_client, from
//! `make servers`, under .deps/) reads it: each sample typed by the family
//! it follows, as Prometheus' own scrape parser does.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// One family as the parser read it.
#[derive(Debug, serde::Deserialize)]
pub struct Family {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub samples: Vec<Sample>,
}

#[derive(Debug, serde::Deserialize)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// `text` read by prometheus_client's parser; panics, showing the text,
/// if the parser refuses it.
pub fn parse(text: &str) -> Vec<Family> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = here.join("../../.deps/prometheus-client");
    assert!(
        lib.join("prometheus_client/parser.py").exists(),
        "Prometheus' Python parser is not under {}: run `make servers` (it fetches the prometheus-client wheel)",
        lib.display()
    );
    let mut child = Command::new("python3")
        .arg(here.join("promparse.py"))
        .env("PYTHONPATH", &lib)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the parser refused the text: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the parser's JSON")
}
