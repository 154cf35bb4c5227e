//! The rl-balancer binary as a real process: a rules file over the regions
//! given, its exit status and its log (stderr), read while it runs.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_rl-balancer");

/// A rules file with one global rule over `regions` (removed on drop).
pub struct RulesFile(pub PathBuf);

impl RulesFile {
    pub fn new(regions: &[&str]) -> RulesFile {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("rl-balancer-{}-{n}.toml", std::process::id()));
        let names: Vec<String> = regions.iter().map(|r| format!("{r:?}")).collect();
        std::fs::write(
            &path,
            format!(
                "[[rules]]\nid = \"api\"\nreason = \"test\"\nlimits = [{{ name = \"s\", rate = 100, per = \"1s\" }}]\nglobal = {{ regions = [{}], floor = 0.05 }}\n",
                names.join(", ")
            ),
        )
        .unwrap();
        RulesFile(path)
    }
}

impl Drop for RulesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Fast timings that every relation accepts: rounds every 200 ms.
pub const FAST: &[&str] = &[
    "--interval",
    "200ms",
    "--gateway-refresh",
    "50ms",
    "--gateway-timeout",
    "100ms",
    "--timeout",
    "300ms",
    "--stale-after",
    "3s",
    "--settle",
    "1s",
];

/// `--rules FILE` and a `--region` per (name, url).
pub fn base_args(rules: &RulesFile, regions: &[(&str, String)]) -> Vec<String> {
    let mut args = vec!["--rules".to_string(), rules.0.display().to_string()];
    for (name, url) in regions {
        args.push("--region".into());
        args.push(format!("{name}={url}"));
    }
    args
}

/// Runs the binary to its end (it must end within 20 s): status and stderr.
pub fn run_to_end(args: &[String]) -> (ExitStatus, String) {
    let mut running = Running::start(args);
    let status = running.wait_exit(Duration::from_secs(20)).expect("the balancer exits");
    (status, running.log())
}

/// A running balancer, killed on drop; its stderr collected line by line.
pub struct Running {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Running {
    pub fn start(args: &[String]) -> Running {
        let mut child = Command::new(BIN)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (stderr, sink) = (child.stderr.take().unwrap(), log.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Running { child, log }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the log satisfies `done` (panics with the log after `within`,
    /// or if the process exits first).
    pub fn wait_log(&mut self, within: Duration, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            let log = self.log();
            if done(&log) {
                return log;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                let log = self.log();
                if done(&log) {
                    return log;
                }
                panic!("the balancer exited ({status}) before the expected log:\n{}", tail(&log));
            }
            assert!(Instant::now() < deadline, "not in the log within {within:?}:\n{}", tail(&log));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status, if the process ends within `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the reader thread take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Sends it `signal` (`HUP`, `TERM`), as a supervisor does.
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill").arg(format!("-{signal}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(sent.success(), "kill -{signal} failed");
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lines of `log` that contain `word`.
pub fn lines_with<'a>(log: &'a str, word: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(word)).collect()
}

/// The last lines of a log, for a failure message.
pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

/// `GET path` on `port` (its `--metrics`): the status code and the body.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    try_get(port, path).unwrap()
}

pub fn try_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: balancer\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    let status = response.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}
