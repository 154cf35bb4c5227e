//! Readiness, apart from liveness: the relay is ready while Redis answers
//! its probe (a PING every second, to every primary of a cluster), on a
//! connection of the probe's own, within the probe's own second: a stall
//! shorter than that (a fork, a slow command, a busy host) is not an
//! outage, however short the relay's `--timeout-ms` for its calls. A relay
//! that is alive but not ready still answers PING and serves what it holds;
//! an orchestrator or load balancer takes it out of rotation by `/ready`
//! (and `rl_relay_ready`), never by `/live`. Upstream failures are logged,
//! at most one line per ten seconds with the count of the others.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::logging::{line, Throttled};

/// How often Redis is probed, and how long a probe may take.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

const UNKNOWN: u8 = 0;
const READY: u8 = 1;
const NOT_READY: u8 = 2;

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
    /// that must answer at once decides without Redis meanwhile.
    pub fn unreachable(&self) -> bool {
        self.state.load(Ordering::Relaxed) == NOT_READY
    }

    /// A probe's outcome; a change is logged.
    pub fn probed(&self, outcome: Result<(), String>) {
        let new = if outcome.is_ok() { READY } else { NOT_READY };
        if self.state.swap(new, Ordering::Relaxed) != new {
            match outcome {
                Ok(()) => line("Redis is reachable: ready"),
                Err(e) => line(format_args!("Redis is unreachable: not ready ({e})")),
            }
        }
    }

    /// A call to Redis failed (`what`: the command): logged, rate limited.
    pub fn failed(&self, what: &str, error: &dyn std::fmt::Display) {
        self.failures.log(|| format!("upstream {what} failed: {error}"));
    }
}
