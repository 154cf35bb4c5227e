//! Live rules (feature `live`): limits that change without a gateway
//! deploy. A rule set is checked and compiled once, when it is loaded, into
//! an immutable snapshot that requests share: no request reads a rule file
//! or a store. New versions come from Redis or from a file; `rlctl`
//! validates, publishes and adds overrides. The guide is the repository's
//! `docs/rules.md`.
//!
//! With the `tower` feature too, `LiveDecide` decides behind
//! `rl_gateway::http::RateLimitLayer`.
//!
//! ```rust,no_run
//! use std::net::IpAddr;
//! use std::time::SystemTime;
//! use rl_gateway::live::{LiveRules, RedisSource, Request};
//! use rl_gateway::{Config, Limiter};
//!
//! # async fn run() -> Result<(), rl_gateway::Error> {
//! let limiter = Limiter::new(Config::standalone("redis://10.0.0.5:6379/"))?;
//! // Redis's rules, followed from now on; the file only while Redis has none
//! // (or cannot be reached at start). Dropping the watcher stops it.
//! let (rules, _watcher) = LiveRules::start(limiter, "rules.toml", RedisSource::new("redis://10.0.0.5:6379/")).await?;
//!
//! // On every request:
//! let ip: IpAddr = "2001:db8:1:2::7".parse().unwrap();
//! let request = Request::new().subject("key_8f3").ip(ip).plan("pro").endpoint("GET /search");
//! let verdict = rules.check(&request).await?;
//! let headers = verdict.headers(SystemTime::now()); // the enforced rule's policy (the `http` headers)
//! if !verdict.decision.allowed {
//!     // 429 with headers, naming verdict.rule.id()
//! }
//! // Allowed: take the rule's in-flight slots, if it has in-flight limits.
//! match rules.acquire(&request).await?.permit {
//!     Ok(permit) => { /* serve; hold `permit` (None: no in-flight limit) until the response is sent */ drop(permit) }
//!     Err(busy) => println!("429: {} of {} in flight, a slot frees within {:?}", busy.in_flight, busy.limit, busy.retry_after),
//! }
//! # let _ = headers; Ok(()) }
//! ```

mod compile;
mod fleet;
mod history;
#[cfg(feature = "tower")]
mod layer;
mod regional;
mod rules;
mod scaling;
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
pub use rules::{Admission, Installed, LiveRules, RulesStatus, ShadowEntry, ShadowRefusal, Verdict};
pub use server_limits::server_refusals;
pub use snapshot::{remaining, CompiledRule, Match, Request, Scope, Snapshot};
pub use spec::{
    global_rules, stored_kind_changes, FleetBackend, IpTier, LimitKind, LimitSpec, MatchSpec, Mode, RuleSetSpec,
    RuleSpec, MAX_RULES_BYTES, MAX_VERSION, MAX_WRITTEN_VERSION,
};
pub use store::{override_id, RulesStore, Stored, DEFAULT_KEY, MAX_OVERRIDE};
pub use watch::{RedisSource, Watcher};
