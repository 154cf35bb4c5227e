//! What live rules ask of a region's shares: the [`RegionalShares`] a
//! gateway hands its live rules and the global limits it is asked about.
//! [`RegionShares`](crate::global::RegionShares) answers from the share
//! table the quota balancer writes to the region's Redis.

use crate::global::GlobalSpec;

/// The hash in each region's Redis that holds the region's share table of
/// global rules (rl-balancer writes it, gateways read it, `rlctl metrics`
/// reports its age).
pub const SHARES_KEY: &str = "rl:shares";

/// One limit of a global rule as the rule states it for the whole world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GlobalLimit {
    /// Tokens the bucket holds at most, worldwide.
    pub capacity: u64,
    /// Tokens added every `period_ms`, worldwide.
    pub refill: u64,
    /// The refill period in ms.
    pub period_ms: u64,
}

/// The share of global rules this gateway's region enforces: set once on
/// [`LiveRules`](crate::live::LiveRules) with
/// [`set_region_shares`](crate::live::LiveRules::set_region_shares).
/// Implemented by rl-balancer's `RegionShares`; called on every request to
/// a global rule, so it answers from memory.
pub trait RegionalShares: Send + Sync + 'static {
    /// The gateway's region, as rules name it in `global.regions`.
    fn region(&self) -> &str;

    /// What this region enforces now of each of `limits` (global rule
    /// `rule`'s, in order) for `subject`: `(capacity, refill)` per limit,
    /// rounded down. `None`: the share is worth less than one token and
    /// the region refuses (under the limit, never over).
    fn regional(
        &self,
        rule: &str,
        global: &GlobalSpec,
        subject: &str,
        limits: &[GlobalLimit],
    ) -> Option<Vec<(u64, u64)>>;

    /// A request costing `cost` was checked under global rule `rule` for
    /// `subject`, admitted or refused: the demand the balancer splits the
    /// rule by (counting only what was admitted would keep a region's
    /// share where it is: a subject refused for want of share never shows
    /// the traffic that would earn it more). Counted
    /// for the balancer's usage report. Called on the request path: it
    /// counts in memory.
    fn demanded(&self, rule: &str, subject: &str, cost: u64);
}
