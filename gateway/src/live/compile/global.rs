//! A global rule's split between regions, checked field by field.

use crate::validate_name;

use crate::global::GlobalSpec;
use crate::live::spec::{LimitKind, RuleSpec};

/// Checks a rule's `global` field, naming the field at fault.
pub(super) fn check_global(g: &GlobalSpec, spec: &RuleSpec, is_override: bool, at: &str, errors: &mut Vec<String>) {
    let at = format!("{at}: global");
    if is_override {
        errors.push(format!(
            "{at}: an override is enforced as written in every region at once; global limits belong in the rule file"
        ));
    }
    if g.regions.is_empty() {
        errors.push(format!("{at}.regions: name at least one region, like [\"eu\", \"us\"]"));
    }
    for (i, region) in g.regions.iter().enumerate() {
        if let Err(why) = validate_name(region) {
            errors.push(format!("{at}.regions: region {} {why}", i + 1));
        } else if g.regions[..i].contains(region) {
            errors.push(format!("{at}.regions: {region:?} is named twice"));
        }
    }
    let n = g.regions.len().max(1) as f64;
    if !g.floor.is_finite() || g.floor < 0.0 || g.floor * n > 1.0 + 1e-9 {
        errors.push(format!(
            "{at}.floor: the fraction each region always keeps is 0 to 1/{} ({:.4}) for {} regions, got {}",
            n,
            1.0 / n,
            g.regions.len(),
            g.floor
        ));
    }
    if let Some(weights) = &g.weights {
        if weights.len() != g.regions.len() {
            errors.push(format!(
                "{at}.weights: one weight per region: {} weights for {} regions",
                weights.len(),
                g.regions.len()
            ));
        } else if weights.iter().all(|&w| w == 0) {
            errors.push(format!("{at}.weights: all 0: at least one region must have a positive weight"));
        }
    }
    for limit in spec.limits.iter().filter(|l| l.kind != LimitKind::Bucket) {
        errors.push(format!(
            "{at}: limit '{}' is a {}: a global rule's limits are buckets, whose share can move between regions at any moment; a window's count cannot (for a daily quota across regions, add gateway counts in batches: rl-balancer's README)",
            limit.name,
            limit.kind.name()
        ));
    }
}
