//! Nothing of its own: the operations tests (tests/alerts.rs, dashboard.rs,
//! packaging.rs) are this package's until they move, and dashboard.rs reads
//! the exporter here. Live rules are rl-gateway's `live` feature; rlctl
//! and its exporter are the `rlctl` crate.

pub use rlctl::exporter;
