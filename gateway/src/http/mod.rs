#![doc = include_str!("../../HTTP.md")]

mod backoff;
mod client_ip;
pub mod headers;
#[cfg(feature = "tower")]
mod inflight_layer;
#[cfg(feature = "tower")]
mod layer;
mod release;

pub use backoff::Backoff;
pub use client_ip::{ClientIp, ForwardHeader, Trust};
pub use headers::{InflightHeaders, PolicyHeaders};
#[cfg(feature = "tower")]
pub use inflight_layer::{InflightLayer, InflightLimit, PermitBody};
#[cfg(feature = "tower")]
pub use layer::{
    BoxFuture, By, Checked, Decide, Decided, Facts, HeldBody, InflightChecked, MissingKey, PeerAddr, Policies,
    RateLimit, RateLimitLayer, Refused,
};
pub use release::ReleaseRate;
