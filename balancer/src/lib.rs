//! Global limits across regions: each region enforces a share of a global
//! limit with its own Redis, and a quota balancer moves the shares toward
//! where each subject's traffic is. See the README.
#![warn(missing_docs)]

pub mod confirm;
pub mod epoch;
pub mod gateway;
pub mod link;
pub mod ramp;
pub mod round;
pub mod rules;
pub mod run;
pub mod settings;
pub mod split;
pub mod stale;
pub mod status;
pub mod store;
pub mod table;
pub mod transition;
pub mod usage;

pub use epoch::MAX_EPOCH;
pub use gateway::{GatewayConfig, RegionShares, SharesStatus};
pub use ramp::{ramp_ms, ramped_capacity};
pub use round::{plan_round, GlobalRule, RoundTables};
pub use run::{Balancer, Config, RoundReport, RuleReloads, Stopped};
pub use settings::{Settings, Spans};
pub use split::{SplitParams, WHOLE};
pub use stale::{held_by_unreachable, share_in_force};
pub use table::{GlobalBucket, RegionalBucket, RuleShares, Share, ShareTable};
pub use transition::{Fence, Plan, Stale};
pub use usage::{feed_fixed_windows, QuotaState, UsageCounts};
