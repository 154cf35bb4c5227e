//! Real servers for the integration tests: each starts on a free loopback
//! port, in its own temp dir, with the built module loaded, and is killed
//! when dropped. No fixed ports, no leftover processes.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

pub mod managed;
pub mod prometheus;
mod sentinel;
pub mod tls;
pub use sentinel::{role, SentinelNode, SentinelSet, MASTER};
pub use tls::{Tls, TlsFiles};

/// CPU time the calling thread has run (`CLOCK_THREAD_CPUTIME_ID`): what the
/// benchmarks report, since on a shared machine wall time also counts the
/// moments other processes hold the core.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0))
}

/// The module under test: `RL_MODULE`, or the release build `make test` makes.
pub fn module_path() -> PathBuf {
    let path = std::env::var_os("RL_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/libredis_rl.so"));
    assert!(
        path.exists(),
        "module not found at {}: run `make test` (or `cargo build --release` first)",
        path.display()
    );
    path
}

/// The server binary: `RL_SERVER`, or redis-server from PATH.
pub fn server_binary() -> PathBuf {
    std::env::var_os("RL_SERVER").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// rl-gateway's example gateway (`gateway/examples/gateway.rs`), built if
/// this test run did not build it: in the test binaries' target dir.
pub fn example_gateway() -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let binary = deps.parent().unwrap().join("examples").join("gateway");
    if !binary.exists() {
        let built = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "rl-gateway", "--example", "gateway"])
            .status();
        assert!(built.unwrap().success(), "cargo build --example gateway");
    }
    binary
}

/// A port that is free now, and whose cluster bus port (+10000) is free too.
pub fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = l.local_addr().unwrap().port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Whether the server `c` reached is the process `pid`: a port picked free
/// can be taken by another test's server before ours binds it (ours then
/// exits), and that one must not pass for ours.
fn answers_as(c: &mut redis::Connection, pid: u32) -> bool {
    let info: String = redis::cmd("INFO").arg("server").query(c).unwrap_or_default();
    info.lines().any(|l| l.strip_prefix("process_id:").is_some_and(|id| id.trim() == pid.to_string()))
}

pub struct Server {
    child: Option<Child>,
    pub port: u16,
    dir: TempDir,
    binary: PathBuf,
    args: Vec<String>,
    /// TLS only, with these files (in `dir`): see [`Server::start_tls`].
    tls: Option<(TlsFiles, Tls)>,
}

impl Server {
    /// redis-server with the module and the given extra config arguments
    /// (`["--appendonly", "yes"]`).
    pub fn start(extra: &[&str]) -> Server {
        Self::start_binary(&server_binary(), extra)
    }

    pub fn start_binary(binary: &Path, extra: &[&str]) -> Server {
        Self::start_prepared(binary, extra, None, |_| {})
    }

    /// Like [`Server::start`], speaking TLS only (`--port 0 --tls-port P`),
    /// with a CA and certificates made now in its dir ([`Server::tls`]);
    /// [`Tls::Mutual`] requires a client certificate too. `url()` is then
    /// `rediss://`, and the server's own helpers (`con`, `info`, ...)
    /// connect with the CA and the client certificate.
    pub fn start_tls(tls: Tls, extra: &[&str]) -> Server {
        Self::start_prepared(&server_binary(), extra, Some(tls), |_| {})
    }

    /// A server whose dir holds `rdb` as its dump.rdb at startup.
    pub fn start_from_rdb(rdb: &Path, extra: &[&str]) -> Server {
        Self::start_prepared(&server_binary(), extra, None, |dir| {
            std::fs::copy(rdb, dir.join("dump.rdb")).expect("copy the RDB file");
        })
    }

    fn start_prepared(binary: &Path, extra: &[&str], tls: Option<Tls>, prepare: impl FnOnce(&Path)) -> Server {
        let dir = tempfile::Builder::new().prefix("rl-test-").tempdir().expect("temp dir");
        prepare(dir.path());
        let tls = tls.map(|mode| (TlsFiles::create(dir.path()), mode));
        let mut s = Server {
            child: None,
            port: 0,
            dir,
            binary: binary.to_path_buf(),
            args: extra.iter().map(|s| s.to_string()).collect(),
            tls,
        };
        s.spawn_on_free_port();
        s
    }

