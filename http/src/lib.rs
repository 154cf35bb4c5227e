#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod backoff;
mod client_ip;
pub mod headers;
#[cfg(feature = "tower")]
mod inflight_layer;
#[cfg(feature = "tower")]
mod layer;

pub use backoff::Backoff;
pub use client_ip::{ClientIp, ForwardHeader, Trust};
pub use headers::PolicyHeaders;
#[cfg(feature = "tower")]
pub use inflight_layer::{InflightLayer, InflightLimit, PermitBody};
#[cfg(feature = "tower")]
pub use layer::{
    BoxFuture, By, Checked, Decide, Facts, MissingKey, PeerAddr, Policies, RateLimit, RateLimitLayer, Refused,
};
