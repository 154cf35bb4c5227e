//! Helpers shared by the client's and the limiter's (rl-gateway) integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use rl_client::{Backend, Bucket, Client, Clock, Config, ManualClock};
use testkit::Server;

/// A configuration for tests: timeouts generous enough for a busy machine.
pub fn config(url: String, backend: Backend) -> Config {
    Config {
        backend,
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        ..Config::standalone(url)
    }
}

/// `config` on a manual clock, and the clock: time passes for the
/// limiter's leases, deny cache, breakers and fallback only when the test
/// advances it (Redis keeps its own clock).
pub fn on_manual_clock(config: Config) -> (Config, Arc<ManualClock>) {
    let clock = ManualClock::new();
    (Config { clock: Clock::Manual(clock.clone()), ..config }, clock)
}

/// How often the server ran `command` (as INFO commandstats names it),
/// leaving out calls that failed (a first EVALSHA answered NOSCRIPT).
pub fn calls(server: &Server, command: &str) -> u64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut server.con()).unwrap();
    let Some(line) = stats.lines().find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:"))) else { return 0 };
    let field = |name: &str| {
        line.split(',').find_map(|kv| kv.strip_prefix(&format!("{name}="))).map_or(0, |n| n.parse::<u64>().unwrap())
    };
    field("calls") - field("failed_calls")
}

/// Whole tokens in one bucket now, read without taking any.
pub async fn tokens(client: &Client, bucket: &Bucket) -> u64 {
    let d = client.peek(std::slice::from_ref(bucket), 1).await.unwrap();
    if d.allowed {
        d.remaining + 1
    } else {
        d.remaining
    }
}

/// Calls that reached the limiter's commands on the server.
pub fn limiter_calls(server: &Server, backend: Backend) -> u64 {
    match backend {
        Backend::Module => ["rl.take", "rl.lease", "rl.refund", "rl.peek"].iter().map(|c| calls(server, c)).sum(),
        Backend::Lua => calls(server, "evalsha"),
    }
}

/// Generates `mod module` and `mod lua`, each running the named
/// `async fn name(backend: Backend)` tests on its backend.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod module {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(rl_client::Backend::Module).await;
            })*
        }
        mod lua {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(rl_client::Backend::Lua).await;
            })*
        }
    };
}