    /// A TLS server with another's CA and certificates (a cluster's
    /// nodes, a primary's replicas, which must trust each other).
    fn start_sharing_tls(binary: &Path, extra: &[&str], files: &TlsFiles, mode: Tls) -> Server {
        let mut s = Server {
            child: None,
            port: 0,
            dir: tempfile::Builder::new().prefix("rl-test-").tempdir().expect("temp dir"),
            binary: binary.to_path_buf(),
            args: extra.iter().map(|s| s.to_string()).collect(),
            tls: Some((files.clone(), mode)),
        };
        s.spawn_on_free_port();
        s
    }

    fn spawn_on_free_port(&mut self) {
        for _ in 0..5 {
            self.port = free_port();
            if self.spawn() {
                return;
            }
        }
        panic!("could not start {} after 5 attempts", self.binary.display());
    }

    /// Starts the process on `self.port`; false if it exited (port taken).
    fn spawn(&mut self) -> bool {
        let module = module_path();
        let log = self.dir.path().join("server.log");
        let mut cmd = Command::new(&self.binary);
        match &self.tls {
            Some((files, mode)) => cmd.args(files.server_args(self.port, *mode)),
            None => cmd.arg("--port").arg(self.port.to_string()),
        };
        cmd.args(["--bind", "127.0.0.1", "--dir"])
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(["--save", "", "--enable-debug-command", "yes", "--loadmodule"])
            .arg(&module)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", self.binary.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                eprintln!("server exited with {status}; log:\n{}", self.log());
                self.child = None;
                return false;
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                let pid = self.child.as_ref().unwrap().id();
                if self.try_con().is_ok_and(|mut c| answers_as(&mut c, pid)) {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("server on port {} did not answer; log:\n{}", self.port, self.log());
    }

    pub(crate) fn try_con(&self) -> redis::RedisResult<redis::Connection> {
        self.client(&self.url())?.get_connection()
    }

    fn client(&self, url: &str) -> redis::RedisResult<redis::Client> {
        match &self.tls {
            Some((files, _)) => files.client(url),
            None => redis::Client::open(url),
        }
    }

    /// `redis://127.0.0.1:PORT/`, or `rediss://` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// A TLS server's CA and certificates; `None` for a plain one.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref().map(|(files, _)| files)
    }

    /// A new RESP2 connection.
    pub fn con(&self) -> redis::Connection {
        self.try_con().expect("connect")
    }

