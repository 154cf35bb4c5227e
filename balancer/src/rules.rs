//! The balancer's global rules, from the same rule set as the gateways'.

use std::time::Duration;

use rl_gateway::live::{global_rules, RuleSetSpec, Snapshot};
use rl_gateway::Policy;

use crate::round::GlobalRule;
use rl_gateway::global::SplitParams;

/// The global rules of `spec` as the balancer of `regions` (in its order)
/// sees them. Every global rule must span exactly these regions, in this
/// order, so the fixed split the balancer plans with is the one the
/// gateways fall back to.
pub fn from_spec(spec: &RuleSetSpec, regions: &[String]) -> Result<Vec<GlobalRule>, String> {
    let rules = global_rules(spec);
    // Compiled, for the limits' capacities and refills (the ramp's length).
    let compiled = Snapshot::compile(spec, &[], 1).map_err(|e| e.to_string())?;
    if rules.is_empty() {
        return Err("the rule set has no global rule (a rule with `global = { regions = [...] }`)".into());
    }
    rules
        .into_iter()
        .map(|(id, g)| {
            if g.regions != regions {
                return Err(format!(
                    "rule {id} spans {:?} but the balancer's regions are {regions:?}: give --region in the rule's order, one balancer per set of regions",
                    g.regions
                ));
            }
            let split = SplitParams::new(g.floor_ppm(), g.weights()).map_err(|e| format!("rule {id}: {e}"))?;
            let ramp = compiled.rule(&id).map_or(Duration::ZERO, |r| longest_ramp(r.policy()));
            Ok(GlobalRule { id, split, ramp })
        })
        .collect()
}

/// How long a raised share's capacity takes to ramp up at most: the
/// largest capacity / refill x period of `policy`'s limits (rounded up).
fn longest_ramp(policy: &Policy) -> Duration {
    let ramp = |capacity: u64, refill: u64, period: Duration| {
        let ms = (capacity as u128 * period.as_millis()).div_ceil(refill.max(1) as u128);
        Duration::from_millis(ms.min(u64::MAX as u128) as u64)
    };
    policy.rules().iter().map(|r| ramp(r.capacity(), r.refill(), r.period())).max().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(global: &str) -> RuleSetSpec {
        RuleSetSpec::from_toml(&format!(
            "[[rules]]\nid = \"api\"\nreason = \"test\"\nlimits = [{{ name = \"s\", rate = 10, per = \"1s\" }}]\nglobal = {global}\n"
        ))
        .unwrap()
    }

    #[test]
    fn global_rules_become_splits_over_the_balancers_regions() {
        let regions: Vec<String> = ["eu", "us"].map(String::from).to_vec();
        let rules =
            from_spec(&spec("{ regions = [\"eu\", \"us\"], floor = 0.1, weights = [3, 1] }"), &regions).unwrap();
        assert_eq!(rules[0].id, "api");
        assert_eq!(rules[0].split, SplitParams::new(100_000, vec![3, 1]).unwrap());
        assert_eq!(rules[0].ramp, Duration::from_secs(1), "10 a second, a burst of 10: a second to ramp");
        let e = from_spec(&spec("{ regions = [\"us\", \"eu\"] }"), &regions).unwrap_err();
        assert!(e.contains("rule api spans [\"us\", \"eu\"]"), "{e}");
        let none = RuleSetSpec::from_toml(
            "[[rules]]\nid = \"a\"\nreason = \"t\"\nlimits = [{ name = \"s\", rate = 1, per = \"1s\" }]\n",
        )
        .unwrap();
        assert!(from_spec(&none, &regions).unwrap_err().contains("no global rule"));
    }
}
