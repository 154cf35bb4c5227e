//! Redis Sentinel for failover tests: a primary with the module, its
//! replicas, and three sentinels watching it (`down-after-milliseconds
//! 1000`), all on free loopback ports in temp dirs, killed when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::{free_port, server_binary, Server, Tls, TlsFiles};

/// The name the sentinels monitor the primary under.
pub const MASTER: &str = "mymaster";

/// One redis-server in sentinel mode.
pub struct SentinelNode {
    child: Option<Child>,
    pub port: u16,
    dir: TempDir,
    /// TLS only, with the set's files (and to the servers too).
    tls: Option<TlsFiles>,
}

impl SentinelNode {
    /// A sentinel watching the primary on `primary_port` as [`MASTER`]
    /// (over TLS with `tls`, which it speaks only then).
    fn start(primary_port: u16, tls: Option<(&TlsFiles, Tls)>) -> SentinelNode {
        for _ in 0..5 {
            let dir = tempfile::Builder::new().prefix("rl-sentinel-").tempdir().expect("temp dir");
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            let listen = match tls {
                None => format!("port {port}\n"),
                Some((files, mode)) => {
                    let args = files.server_args(port, mode);
                    // `--name value` pairs as sentinel.conf lines; the cluster's
                    // option is no sentinel's.
                    let lines: Vec<String> = args
                        .chunks(2)
                        .filter(|kv| kv[0] != "--tls-cluster")
                        .map(|kv| format!("{} {}\n", &kv[0][2..], kv[1]))
                        .collect();
                    lines.concat()
                }
            };
            let text = format!(
                "{listen}bind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 10000\n\
                 sentinel parallel-syncs {MASTER} 1\n",
                dir = dir.path().display()
            );
            std::fs::write(&conf, text).expect("write sentinel.conf");
            let child = Command::new(server_binary())
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server --sentinel");
            let mut node = SentinelNode { child: Some(child), port, dir, tls: tls.map(|(f, _)| f.clone()) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Some(Ok(Some(_))) = node.child.as_mut().map(|c| c.try_wait()) {
                    break; // exited: the port was taken, try another
                }
                if let Ok(mut c) = node.try_con() {
                    if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                        return node;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!("sentinel on port {port} did not start; log:\n{}", node.log());
        }
        panic!("could not start a sentinel after 5 attempts");
    }

    fn try_con(&self) -> redis::RedisResult<redis::Connection> {
        match &self.tls {
            Some(files) => files.client(&self.url())?.get_connection(),
            None => redis::Client::open(self.url())?.get_connection(),
        }
    }

    /// `redis://127.0.0.1:PORT/`, or `rediss://` over TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// `127.0.0.1:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn con(&self) -> redis::Connection {
        self.try_con().expect("connect to the sentinel")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }

    /// The port of the primary this sentinel names now.
    pub fn primary_port(&self) -> Option<u16> {
        let addr: Option<(String, u16)> =
            redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(MASTER).query(&mut self.try_con().ok()?).ok()?;
        addr.map(|(_, port)| port)
    }

    /// Kills the sentinel at once.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SentinelNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A primary (`servers[0]` at the start), its replicas and three sentinels.
pub struct SentinelSet {
    pub servers: Vec<Server>,
    pub sentinels: Vec<SentinelNode>,
}

impl SentinelSet {
    /// A primary with `replicas` replicas (at least one: a failover needs
    /// one) and three sentinels that know every replica and each other.
    pub fn start(replicas: usize) -> SentinelSet {
        Self::start_with(replicas, None)
    }

    /// [`SentinelSet::start`], every server and sentinel speaking TLS only
    /// with one CA (the primary's [`Server::tls`] files).
    pub fn start_tls(replicas: usize, tls: Tls) -> SentinelSet {
        Self::start_with(replicas, Some(tls))
    }

    fn start_with(replicas: usize, tls: Option<Tls>) -> SentinelSet {
        assert!(replicas >= 1, "a failover needs a replica");
        let primary = match tls {
            Some(mode) => Server::start_tls(mode, &[]),
            None => Server::start(&[]),
        };
        let mut servers: Vec<Server> = (0..replicas).map(|_| primary.replica(&[])).collect();
        servers.insert(0, primary);
        let files = servers[0].tls().cloned();
        let sentinels: Vec<SentinelNode> =
            (0..3).map(|_| SentinelNode::start(servers[0].port, files.as_ref().zip(tls))).collect();
        let set = SentinelSet { servers, sentinels };
        set.wait_until_known(replicas);
        set
    }

    /// Until every sentinel lists the replicas, healthy, and the other two
    /// sentinels: before that a failover is refused (NOGOODSLAVE) or
    /// cannot reach a quorum.
    fn wait_until_known(&self, replicas: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = self.sentinels.iter().all(|s| {
                let Ok(mut con) = s.try_con() else { return false };
                let known: Vec<std::collections::HashMap<String, String>> =
                    redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER).query(&mut con).unwrap_or_default();
                let healthy = known
                    .iter()
                    .filter(|r| {
                        r.get("flags").is_some_and(|f| f == "slave")
                            && r.get("master-link-status").is_some_and(|l| l == "ok")
                    })
                    .count();
                let others: Vec<std::collections::HashMap<String, String>> =
                    redis::cmd("SENTINEL").arg("SENTINELS").arg(MASTER).query(&mut con).unwrap_or_default();
                healthy == replicas && others.len() == 2
            });
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not learn the set; log:\n{}",
                self.sentinels[0].log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis://` (`rediss://`) URLs of the sentinels.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(SentinelNode::url).collect()
    }

    /// `127.0.0.1:port` of each sentinel.
    pub fn addresses(&self) -> Vec<String> {
        self.sentinels.iter().map(SentinelNode::address).collect()
    }

    /// The server the sentinels name as the primary now.
    pub fn primary(&self) -> &Server {
        let port = self.sentinels.iter().find_map(SentinelNode::primary_port).expect("a sentinel names a primary");
        self.servers.iter().find(|s| s.port == port).expect("the named primary is one of the set")
    }

    /// `SENTINEL FAILOVER`, then waits until a sentinel names another
    /// server and that server answers as a primary: the new primary.
    pub fn failover(&self) -> &Server {
        let old = self.primary().port;
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER)
            .query(&mut self.sentinels[0].con())
            .expect("SENTINEL FAILOVER");
        self.wait_for_primary_other_than(old)
    }

    /// Until the sentinels name a primary other than `old` that answers
    /// `ROLE` as a master.
    pub fn wait_for_primary_other_than(&self, old: u16) -> &Server {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let named = self.sentinels.iter().find_map(SentinelNode::primary_port).filter(|p| *p != old);
            if let Some(server) = named.and_then(|port| self.servers.iter().find(|s| s.port == port)) {
                if role(server) == "master" {
                    return server;
                }
            }
            assert!(Instant::now() < deadline, "no failover; log:\n{}", self.sentinels[0].log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The sentinels' logs, for a failing test's message.
    pub fn logs(&self) -> String {
        self.sentinels.iter().map(|s| format!("== sentinel {}\n{}", s.port, s.log())).collect()
    }
}

/// The first field of `ROLE`: `master`, `slave` (or empty if it cannot answer).
pub fn role(server: &Server) -> String {
    let Ok(mut con) = server.try_con() else { return String::new() };
    let role: redis::RedisResult<Vec<redis::Value>> = redis::cmd("ROLE").query(&mut con);
    match role.ok().and_then(|r| r.into_iter().next()) {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
        Some(redis::Value::SimpleString(s)) => s,
        _ => String::new(),
    }
}
