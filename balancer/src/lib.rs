//! The quota balancer of global limits: each region enforces a share of a
//! global limit with its own Redis, and the balancer moves the shares
//! toward where each subject's traffic is. This library exists for the
//! rl-balancer binary and its tests; the gateways' side (the share table,
//! its arithmetic, `RegionShares`) is rl-gateway's `global` feature
//! (`rl_gateway::global`). See docs/global-limits.md.
#![warn(missing_docs)]

pub mod config;
pub mod confirm;
pub mod epoch;
pub mod link;
pub mod round;
pub mod rules;
pub mod run;
pub mod status;
pub mod store;
pub mod transition;

pub use config::{Config, RedisBackend, Spans};
pub use round::{plan_round, GlobalRule, RoundTables};
pub use run::{Balancer, RuleReloads, Stopped};
pub use status::RoundReport;
pub use transition::{Fence, Plan, Stale};
