//! What the operations tests share: `rlctl metrics` as a process, an HTTP
//! GET, Prometheus' own Python parser and promtool.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `rlctl metrics` running, its stderr kept in a file.
pub struct Exporter {
    child: Child,
    pub port: u16,
    log: tempfile::NamedTempFile,
}

impl Exporter {
    pub fn start(redis: &str) -> Exporter {
        let port = testkit::free_port();
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_rlctl"))
            .args(["metrics", "--redis", redis, "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("rlctl metrics");
        Exporter { child, port, log }
    }

    /// The page of `/metrics`, its HTTP head cut off; panics unless 200.
    pub fn scrape(&self) -> String {
        let page = get(self.port, "/metrics");
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        page.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
    }

    /// What the exporter has written to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `path` on a local port (once it listens), the whole response.
pub fn get(port: u16, path: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "nothing listens on {port}: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file of the repository, as text.
pub fn repo_file(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One family as Prometheus' Python parser (prometheus_client) read it.
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
    pub labels: std::collections::BTreeMap<String, String>,
    pub value: f64,
}

/// `text` read by prometheus_client's parser (from `make servers`, under
/// .deps/), which types each sample by the family it follows, as
/// Prometheus' own scrape parser does.
pub fn parse_prometheus(text: &str) -> Vec<Family> {
    let lib = repo().join(".deps/prometheus-client");
    assert!(
        lib.join("prometheus_client/parser.py").exists(),
        "Prometheus' Python parser is not under {}: run `make servers` (it fetches the prometheus-client wheel)",
        lib.display()
    );
    let mut child = Command::new("python3")
        .arg(repo().join("rules/tests/support/promparse.py"))
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

/// Runs promtool (Debian's prometheus package: `make deps` installs it)
/// with `args` in `dir`; its status and output.
pub fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool").args(args).current_dir(dir).output().unwrap_or_else(|e| {
        panic!("promtool: {e}: run `make deps` (it installs Debian's prometheus package, which has promtool)")
    });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}
