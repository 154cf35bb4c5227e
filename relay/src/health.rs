//! Readiness, apart from liveness: the relay is ready while Redis answers
//! its probe (a PING every second, to every primary of a cluster, then an
//! `RL.PEEK` that a Redis without the module answers "unknown command": not
//! ready then, said in the log
//! and `rl_relay_module_missing`; on the Lua scripts, `--redis-backend
//! lua`, a script's call that writes nothing instead, the scripts loaded
//! first where Redis lacks them; with `auto`, the first answer decides), on a
//! connection of the probe's own, within the probe's own second: a stall
//! shorter than that (a fork, a slow command, a busy host) is not an
//! outage, however short the relay's `--timeout-ms` for its calls. A relay
//! that is alive but not ready still answers PING and serves what it holds;
//! an orchestrator or load balancer takes it out of rotation by `/ready`
//! (and `rl_relay_ready`), never by `/live`. Upstream failures are logged,
//! at most one line per ten seconds with the count of the others.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use bytes::Bytes;
use redis::Value;

use crate::logging::{line, Throttled};
use crate::upstream::{module_peek, unknown_command, Backend, Upstream, PROBE_TIMEOUT};

/// How often Redis is probed (a probe may take [`PROBE_TIMEOUT`]).
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

const UNKNOWN: u8 = 0;
const READY: u8 = 1;
const NOT_READY: u8 = 2;
const NO_MODULE: u8 = 3;
const NO_SCRIPTS: u8 = 4;

/// Why a probe found Redis unable to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unready {
    /// No answer, or an error to the PING.
    Unreachable(String),
    /// Redis answers, without the module (or one too old for the relay).
    NoModule(String),
    /// Redis answers, and refuses the Lua scripts (`--redis-backend lua`:
    /// scripting disabled, an ACL without EVALSHA).
    NoScripts(String),
}

/// One probe on `probe`'s connection: a PING, then a command of the
/// module's that writes nothing (`RL.PEEK` of a key no limit uses; not a
/// window command, whose calls the RLS front counts against Redis's),
/// both within [`PROBE_TIMEOUT`]. Only "unknown command" means the module
/// is missing: another refusal (an ACL without `+rl.peek`) says
/// nothing of it.
pub async fn probe(probe: &Upstream) -> Result<(), Unready> {
    let ping = [Bytes::from_static(b"PING")];
    let both = async {
        match probe.call(&ping, None).await {
            Ok(Value::ServerError(e)) => return Err(Unready::Unreachable(e.to_string())),
            Ok(_) => {}
            Err(e) => return Err(Unready::Unreachable(e.to_string())),
        }
        let backend = probe.backend();
        if backend.current() == Some(Backend::Lua) {
            return scripts(probe).await;
        }
        let module = module(probe).await;
        if backend.current().is_none() {
            match module {
                Ok(()) => backend.decide(true),
                Err(Unready::NoModule(_)) => {
                    backend.decide(false);
                    return scripts(probe).await;
                }
                Err(_) => {}
            }
        }
        module
    };
    match tokio::time::timeout(PROBE_TIMEOUT, both).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Unready::Unreachable(format!("no answer in {PROBE_TIMEOUT:?}"))),
    }
}

/// On the scripts: every script loaded where Redis lacks one (at connect,
/// after a restart or a failover), then the bucket script's peek. An error
/// answer means Redis refuses scripts.
async fn scripts(probe: &Upstream) -> Result<(), Unready> {
    let key: Option<&[u8]> = Some(b"rl:probe");
    if let Err(e) = probe.load_missing_scripts(key).await {
        return Err(refused_scripts(e.to_string(), e.code()));
    }
    match probe.call(&module_peek(), key).await {
        Ok(Value::ServerError(e)) => Err(refused_scripts(e.to_string(), Some(e.code()))),
        Ok(_) => Ok(()),
        Err(e) => Err(refused_scripts(e.to_string(), e.code())),
    }
}

/// A script call's failure: Redis refused it (a server error's code), or
/// did not answer.
fn refused_scripts(e: String, code: Option<&str>) -> Unready {
    match code {
        Some(_) => Unready::NoScripts(e),
        None => Unready::Unreachable(e),
    }
}

/// With the module: its peek.
async fn module(probe: &Upstream) -> Result<(), Unready> {
    // As is: with `auto` undecided, `call` would decide on this answer
    // itself, and the probe decides here (and checks the scripts then).
    let reply = probe.send_as_is(&module_peek(), Some(b"rl:probe")).await;
    let missing = unknown_command(&reply);
    match reply {
        Ok(Value::ServerError(e)) if missing => Err(Unready::NoModule(e.to_string())),
        Err(e) if missing => Err(Unready::NoModule(e.to_string())),
        Err(e) => Err(Unready::Unreachable(e.to_string())),
        Ok(_) => Ok(()),
    }
}

#[derive(Debug)]
pub struct Health {
    state: AtomicU8,
    failures: Throttled,
}

impl Default for Health {
    fn default() -> Health {
        Health { state: AtomicU8::new(UNKNOWN), failures: Throttled::new(Duration::from_secs(10)) }
    }
}

impl Health {
    /// Whether the last probe was answered (false before the first).
    pub fn ready(&self) -> bool {
        self.state.load(Ordering::Relaxed) == READY
    }

    /// Whether the last probe failed (false before the first): a front
    /// that must answer at once decides without Redis meanwhile (Redis
    /// without the module cannot decide either).
    pub fn unreachable(&self) -> bool {
        matches!(self.state.load(Ordering::Relaxed), NOT_READY | NO_MODULE | NO_SCRIPTS)
    }

    /// Whether the last probe found Redis without the module.
    pub fn module_missing(&self) -> bool {
        self.state.load(Ordering::Relaxed) == NO_MODULE
    }

    /// Why the relay is not ready, for `/ready`.
    pub fn why_not_ready(&self) -> &'static str {
        match self.state.load(Ordering::Relaxed) {
            NO_MODULE => "Redis answers without the redis-rl module",
            NO_SCRIPTS => "Redis refuses the Lua scripts (--redis-backend lua)",
            READY => "",
            _ => "Redis does not answer",
        }
    }

    /// A probe's outcome on `backend` (module or lua); a change is logged.
    pub fn probed(&self, outcome: Result<(), Unready>, backend: &str) {
        let new = match &outcome {
            Ok(()) => READY,
            Err(Unready::Unreachable(_)) => NOT_READY,
            Err(Unready::NoModule(_)) => NO_MODULE,
            Err(Unready::NoScripts(_)) => NO_SCRIPTS,
        };
        if self.state.swap(new, Ordering::Relaxed) != new {
            match outcome {
                Ok(()) => line(format_args!("Redis is reachable, on the {backend} backend: ready")),
                Err(Unready::Unreachable(e)) => line(format_args!("Redis is unreachable: not ready ({e})")),
                Err(Unready::NoModule(e)) => line(format_args!(
                    "Redis answers without the redis-rl module: not ready \
                     ({e}); load it (loadmodule in redis.conf, or MODULE LOAD), or run the relay on the Lua \
                     scripts (--redis-backend lua)"
                )),
                Err(Unready::NoScripts(e)) => line(format_args!(
                    "Redis refuses the Lua scripts: not ready ({e}); the relay's ACL user needs EVALSHA and \
                     SCRIPT LOAD and the commands the scripts call (docs/relay.md)"
                )),
            }
        }
    }

    /// A call to Redis failed (`what`: the command): logged, rate limited.
    pub fn failed(&self, what: &str, error: &dyn std::fmt::Display) {
        self.failures.log(|| format!("upstream {what} failed: {error}"));
    }
}
