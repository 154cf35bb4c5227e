//! The client's test helpers (client/tests/common): one copy for both crates.

#[path = "../../../client/tests/common/mod.rs"]
mod client;

pub use client::*;