    /// A new RESP3 connection.
    pub fn con_resp3(&self) -> redis::Connection {
        self.client(&format!("{}?protocol=resp3", self.url()))
            .and_then(|c| c.get_connection())
            .expect("connect with RESP3")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// One field of `INFO section`, as text.
    pub fn info(&self, section: &str, field: &str) -> String {
        let text: String = redis::cmd("INFO").arg(section).query(&mut self.con()).expect("INFO");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
            .trim()
            .to_string()
    }

    /// Stops the server (SHUTDOWN with the given mode: "SAVE" or "NOSAVE").
    pub fn shutdown(&mut self, mode: &str) {
        let _ = redis::cmd("SHUTDOWN").arg(mode).query::<()>(&mut self.con());
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "server did not stop");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Kills the process at once, like a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A replica of `self` (with `extra` arguments), once its link is up;
    /// over TLS, with `self`'s CA and certificates, if `self` speaks TLS.
    pub fn replica(&self, extra: &[&str]) -> Server {
        let port = self.port.to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", &port];
        args.extend_from_slice(extra);
        let r = match &self.tls {
            Some((files, mode)) => Server::start_sharing_tls(&server_binary(), &args, files, *mode),
            None => Server::start(&args),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while r.info("replication", "master_link_status") != "up" {
            assert!(Instant::now() < deadline, "replica did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    /// Starts a server that must refuse to start (a module that will not
    /// load, a file it cannot read) and returns its log once it has exited.
    pub fn refused(extra: &[&str]) -> String {
        let mut s = Server {
            child: None,
            port: free_port(),
            dir: tempfile::Builder::new().prefix("rl-test-").tempdir().expect("temp dir"),
            binary: server_binary(),
            args: extra.iter().map(|s| s.to_string()).collect(),
            tls: None,
        };
        assert!(!s.spawn(), "the server started with {extra:?}");
        s.log()
    }

    /// Starts the stopped server again on the same port and dir (its RDB
    /// and AOF files), with the same arguments.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the server first");
        assert!(self.spawn(), "restart failed; log:\n{}", self.log());
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `RL.TAKE` (or any numkeys command) as a six-integer vector.
pub fn call(con: &mut redis::Connection, cmd: &str, args: &str) -> Vec<i64> {
    let mut c = redis::cmd(cmd);
    for a in args.split_whitespace() {
        c.arg(a);
    }
    c.query(con).unwrap_or_else(|e| panic!("{cmd} {args}: {e}"))
}

/// The error text of a call that must fail.
pub fn call_err(con: &mut redis::Connection, cmd: &str, args: &[&[u8]]) -> String {
    let mut c = redis::cmd(cmd);
    for a in args {
        c.arg(*a);
    }
    match c.query::<redis::Value>(con) {
        Ok(v) => panic!("{cmd} should have failed, got {v:?}"),
        Err(e) => server_error(&e),
    }
}

/// The error line as the server sent it ("ERR ...", "WRONGTYPE ...").
pub fn server_error(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

/// A Redis Cluster of `n` masters on loopback, each with the module.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start(n: usize) -> Cluster {
        Self::start_binary(&server_binary(), n)
    }

    pub fn start_binary(binary: &Path, n: usize) -> Cluster {
        Self::start_with(binary, n, None)
    }

    /// `n` masters speaking TLS only, the cluster bus too (`tls-cluster
    /// yes`), each with its own CA and certificates made by the test:
    /// clients of the cluster take [`Cluster::tls`] (the first node's
    /// files), whose CA is the one every node's certificate is signed by.
    pub fn start_tls(n: usize, tls: Tls) -> Cluster {
        Self::start_with(&server_binary(), n, Some(tls))
    }

    fn start_with(binary: &Path, n: usize, tls: Option<Tls>) -> Cluster {
        let args =
            ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"];
        let nodes: Vec<Server> = match tls {
            None => (0..n).map(|_| Server::start_binary(binary, &args)).collect(),
            Some(mode) => {
                // One CA for the cluster: the nodes' buses and clients trust it.
                let first = Server::start_prepared(binary, &args, Some(mode), |_| {});
                let files = first.tls().expect("TLS files").clone();
                let mut nodes = vec![first];
                nodes.extend((1..n).map(|_| Server::start_sharing_tls(binary, &args, &files, mode)));
                nodes
            }
        };
        let mut create = Command::new("redis-cli");
        if let Some(files) = nodes[0].tls() {
            create.args(files.cli_args());
        }
        create.args(["--cluster", "create"]);
        for s in &nodes {
            create.arg(format!("127.0.0.1:{}", s.port));
        }
        let mut child = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run redis-cli --cluster create");
        // redis-cli waits for the nodes to join without a limit of its own:
        // a cluster that never joins fails the test here instead of hanging it.
        let deadline = Instant::now() + Duration::from_secs(90);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for redis-cli --cluster create") {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let out = child.wait_with_output().expect("read redis-cli --cluster create's output");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        match status {
            Some(status) => assert!(status.success(), "cluster create failed: {said}"),
            None => panic!("cluster create did not finish in 90 s (the nodes never joined): {said}"),
        }
        let c = Cluster { nodes };
        c.wait_ok();
        c
    }

    /// Waits until every node sees every other and all slots are served.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let n = self.nodes.len().to_string();
        loop {
            let ok = self.nodes.iter().all(|s| {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut s.con()).unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && info.contains(&format!("cluster_known_nodes:{n}\r"))
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A TLS cluster's CA and client certificate (shared by its nodes).
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.nodes[0].tls()
    }

    /// `redis://` (`rediss://`) URLs of every node, for cluster clients.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// The node that serves `key`'s slot.
    pub fn node_for(&self, key: &str) -> &Server {
        let mut con = self.nodes[0].con();
        let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut con).unwrap();
        let slots: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).unwrap();
        let redis::Value::Array(ranges) = slots else { panic!("CLUSTER SLOTS: {slots:?}") };
        for r in ranges {
            let redis::Value::Array(r) = r else { continue };
            let (Some(redis::Value::Int(lo)), Some(redis::Value::Int(hi)), Some(redis::Value::Array(master))) =
                (r.first(), r.get(1), r.get(2))
            else {
                continue;
            };
            if (*lo..=*hi).contains(&slot) {
                let Some(redis::Value::Int(port)) = master.get(1) else { continue };
                return self.nodes.iter().find(|s| i64::from(s.port) == *port).expect("node of slot");
            }
        }
        panic!("no node serves slot {slot}");
    }
}

/// A `DUMP` payload with its 8-byte CRC64 footer recomputed after
/// tampering, so that the server reads what was changed.
pub fn reseal(mut payload: Vec<u8>) -> Vec<u8> {
    let body = payload.len() - 8;
    let crc = crc::Crc::<u64>::new(&crc::CRC_64_REDIS).checksum(&payload[..body]);
    payload[body..].copy_from_slice(&crc.to_le_bytes());
    payload
}

/// The module's state blob in a key, read from `DUMP` (kind, version,
/// payload, as `rl_core::codec` decodes it): for tests that check a state
/// exactly.
pub fn module_blob(con: &mut redis::Connection, key: &str) -> Vec<u8> {
    let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query(con).expect("DUMP");
    assert!(!dump.is_empty(), "{key} does not exist");
    // A module value in RDB: type 7 (module, v2), the module id, then
    // opcode 5 (string buffer) and the length-prefixed blob.
    let mut at = 0;
    let mut byte = || {
        let b = dump[at];
        at += 1;
        b
    };
    assert_eq!(byte(), 7, "not a module value");
    let len = |byte: &mut dyn FnMut() -> u8| -> u64 {
        let first = byte();
        match first >> 6 {
            0 => (first & 0x3f) as u64,
            1 => ((first & 0x3f) as u64) << 8 | byte() as u64,
            _ if first == 0x80 => (0..4).fold(0, |v, _| v << 8 | byte() as u64),
            _ if first == 0x81 => (0..8).fold(0, |v, _| v << 8 | byte() as u64),
            _ => panic!("unexpected RDB length byte {first:#x}"),
        }
    };
    let _module_id = len(&mut byte);
    assert_eq!(len(&mut byte), 5, "not a string buffer");
    let n = len(&mut byte) as usize;
    dump[at..at + n].to_vec()
}

/// `key`'s DUMP payload with its state blob replaced by `blob` and the
/// footer resealed: a crafted payload RESTORE reads (both blobs under 64
/// bytes, so their length is one byte).
pub fn dump_with_blob(con: &mut redis::Connection, key: &str, blob: &[u8]) -> Vec<u8> {
    let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query(con).expect("DUMP");
    let old = module_blob(con, key);
    let at = dump.windows(old.len()).position(|w| w == old).expect("the blob in its DUMP");
    assert!(dump[at - 1] as usize == old.len() && blob.len() < 64, "blobs of 64 bytes or more");
    reseal([&dump[..at - 1], &[blob.len() as u8], blob, &dump[at + old.len()..]].concat())
}

/// A redis-server without this module, as a managed Redis service offers
/// one (they refuse MODULE LOAD): for the client's Lua backend; or with
/// another module (`start_with`), as the bench runs redis-cell. On a free
/// loopback port, in its own temp dir, killed when dropped.
pub struct PlainServer {
    child: Child,
    pub port: u16,
    _dir: TempDir,
}

impl PlainServer {
    pub fn start() -> PlainServer {
        Self::start_with(&[])
    }

    /// With extra arguments (`--loadmodule path ...`).
    pub fn start_with(extra: &[&std::ffi::OsStr]) -> PlainServer {
        for _ in 0..5 {
            let dir = tempfile::Builder::new().prefix("rl-plain-").tempdir().expect("temp dir");
            let port = free_port();
            let child = Command::new(server_binary())
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
                .arg("--dir")
                .arg(dir.path())
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let mut s = PlainServer { child, port, _dir: dir };
            let deadline = Instant::now() + Duration::from_secs(20);
            // Until it answers; if it exited (port taken), drop it and retry.
            while Instant::now() < deadline && matches!(s.child.try_wait(), Ok(None)) {
                let answered = redis::Client::open(s.url()).and_then(|c| c.get_connection());
                if answered.is_ok_and(|mut c| answers_as(&mut c, s.child.id())) {
                    return s;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("could not start redis-server with {extra:?} after 5 attempts");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn con(&self) -> redis::Connection {
        redis::Client::open(self.url()).and_then(|c| c.get_connection()).expect("connect")
    }
}

impl Drop for PlainServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's clock, in ms since the Unix epoch (TIME).
pub fn server_ms(con: &mut redis::Connection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(con).expect("TIME");
    s * 1000 + us / 1000
}

/// A key's state as replicas and restarts must keep it: its DEBUG
/// DIGEST-VALUE and its absolute expiry (PEXPIRETIME: -1 none, -2 no key).
pub fn state(con: &mut redis::Connection, key: &str) -> (Vec<String>, i64) {
    let digest: Vec<String> = redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(con).expect("DIGEST-VALUE");
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(con).expect("PEXPIRETIME");
    (digest, at)
}
