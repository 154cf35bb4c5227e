//! The guide to rl-gateway's HTTP side (gateway/src/http/guide.md).
#![doc = include_str!("guide.md")]
