//! Global rules in a gateway: a rule whose limits are global (its `global`
//! field) is enforced in the gateway's region with capacity and refill
//! scaled by the region's share of the rule, as a [`RegionalShares`] says.
//!
//! The scaled limits are a policy of their own, with the rule's key
//! prefix and names, so they count in the same Redis keys (the module
//! takes changed parameters on an existing key: a lowered capacity clamps
//! at once, a raised one does not fill the bucket). Its local state
//! (leases, deny cache, the outage fallback) follows the scaled limits: a
//! gateway whose Redis is down limits locally, or refuses for a
//! fail-closed rule, at its region's share of the rule.
//!
//! Live rules only ask; [`RegionShares`](crate::global::RegionShares) answers from the
//! share table the quota balancer writes to the region's Redis.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::global::{GlobalLimit, GlobalSpec, RegionalShares};
use crate::http::PolicyHeaders;
use crate::live::snapshot::CompiledRule;
use crate::{Decision, Error, Limiter, Policy, Result, Rule, Source};

/// The live rules' side of global rules.
#[derive(Default)]
pub(crate) struct Regional {
    shares: OnceLock<Arc<dyn RegionalShares>>,
    /// Whether the warning about global rules without a region was logged.
    warned: AtomicBool,
}

/// The limits a request is checked against.
pub(crate) enum Scaled<'a> {
    /// Not a global rule: as written.
    Whole(&'a Policy),
    /// A global rule: the region's share of it.
    Regional(Arc<PolicyHeaders>),
    /// A global rule whose share here is worth less than one token.
    Refused,
}

#[cfg(feature = "tower")]
impl Scaled<'_> {
    /// The policy to check against; none for a refusal.
    pub(crate) fn policy(&self) -> Option<&Policy> {
        match self {
            Scaled::Whole(policy) => Some(policy),
            Scaled::Regional(policy) => Some(policy.policy()),
            Scaled::Refused => None,
        }
    }
}

impl Regional {
    /// Sets where the shares come from; once.
    pub(crate) fn set(&self, shares: Arc<dyn RegionalShares>) -> Result<()> {
        let region = shares.region().to_owned();
        self.shares
            .set(shares)
            .map_err(|_| Error::invalid("the region's shares are set once, when the gateway starts"))?;
        tracing::info!(target: "rl_rules", "global rules enforced at region {region:?}'s share");
        Ok(())
    }

    /// Decides `cost` for `subject` by `rule` (scaled when global), and
    /// counts a global rule's demand. Also the region's share of a
    /// global rule the decision was made against.
    pub(crate) async fn check_cost(
        &self,
        limiter: &Limiter,
        rule: &CompiledRule,
        subject: &str,
        cost: u64,
    ) -> Result<(Decision, Option<Arc<PolicyHeaders>>)> {
        let (decision, regional) = match self.scaled(rule, subject)? {
            Scaled::Whole(policy) => return Ok((limiter.check_cost(policy, subject, cost).await?, None)),
            Scaled::Regional(policy) => (limiter.check_cost(policy.policy(), subject, cost).await?, Some(policy)),
            Scaled::Refused => (refusal(rule), None),
        };
        self.demanded(rule, subject, cost);
        Ok((decision, regional))
    }

    /// Counts `cost` checked by global `rule` for the balancer's usage
    /// report (nothing for a rule that is not global, or without a region).
    pub(crate) fn demanded(&self, rule: &CompiledRule, subject: &str, cost: u64) {
        if let (Some(_), Some(shares)) = (rule.global(), self.shares.get()) {
            shares.demanded(rule.id(), subject, cost);
        }
    }

    /// Which limit of a shadow `rule` (scaled when global) would refuse.
    pub(crate) async fn shadow_refusal(
        &self,
        limiter: &Limiter,
        rule: &CompiledRule,
        subject: &str,
        cost: u64,
    ) -> Result<Option<usize>> {
        match self.scaled(rule, subject)? {
            Scaled::Whole(policy) => limiter.shadow_refusal(policy, subject, cost).await,
            Scaled::Regional(policy) => limiter.shadow_refusal(policy.policy(), subject, cost).await,
            Scaled::Refused => Ok(Some(0)),
        }
    }

    /// `rule`'s limits for `subject` here: as written, or scaled to the
    /// region's share when the rule is global.
    pub(crate) fn scaled<'a>(&self, rule: &'a CompiledRule, subject: &str) -> Result<Scaled<'a>> {
        let (Some(global), Some(scaling)) = (rule.global(), rule.scaling.as_ref()) else {
            return Ok(Scaled::Whole(rule.policy()));
        };
        let limits = &scaling.limits;
        let parts = match self.shares.get() {
            Some(shares) => shares.regional(rule.id(), global, subject, limits),
            None => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(target: "rl_rules",
                        "rule '{}' is global but this gateway has no region (LiveRules::set_region_shares): it enforces the smallest region's fixed split",
                        rule.id()
                    );
                }
                smallest_split(global, limits)
            }
        };
        match parts.filter(|p| p.len() == limits.len() && p.iter().all(|&(c, r)| c >= 1 && r >= 1)) {
            Some(parts) => Ok(Scaled::Regional(scaling.policy(rule.policy(), rule.id(), parts)?)),
            None => Ok(Scaled::Refused),
        }
    }
}

/// Without a region: the smallest share any region has in the fixed split,
/// so no region can be over whichever it is.
fn smallest_split(global: &GlobalSpec, limits: &[GlobalLimit]) -> Option<Vec<(u64, u64)>> {
    let weights = global.weights();
    let sum: u128 = weights.iter().map(|&w| w as u128).sum();
    let least = *weights.iter().min()? as u128;
    let part = |total: u64| (total as u128 * least / sum.max(1)) as u64;
    Some(limits.iter().map(|l| (part(l.capacity), part(l.refill))).collect())
}

/// A global rule's share here is worth less than one token: refused, to
/// be asked again after one period (the share may have grown by then).
pub(crate) fn refusal(rule: &CompiledRule) -> Decision {
    let period = rule.policy().rules().first().map_or(Duration::from_secs(1), Rule::period);
    Decision {
        allowed: false,
        remaining: 0,
        retry_after: Some(period),
        reset_after: period,
        limit: 0,
        rule: 0,
        source: Source::Redis,
        shadow_refused: None,
    }
}
