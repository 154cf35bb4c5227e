//! Live rules: limits that change without a gateway deploy.
//!
//! A rule set (a TOML or JSON file) is checked whole and compiled once into
//! an immutable [`Snapshot`]: every rule's limits become a
//! [`Policy`](crate::Policy), every match goes into an index. A gateway's
//! [`LiveRules`] holds the snapshot in force and swaps a new one in at
//! once, so a request never sees half of a rule set and never reads a
//! store. New versions come from Redis ([`RulesStore`]: a hash holding the
//! set and the overrides, a channel announcing versions, a poll as the
//! fallback) or from a file; `rlctl` validates, publishes and adds
//! overrides. The crate README's "Live rules" section has the whole story.

mod live;
mod snapshot;
mod spec;
mod store;
mod watch;

pub use live::{Installed, LiveRules, RulesStatus, ShadowEntry, ShadowRefusal, Verdict};
pub use snapshot::{remaining, CompiledRule, Match, Request, Scope, Snapshot};
pub use spec::{Fail, LimitKind, LimitSpec, MatchSpec, Mode, RuleSetSpec, RuleSpec, MAX_VERSION};
pub use store::{override_id, RulesStore, Stored, DEFAULT_KEY, MAX_OVERRIDE};
pub use watch::{RedisSource, Watcher};
