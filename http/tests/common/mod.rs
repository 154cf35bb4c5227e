//! Helpers shared by the HTTP tests.
#![allow(dead_code)]

use std::time::Duration;

use rl_gateway::{Backend, Config};

/// A configuration for tests: timeouts generous enough for a busy machine.
pub fn config(url: String, backend: Backend) -> Config {
    Config {
        backend,
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        ..Config::standalone(url)
    }
}
