//! The relay's connection to Redis: rl-client's (one server, a Sentinel
//! master or a cluster, reconnecting by itself, TCP_NODELAY, one quick
//! cluster retry, following a failover), with the relay's timeout. A move
//! to another server is logged.
//!
//! The module's commands go to Redis as they are, or, on a Redis that
//! cannot load the module (`--redis-backend lua`, or `auto` finding none),
//! as calls of rl-client's Lua scripts (`Connection::send_script`):
//! the one send point, so every front's decisions are the same code on
//! either backend. A script Redis no longer holds (a restart, a failover)
//! is loaded and the call sent once more.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, RedisResult, Value};
use rl_client::internal::is_module_command;
use rl_client::{Connection, ConnectionStatus, Target, Tls};

use crate::logging::line;

/// What carries the module's commands out on Redis (`--redis-backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The redis-rl module: a Redis without it is not ready.
    Module,
    /// rl-client's Lua scripts, on any Redis (no module needed).
    Lua,
    /// The module if Redis has it, else the scripts: decided by the first
    /// probe Redis answers, then kept for the process's life.
    Auto,
}

impl Backend {
    /// `module`, `lua` or `auto` (the flag's and the variable's values).
    pub fn parse(text: &str) -> Result<Backend, String> {
        match text.to_ascii_lowercase().as_str() {
            "module" => Ok(Backend::Module),
            "lua" => Ok(Backend::Lua),
            "auto" => Ok(Backend::Auto),
            _ => Err(format!("'{text}': one of module, lua, auto")),
        }
    }
}

const UNDECIDED: u8 = 0;
const MODULE: u8 = 1;
const LUA: u8 = 2;

/// The backend in force, shared by the calls' connection and the probe's:
/// `auto` stays undecided (calls go as module commands) until the probe
/// settles it.
#[derive(Clone, Debug)]
pub struct Choice {
    asked: Backend,
    now: Arc<AtomicU8>,
}

impl Choice {
    pub fn new(asked: Backend) -> Choice {
        let now = match asked {
            Backend::Module => MODULE,
            Backend::Lua => LUA,
            Backend::Auto => UNDECIDED,
        };
        Choice { asked, now: Arc::new(AtomicU8::new(now)) }
    }

    /// What `--redis-backend` asked for.
    pub fn asked(&self) -> Backend {
        self.asked
    }

    /// The backend in force: None while `auto` has not decided.
    pub fn current(&self) -> Option<Backend> {
        match self.now.load(Ordering::Relaxed) {
            MODULE => Some(Backend::Module),
            LUA => Some(Backend::Lua),
            _ => None,
        }
    }

    /// Its name for INFO, metrics and the log: module, lua, or auto (undecided).
    pub fn name(&self) -> &'static str {
        match self.current() {
            Some(Backend::Module) => "module",
            Some(Backend::Lua) => "lua",
            _ => "auto",
        }
    }

    /// `auto`'s decision, once (later ones are ignored): logged.
    pub fn decide(&self, module: bool) {
        let to = if module { MODULE } else { LUA };
        if self.now.compare_exchange(UNDECIDED, to, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            if module {
                line("--redis-backend auto: Redis has the redis-rl module: the module's commands serve");
            } else {
                line(
                    "--redis-backend auto: Redis answers without the redis-rl module: rl-client's Lua scripts \
                     serve (docs/error-bounds.md: what they cannot promise)",
                );
            }
        }
    }
}

impl Default for Choice {
    fn default() -> Choice {
        Choice::new(Backend::Module)
    }
}

/// How long a readiness probe may take (its connection's own timeouts).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct Upstream {
    connection: Connection,
    backend: Choice,
}

impl Upstream {
    /// One server at `urls[0]` (a `redis+sentinel://` URL: the master its
    /// sentinels name), or a cluster discovered from `urls` when `cluster`
    /// is set; `tls` for `rediss://` URLs. Lazy: the relay starts while
    /// Redis is down. Call it inside a tokio runtime.
    pub fn open(urls: &[String], cluster: bool, tls: &Tls, timeout: Duration) -> rl_client::Result<Upstream> {
        let connection = Connection::open_with_tls(&target(urls, cluster)?, tls, timeout, timeout)?;
        connection.on_switch(log_switch);
        Ok(Upstream { connection, backend: Choice::default() })
    }

    /// The same connection, carrying the module's commands out on `backend`
    /// (the module unless told).
    pub fn on(self, backend: &Choice) -> Upstream {
        Upstream { backend: backend.clone(), ..self }
    }

    /// The backend in force.
    pub fn backend(&self) -> &Choice {
        &self.backend
    }

