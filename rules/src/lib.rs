#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod compile;
#[cfg(feature = "tower")]
mod layer;
mod live;
mod snapshot;
mod spec;
mod store;
mod watch;

#[cfg(feature = "tower")]
pub use layer::LiveDecide;
pub use live::{Installed, LiveRules, RulesStatus, ShadowEntry, ShadowRefusal, Verdict};
pub use snapshot::{remaining, CompiledRule, Match, Request, Scope, Snapshot};
pub use spec::{LimitKind, LimitSpec, MatchSpec, Mode, RuleSetSpec, RuleSpec, MAX_VERSION};
pub use store::{override_id, RulesStore, Stored, DEFAULT_KEY, MAX_OVERRIDE};
pub use watch::{RedisSource, Watcher};
