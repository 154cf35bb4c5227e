//! A global rule's policies at the shares in use, each with its headers,
//! kept with the compiled rule (live/regional.rs asks the region's shares
//! and picks one).

use std::sync::Arc;

use quick_cache::sync::Cache;

use crate::global::GlobalLimit;
use crate::http::PolicyHeaders;
use crate::{FailMode, Policy, Result, Rule};

/// Scaled policies kept per global rule: one per share in use (the busy
/// subjects', the default's, and a ramp's few steps).
const SCALED_POLICIES: usize = 1_024;

/// A global rule's limits as written, and its policies at the shares in
/// use (each with its headers, built once): shares move every balancer
/// interval at most, so requests reuse one policy (and its leases)
/// meanwhile. Made when the rule is compiled, kept with its policy across
/// versions.
pub(crate) struct Scaling {
    pub(crate) limits: Vec<GlobalLimit>,
    policies: Cache<Vec<(u64, u64)>, Arc<PolicyHeaders>>,
}

impl Scaling {
    pub(crate) fn new(policy: &Policy) -> Scaling {
        let limits = policy
            .rules()
            .iter()
            .map(|r| GlobalLimit {
                capacity: r.capacity(),
                refill: r.refill(),
                period_ms: u64::try_from(r.period().as_millis()).unwrap_or(u64::MAX),
            })
            .collect();
        Scaling { limits, policies: Cache::new(SCALED_POLICIES) }
    }

    /// `policy` (the rule's, as written) at `parts`: (capacity, refill) per limit.
    pub(crate) fn policy(&self, policy: &Policy, label: &str, parts: Vec<(u64, u64)>) -> Result<Arc<PolicyHeaders>> {
        if let Some(found) = self.policies.get(&parts) {
            return Ok(found);
        }
        let scaled = policy.rules().iter().zip(&parts).map(|(r, &(capacity, refill))| {
            let scaled = Rule::new(r.name(), capacity, refill, r.period());
            let scaled = if r.fail_mode() == FailMode::Closed { scaled.fail_closed() } else { scaled };
            if r.is_shadow() {
                scaled.shadow()
            } else {
                scaled
            }
        });
        let built = scaled.fold(Policy::builder(policy.prefix()).label(label), |b, r| b.rule(r)).build()?;
        let built = Arc::new(PolicyHeaders::new(built));
        self.policies.insert(parts, built.clone());
        Ok(built)
    }
}

impl std::fmt::Debug for Scaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scaling").field("limits", &self.limits).field("policies", &self.policies.len()).finish()
    }
}
