//! The relay as a child process, and raw RESP over TCP: what every test
//! file of the relay shares.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::free_port;

pub mod certs;
pub mod rls;

/// An `rl-relay` child process listening on a free port, killed on drop.
/// Its standard error is kept (`log`).
pub struct Relay {
    child: Child,
    pub port: u16,
    log: Arc<Mutex<String>>,
    /// `user:password` (or `:password`) for `url`, when the relay asks.
    pub auth: Option<String>,
}

/// How to start one.
#[derive(Default)]
pub struct Start<'a> {
    pub args: Vec<String>,
    pub env: Vec<(&'a str, String)>,
    /// Open-file limit of the process (`ulimit -n`).
    pub max_files: Option<u32>,
    /// Data limit of the process in MiB (`ulimit -d`: heap and private
    /// writable mappings, not reservations nor the code): a relay
    /// that allocates without bound fails its test, not the machine.
    pub max_memory_mib: Option<u64>,
    /// Wait until it listens (false: for a relay that must refuse to start).
    pub no_wait: bool,
    /// As envoyproxy/ratelimit is started: no argument at all (not even
    /// `--listen`, so nothing is waited for) and only `env` in its
    /// environment.
    pub bare: bool,
}

impl<'a> Start<'a> {
    pub fn args(args: &[&str]) -> Start<'a> {
        Start { args: args.iter().map(|s| s.to_string()).collect(), ..Start::default() }
    }
}

impl Relay {
    /// A relay in front of `redis_url` with `extra` options.
    pub fn start(redis_url: &str, extra: &[&str]) -> Relay {
        let mut args = vec!["--redis", redis_url];
        if !extra.contains(&"--timeout-ms") {
            args.extend(["--timeout-ms", "1000"]);
        }
        args.extend_from_slice(extra);
        Relay::spawn(Start::args(&args))
    }

    pub fn spawn(start: Start) -> Relay {
        let port = free_port();
        // RL_RELAY_BIN runs the tests against another build (an older one,
        // to see a regression test fail).
        let bin = std::env::var("RL_RELAY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rl-relay").into());
        let mut ulimits = Vec::new();
        if let Some(n) = start.max_files {
            ulimits.push(format!("ulimit -n {n}"));
        }
        if let Some(mib) = start.max_memory_mib {
            ulimits.push(format!("ulimit -d {}", mib * 1024));
        }
        let mut cmd = if ulimits.is_empty() {
            Command::new(&bin)
        } else {
            let mut c = Command::new("sh");
            c.arg("-c").arg(format!("{} && exec \"$0\" \"$@\"", ulimits.join(" && "))).arg(&bin);
            c
        };
        if start.bare {
            cmd.env_clear();
        } else {
            cmd.arg("--listen").arg(format!("127.0.0.1:{port}"));
        }
        cmd.args(&start.args);
        cmd.env_remove("RL_RELAY_AUTH");
        for (k, v) in &start.env {
            cmd.env(k, v);
        }
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut relay = Relay { child, port, log, auth: None };
        if !start.no_wait && !start.bare {
            relay.wait_listening();
        }
        relay
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "rl-relay did not listen on {}", self.port);
            assert!(self.alive(), "rl-relay exited: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to end (one that must refuse to start).
    pub fn exit_code(&mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the stderr thread catch up.
                std::thread::sleep(Duration::from_millis(50));
                return status.code();
            }
            assert!(Instant::now() < deadline, "rl-relay kept running");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn url(&self) -> String {
        match &self.auth {
            Some(auth) => format!("redis://{auth}@127.0.0.1:{}/", self.port),
            None => format!("redis://127.0.0.1:{}/", self.port),
        }
    }

    pub fn con(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }

    /// A raw TCP connection, reads timing out after 5 s.
    pub fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// `INFO relay` as text.
    pub fn info(&self) -> String {
        redis::cmd("INFO").arg("relay").query(&mut self.con()).unwrap()
    }

    pub fn info_field(&self, field: &str) -> u64 {
        let info = self.info();
        let value = info.lines().find_map(|l| l.strip_prefix(&format!("{field}:")));
        value.unwrap_or_else(|| panic!("INFO relay has no {field}: {info}")).trim().parse().unwrap()
    }

    /// The resident memory of the process, in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
        kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
    }

    /// CPU time the process has used (user + system).
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // Fields after the command name (which is in parentheses).
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // SAFETY: sysconf reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A reply as it came over the wire.
#[derive(Clone, Debug, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Resp>),
    Map(Vec<(Resp, Resp)>),
    Double(String),
    Bool(bool),
}

