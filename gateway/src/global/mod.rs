//! Global limits, the gateway's side (feature `global`; `live` includes
//! it): a global rule's split ([`GlobalSpec`]), what live rules ask of
//! the region's shares ([`RegionalShares`]), and [`RegionShares`], which
//! answers from the share table the quota balancer (rl-balancer) writes to
//! the region's Redis, and reports the usage it splits by. The share
//! arithmetic (the split, the ramp, the stale-table fallback) lives here
//! too, once, for both the gateways and the balancer. The guide is the
//! repository's `docs/global-limits.md`.

mod ramp;
mod regional;
mod shares;
mod spec;
mod split;
mod stale;
pub mod store;
mod table;
mod usage;

pub use ramp::{ramp_ms, ramped_capacity};
pub use regional::{GlobalLimit, RegionalShares, SHARES_KEY};
pub use shares::{GatewayConfig, RegionShares, SharesStatus};
pub use spec::GlobalSpec;
pub use split::{SplitParams, WHOLE};
pub use stale::{held_by_unreachable, share_in_force};
pub use table::{GlobalBucket, RegionalBucket, RuleShares, Share, ShareTable};
pub use usage::{feed_fixed_windows, QuotaState, UsageCounts};
