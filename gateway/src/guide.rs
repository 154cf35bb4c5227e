//! The guide to rl-gateway: decisions, policies, leases, the deny cache,
//! failures and failover, in-flight limits and the rest (gateway/src/guide.md).
#![doc = include_str!("guide.md")]