impl Resp {
    pub fn error(&self) -> &str {
        match self {
            Resp::Error(e) => e,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    pub fn ints(&self) -> Vec<i64> {
        match self {
            Resp::Array(items) => items
                .iter()
                .map(|i| match i {
                    Resp::Int(n) => *n,
                    other => panic!("expected integers, got {other:?}"),
                })
                .collect(),
            other => panic!("expected an array, got {other:?}"),
        }
    }

    pub fn text(&self) -> String {
        match self {
            Resp::Simple(s) => s.clone(),
            Resp::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("expected a string, got {other:?}"),
        }
    }
}

/// A command as RESP bytes (an array of bulk strings).
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// `line` split on spaces, as RESP bytes.
pub fn command(line: &str) -> Vec<u8> {
    let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
    encode(&args)
}

/// Sends `bytes` and reads one reply.
pub fn send(s: &mut TcpStream, bytes: &[u8]) -> Resp {
    s.write_all(bytes).unwrap();
    read(s).unwrap_or_else(|| panic!("no reply to {:?}", String::from_utf8_lossy(&bytes[..bytes.len().min(80)])))
}

/// Sends `line` as a command and reads one reply.
pub fn call(s: &mut TcpStream, line: &str) -> Resp {
    send(s, &command(line))
}

/// One reply; None if the connection closed or nothing came within the
/// read timeout.
pub fn read(s: &mut TcpStream) -> Option<Resp> {
    let line = read_line(s)?;
    let (kind, rest) = line.split_at(1);
    let n = || rest.parse::<i64>().unwrap();
    Some(match kind {
        "+" => Resp::Simple(rest.into()),
        "-" => Resp::Error(rest.into()),
        ":" => Resp::Int(n()),
        "_" => Resp::Null,
        "," => Resp::Double(rest.into()),
        "#" => Resp::Bool(rest == "t"),
        "$" | "=" if n() < 0 => Resp::Null,
        "$" | "=" => {
            let mut body = vec![0u8; n() as usize + 2];
            s.read_exact(&mut body).ok()?;
            body.truncate(body.len() - 2);
            Resp::Bulk(body)
        }
        "*" | "~" | ">" if n() < 0 => Resp::Null,
        "*" | "~" | ">" => Resp::Array((0..n()).map(|_| read(s)).collect::<Option<_>>()?),
        "%" => Resp::Map((0..n()).map(|_| Some((read(s)?, read(s)?))).collect::<Option<_>>()?),
        other => panic!("unknown reply type {other:?} in {line:?}"),
    })
}

fn read_line(s: &mut TcpStream) -> Option<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte) {
            Ok(0) => return None,
            Ok(_) => line.push(byte[0]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return None,
            Err(_) => return None,
        }
        if line.ends_with(b"\r\n") {
            line.truncate(line.len() - 2);
            return Some(String::from_utf8_lossy(&line).into_owned());
        }
    }
}

/// A reply as RESP2 bytes.
pub fn encode_reply(reply: &Resp) -> Vec<u8> {
    match reply {
        Resp::Simple(t) => format!("+{t}\r\n").into_bytes(),
        Resp::Error(t) => format!("-{t}\r\n").into_bytes(),
        Resp::Int(n) => format!(":{n}\r\n").into_bytes(),
        Resp::Null => b"$-1\r\n".to_vec(),
        Resp::Bulk(b) => encode(&[b]).split_off(4),
        Resp::Array(items) => {
            let mut out = format!("*{}\r\n", items.len()).into_bytes();
            items.iter().for_each(|i| out.extend(encode_reply(i)));
            out
        }
        other => panic!("not a RESP2 reply: {other:?}"),
    }
}

