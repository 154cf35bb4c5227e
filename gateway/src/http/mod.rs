//! HTTP for a gateway (feature `http`): the draft's RateLimit headers and the
//! legacy `X-RateLimit-*` ([`headers`]), the client's IP behind trusted
//! proxies ([`ClientIp`]), full-jitter [`Backoff`]; with feature `tower`, the
//! rate and in-flight tower layers. How to use them: [`guide`].

pub mod guide;

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
