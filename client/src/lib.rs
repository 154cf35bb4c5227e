#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod breaker;
mod client;
mod clock;
mod config;
mod connection;
mod decision;
mod endpoint;
mod error;
mod inflight;
mod lock;
mod params;
mod primary;
mod prometheus;
mod script_call;
mod slot;
mod tls;

pub use client::{Bucket, Client, Window};
pub use clock::{Clock, ManualClock};
pub use config::{redacted, Backend, Config, NodeAuth, Target, SENTINEL_PORT, SENTINEL_SCHEME, SENTINEL_TLS_SCHEME};
pub use connection::Connection;
pub use decision::{Decision, Grant, Source};
pub use error::{Error, Result};
pub use inflight::{Acquired, Inflight};
pub use params::period_ms;
pub use primary::{is_wrong_server, ConnectionStatus};
pub use prometheus::{prometheus_family, prometheus_label};
pub use rl_core::WindowMode;
pub use tls::{Tls, TLS_ENV};

/// What rl-gateway builds its limiter from: public for it alone (the
/// crates are released together, one version), not a promise to anyone
/// else. The typed calls it needs beyond the documented ones are hidden
/// methods of [`Client`] and [`Decision`].
#[doc(hidden)]
pub mod internal {
    pub use crate::breaker::{Breaker, Ticket};
    pub use crate::clock::millis;
    pub use crate::inflight::{inflight_params, new_id, validate_cost};
    pub use crate::lock::{lock, lock_waits, stripe, STRIPES};
    pub use crate::params::{beyond_lua, bucket_params};
    pub use crate::script_call::{is_module_command, script_call, Script, ScriptCall};
    pub use crate::slot::{slot_of, SLOTS};
}
