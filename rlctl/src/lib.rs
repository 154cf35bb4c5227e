//! The library half of the rlctl package, for its binary and its tests:
//! the module's Prometheus exporter (`rlctl metrics`). The rest of rlctl
//! is its binary (src/main.rs), on rl-gateway's live rules.

pub mod exporter;
pub mod tls_flags;
