//! What the rlctl tests share: `rlctl metrics` as a process, an `rlctl`
//! run, an HTTP GET, a file of the repository.

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

/// What an `rlctl` run ended with.
pub struct Run {
    pub code: i32,
    pub out: String,
    pub err: String,
}

/// The built `rlctl` with `args` (RL_REDIS_URL unset), off the runtime's threads.
pub async fn rlctl(args: &[&str]) -> Run {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_rlctl")).args(&args).env_remove("RL_REDIS_URL").output().unwrap()
    })
    .await
    .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&output.stdout).into_owned(),
        err: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
