#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod compile;
pub mod exporter;
mod fleet;
mod history;
#[cfg(feature = "tower")]
mod layer;
mod live;
mod regional;
mod server_limits;
mod shadowing;
mod snapshot;
mod spec;
mod store;
mod watch;

pub use compile::parse_network;
pub use fleet::{escaped, fleet_status, FleetStatus, GatewayReport, REPORT_FORGOTTEN_AFTER};
pub use history::{diff, HistoryEntry, HISTORY_LEN};
#[cfg(feature = "tower")]
pub use layer::LiveDecide;
pub use live::{Admission, Installed, LiveRules, RulesStatus, ShadowEntry, ShadowRefusal, Verdict};
pub use regional::{GlobalLimit, RegionalShares, SHARES_KEY};
pub use server_limits::server_refusals;
pub use snapshot::{remaining, CompiledRule, Match, Request, Scope, Snapshot};
pub use spec::{
    global_rules, stored_kind_changes, FleetBackend, GlobalSpec, IpTier, LimitKind, LimitSpec, MatchSpec, Mode,
    RuleSetSpec, RuleSpec, MAX_RULES_BYTES, MAX_VERSION, MAX_WRITTEN_VERSION,
};
pub use store::{override_id, RulesStore, Stored, DEFAULT_KEY, MAX_OVERRIDE};
pub use watch::{RedisSource, Watcher};