    /// The readiness probe's own connection to the same servers, with the
    /// probe's own timeouts: the calls' connection may be dropped and
    /// made again within `--timeout-ms` (three calls timed out in a row
    /// during a stall), which must not make a stall look like an outage.
    pub fn probe(urls: &[String], cluster: bool, tls: &Tls) -> rl_client::Result<Upstream> {
        let connection = Connection::open_with_tls(&target(urls, cluster)?, tls, PROBE_TIMEOUT, PROBE_TIMEOUT)?;
        Ok(Upstream { connection, backend: Choice::default() })
    }

    /// Sends `args`; in a cluster, to the primary of `key`'s slot (RL.*
    /// commands name numkeys first, which redis-rs would take for the key).
    /// A server error comes back as a value, for the gateway to see as is.
    /// On the scripts, a module command is sent as its script's call,
    /// loaded again where Redis lost it (rl-client's `send_script`, the one
    /// copy: a gateway behind the relay sends the same while the relay is
    /// down); one the scripts do not serve, CL.THROTTLE, is answered an
    /// error naming the module; anything else (PING) as it is.
    ///
    /// With `auto` still undecided (no probe answered yet), a module
    /// command goes as itself: the module's answer decides the module; an
    /// "unknown command" (it did not run) is checked with the probe's own
    /// peek (RL.PEEK, which every version of the module has: an older
    /// module may lack the command itself), and when that is unknown too
    /// the scripts are decided and the call sent again as its script's
    /// call. So no call meets a Redis without the module as a module
    /// command.
    pub async fn call(&self, args: &[Bytes], key: Option<&[u8]>) -> RedisResult<Value> {
        let module_command = args.first().is_some_and(|name| is_module_command(name));
        match self.backend.current() {
            Some(Backend::Lua) if module_command => self.connection.send_script(args, key).await,
            None if module_command => {
                let reply = self.send_as_is(args, key).await;
                if unknown_command(&reply) {
                    if !unknown_command(&self.send_as_is(&module_peek(), Some(b"rl:probe")).await) {
                        return reply;
                    }
                    self.backend.decide(false);
                    return self.connection.send_script(args, key).await;
                }
                if matches!(reply, Ok(ref v) if !matches!(v, Value::ServerError(_))) {
                    self.backend.decide(true);
                }
                reply
            }
            _ => self.send_as_is(args, key).await,
        }
    }

    /// Sends `args` as they are, whatever the backend (the probe's peek of
    /// the module).
    pub async fn send_as_is(&self, args: &[Bytes], key: Option<&[u8]>) -> RedisResult<Value> {
        let mut cmd = Cmd::new();
        for arg in args {
            cmd.arg(arg.as_ref());
        }
        self.connection.send(&cmd, key).await
    }

    /// Loads the scripts the server of `key`'s slot lacks (the probe's
    /// first step, at connect and after a restart): a call's NOSCRIPT retry
    /// is then the exception.
    pub async fn load_missing_scripts(&self, key: Option<&[u8]>) -> RedisResult<()> {
        self.connection.load_missing_scripts(key).await
    }

    /// Which server the calls go to.
    pub fn status(&self) -> ConnectionStatus {
        self.connection.status()
    }
}

/// The probe's peek of the module, of a key no limit uses (RL.PEEK: in
/// every version of the module).
pub fn module_peek() -> [Bytes; 6] {
    ["RL.PEEK", "1", "rl:probe", "1", "1", "1000"].map(|a| Bytes::from_static(a.as_bytes()))
}

/// Whether Redis answered that it does not know the command: a module
/// command meeting a Redis without the module (it did not run).
pub fn unknown_command(reply: &RedisResult<Value>) -> bool {
    let text = match reply {
        Ok(Value::ServerError(e)) => e.to_string(),
        Err(e) => e.to_string(),
        Ok(_) => return false,
    };
    text.to_ascii_lowercase().contains("unknown command")
}

/// What `urls` name: one server (or a Sentinel master), or a cluster.
fn target(urls: &[String], cluster: bool) -> rl_client::Result<Target> {
    if !cluster {
        return Target::from_url(urls.first().map_or("redis://127.0.0.1:6379/", String::as_str));
    }
    if urls.iter().any(|u| u.starts_with(rl_client::SENTINEL_SCHEME) || u.starts_with(rl_client::SENTINEL_TLS_SCHEME)) {
        return Err(rl_client::Error::invalid("a cluster is not reached through Sentinel: drop --cluster"));
    }
    Ok(Target::Cluster(urls.to_vec()))
}

fn log_switch(status: &ConnectionStatus) {
    let server = status.server.as_deref().unwrap_or("none");
    let how = if status.redirected {
        "not the configured server: it answers as a replica, and this is the primary its ROLE names"
    } else {
        "the primary now"
    };
    line(format_args!("upstream: calls go to {server}, {how} (configured: {})", status.configured));
}
