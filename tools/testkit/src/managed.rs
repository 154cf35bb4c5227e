//! A redis-server run as managed services run one (ElastiCache,
//! Memorystore, Azure Cache...): TLS only, no module (MODULE LOAD is not
//! theirs to give), `default` off and every client an ACL user, and the
//! commands they withhold renamed away. The tests run our components on it
//! as a user of exactly the rights docs/security.md lists, and read
//! `ACL LOG` (as the operator's user) for what was refused.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::{free_port, server_binary, TlsFiles};

/// What managed services withhold (renamed to nothing: unknown commands):
/// their configuration, debugging, modules, persistence and replication
/// controls, and the keyspace-wide commands.
pub const WITHHELD: &[&str] = &[
    "CONFIG",
    "DEBUG",
    "MODULE",
    "KEYS",
    "SAVE",
    "BGSAVE",
    "BGREWRITEAOF",
    "SHUTDOWN",
    "REPLICAOF",
    "SLAVEOF",
    "FLUSHALL",
    "FLUSHDB",
    "MIGRATE",
];

/// The operator's user (the service's admin): what the tests inspect with.
pub const OPERATOR: (&str, &str) = ("operator", "operator-secret");

/// The `ACL SETUSER user ...` line of docs/security.md for `user` (the one
/// source the docs and the tests share), as [`Managed::start`] takes it:
/// without `ACL SETUSER`, its `>CHANGE-ME` set to `password`.
pub fn documented_user(user: &str, password: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/security.md");
    let docs = std::fs::read_to_string(path).expect("docs/security.md");
    let line = docs
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("ACL SETUSER "))
        .find(|l| l.starts_with(&format!("{user} ")))
        .unwrap_or_else(|| panic!("no ACL SETUSER {user} line in docs/security.md"));
    line.replace(">CHANGE-ME", &format!(">{password}"))
}

/// A managed-like redis-server on a free loopback port, in its own temp
/// dir (its certificates there), killed when dropped.
pub struct Managed {
    child: Child,
    pub port: u16,
    dir: TempDir,
    files: TlsFiles,
}

impl Managed {
    /// Starts one with `users` as ACL rules (`"rl-gateway on >pw ~rl:* ..."`,
    /// as `ACL SETUSER` takes them), besides the operator's. On Redis 7.0,
    /// which has no `CLIENT SETINFO` and refuses a rule naming it,
    /// `+client|setinfo` is left out (as docs/security.md says to).
    pub fn start(users: &[&str]) -> Managed {
        let seven_oh = server_version().starts_with("7.0.");
        let users: Vec<String> =
            users.iter().map(|u| if seven_oh { u.replace(" +client|setinfo", "") } else { u.to_string() }).collect();
        for _ in 0..5 {
            let dir = tempfile::Builder::new().prefix("rl-managed-").tempdir().expect("temp dir");
            let files = TlsFiles::create(dir.path());
            let port = free_port();
            let config = dir.path().join("redis.conf");
            std::fs::write(&config, config_text(dir.path(), port, &files, &users)).expect("write redis.conf");
            let child = Command::new(server_binary())
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let mut s = Managed { child, port, dir, files };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline && matches!(s.child.try_wait(), Ok(None)) {
                if let Ok(mut c) = s.try_operator() {
                    if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                        return s;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!("managed server did not start; log:\n{}", s.log());
        }
        panic!("could not start a managed-like redis-server after 5 attempts");
    }

    /// `rediss://USER:PASSWORD@127.0.0.1:PORT/`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("rediss://{user}:{password}@127.0.0.1:{}/", self.port)
    }

    /// Its CA and certificates (clients show none: `tls-auth-clients no`,
    /// as managed services ask for passwords, not client certificates).
    pub fn tls(&self) -> &TlsFiles {
        &self.files
    }

    fn try_operator(&self) -> redis::RedisResult<redis::Connection> {
        self.files.client(&self.url_as(OPERATOR.0, OPERATOR.1))?.get_connection()
    }

    /// A connection as the operator's user.
    pub fn operator(&self) -> redis::Connection {
        self.try_operator().expect("connect as the operator")
    }

    /// What `ACL LOG` recorded, one line each: the user, the reason and
    /// the command or key refused.
    pub fn acl_log(&self) -> Vec<String> {
        type Entry = std::collections::HashMap<String, redis::Value>;
        let entries: Vec<Entry> = redis::cmd("ACL").arg("LOG").query(&mut self.operator()).expect("ACL LOG");
        let text = |entry: &Entry, name: &str| match entry.get(name) {
            Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            Some(other) => format!("{other:?}"),
            None => String::new(),
        };
        entries
            .iter()
            .map(|e| {
                format!("{} {} {} ({})", text(e, "username"), text(e, "reason"), text(e, "object"), text(e, "context"))
            })
            .collect()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server binary's version (`v=7.0.15` of `redis-server --version`).
fn server_version() -> String {
    let out = Command::new(server_binary()).arg("--version").output().expect("redis-server --version");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().find_map(|w| w.strip_prefix("v=")).unwrap_or_default().to_string()
}

/// redis.conf: TLS only on `port`, the users, the withheld commands gone.
fn config_text(dir: &Path, port: u16, files: &TlsFiles, users: &[String]) -> String {
    let path = |p: &Path| format!("\"{}\"", p.display());
    let mut text = format!(
        "port 0\ntls-port {port}\nbind 127.0.0.1\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
         tls-auth-clients no\ndir {}\nlogfile {}\nsave \"\"\n",
        path(&files.server_cert),
        path(&files.server_key),
        path(&files.ca),
        path(dir),
        path(&dir.join("server.log")),
    );
    text.push_str("user default off\n");
    // The operator: everything the service lets its admin run (the
    // withheld commands are gone for every user).
    text.push_str(&format!("user {} on >{} ~* &* +@all\n", OPERATOR.0, OPERATOR.1));
    for user in users {
        text.push_str(&format!("user {user}\n"));
    }
    for command in WITHHELD {
        text.push_str(&format!("rename-command {command} \"\"\n"));
    }
    text
}
