//! The two conditions every figure is measured in: a bare server, and a
//! primary with AOF on and one replica attached (production: every write
//! is appended and propagated). The same for the redis-cell server, which
//! cannot share a server with the module (both define CL.THROTTLE).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testkit::Server;

#[derive(Clone, Copy, PartialEq)]
pub enum Condition {
    Bare,
    ReplicaAof,
}

impl Condition {
    pub const ALL: [Condition; 2] = [Condition::Bare, Condition::ReplicaAof];

    pub fn label(self) -> &'static str {
        match self {
            Condition::Bare => "bare",
            Condition::ReplicaAof => "replica + AOF",
        }
    }

    fn primary_args(self) -> &'static [&'static str] {
        match self {
            Condition::Bare => &["--appendonly", "no"],
            Condition::ReplicaAof => &["--appendonly", "yes", "--appendfsync", "everysec"],
        }
    }
}

/// A server with another module than ours (redis-cell).
pub type ModuleServer = testkit::PlainServer;

/// `module` loaded on a plain server, with `extra` arguments.
pub fn module_server(module: &Path, extra: &[&str]) -> ModuleServer {
    let mut args: Vec<&std::ffi::OsStr> = vec!["--loadmodule".as_ref(), module.as_os_str()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    ModuleServer::start_with(&args)
}

/// Which module a setup's servers load.
pub enum Module {
    Ours,
    Other(PathBuf),
}

enum Proc {
    Ours(Server),
    Other(ModuleServer),
}

impl Proc {
    fn start(module: &Module, extra: &[&str]) -> Proc {
        match module {
            Module::Ours => Proc::Ours(Server::start(extra)),
            Module::Other(so) => Proc::Other(module_server(so, extra)),
        }
    }

    fn port(&self) -> u16 {
        match self {
            Proc::Ours(s) => s.port,
            Proc::Other(s) => s.port,
        }
    }
}

/// A primary in one condition, with its replica when it has one.
pub struct Setup {
    primary: Proc,
    replica: Option<Proc>,
    pub condition: Condition,
}

impl Setup {
    pub fn start(module: &Module, condition: Condition) -> Setup {
        let primary = Proc::start(module, condition.primary_args());
        let replica = (condition == Condition::ReplicaAof).then(|| {
            let replica = Proc::start(module, &[]);
            let mut con = connect(replica.port());
            let _: () =
                redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary.port()).query(&mut con).expect("REPLICAOF");
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let info: String = redis::cmd("INFO").arg("replication").query(&mut con).expect("INFO");
                if info.contains("master_link_status:up") {
                    break;
                }
                assert!(Instant::now() < deadline, "the replica did not sync");
                std::thread::sleep(Duration::from_millis(50));
            }
            replica
        });
        Setup { primary, replica, condition }
    }

    pub fn port(&self) -> u16 {
        self.primary.port()
    }

    pub fn con(&self) -> redis::Connection {
        connect(self.port())
    }

    /// Waits until the replica has everything written so far, so that a
    /// run's propagation does not spill into the next one.
    pub fn settle(&self, con: &mut redis::Connection) {
        if self.replica.is_some() {
            let acked: i64 = redis::cmd("WAIT").arg(1).arg(30_000).query(con).expect("WAIT");
            assert_eq!(acked, 1, "the replica did not acknowledge within 30 s");
        }
    }
}

pub fn connect(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/")).and_then(|c| c.get_connection()).expect("connect")
}