/// The module as it was before `RL.WINDOW ... TIME` (0.2.0), in front of a
/// real server: every command goes on to it, except an RL.WINDOW naming
/// TIME, which gets the error 0.2.0's parser gave (nothing counted).
pub struct BeforeTime {
    pub port: u16,
    /// RL.WINDOW calls refused for TIME.
    pub refused: Arc<std::sync::atomic::AtomicU64>,
    /// Set: the module upgraded, TIME taken from then on.
    pub upgraded: Arc<std::sync::atomic::AtomicBool>,
}

impl BeforeTime {
    pub fn start(upstream_port: u16) -> BeforeTime {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let upgraded = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (count, new) = (refused.clone(), upgraded.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let (Ok(mut client), count, new) = (client, count.clone(), new.clone()) else { return };
                std::thread::spawn(move || {
                    let mut upstream = TcpStream::connect(("127.0.0.1", upstream_port)).unwrap();
                    // One command, one reply, in order.
                    while let Some(Resp::Array(args)) = read(&mut client) {
                        let args: Vec<Vec<u8>> =
                            args.into_iter().map(|a| if let Resp::Bulk(b) = a { b } else { vec![] }).collect();
                        let named = |word: &[u8]| args.iter().any(|a| a.eq_ignore_ascii_case(word));
                        let old = !new.load(std::sync::atomic::Ordering::Relaxed);
                        let reply = if old && args[0].eq_ignore_ascii_case(b"RL.WINDOW") && named(b"TIME") {
                            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Resp::Error("ERR unknown option 'TIME' (options: COST n, SLIDING, EXACT, FIXED)".into())
                        } else {
                            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                            upstream.write_all(&encode(&args)).unwrap();
                            let Some(reply) = read(&mut upstream) else { return };
                            reply
                        };
                        if client.write_all(&encode_reply(&reply)).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        BeforeTime { port, refused, upgraded }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// Whether the relay closed `s` (end of stream or reset) within 5 s.
pub fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
    false
}

/// Waits past UTC midnight if it is less than a minute away: the day's
/// window must not end between a test's first use of it and its last check.
pub fn away_from_midnight() {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    if secs % 86_400 > 86_400 - 60 {
        std::thread::sleep(std::time::Duration::from_secs(86_400 - secs % 86_400 + 1));
    }
}

/// The relay's Redis user as docs/security.md creates it (`ACL SETUSER
/// rl-relay ...`, its password replaced by `password`), for `con`'s server:
/// on Redis 7.0, which has no `CLIENT SETINFO`, without `+client|setinfo`,
/// as the page says.
pub fn relay_acl_recipe(con: &mut redis::Connection, password: &str) -> redis::Cmd {
    acl_recipe("security.md", "rl-relay", con, password)
}

/// The `ACL SETUSER user ...` line of docs/`page`, as [`relay_acl_recipe`].
pub fn acl_recipe(page: &str, user: &str, con: &mut redis::Connection, password: &str) -> redis::Cmd {
    let text = std::fs::read_to_string(format!("{}/../docs/{page}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("ACL SETUSER {user} ")))
        .unwrap_or_else(|| panic!("docs/{page} has the ACL recipe of {user}"));
    let info: String = redis::cmd("INFO").arg("server").query(con).unwrap();
    let seven_oh = info.lines().any(|l| l.starts_with("redis_version:7.0."));
    let mut cmd = redis::Cmd::new();
    for word in line.split_whitespace().filter(|w| !(seven_oh && *w == "+client|setinfo")) {
        cmd.arg(if word == ">CHANGE-ME" { format!(">{password}") } else { word.to_owned() });
    }
    cmd
}
