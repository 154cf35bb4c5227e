//! The balancer's global rules, from the same rule set as the gateways'.

use rl_rules::{global_rules, RuleSetSpec};

use crate::round::GlobalRule;
use crate::split::SplitParams;

/// The global rules of `spec` as the balancer of `regions` (in its order)
/// sees them. Every global rule must span exactly these regions, in this
/// order, so the fixed split the balancer plans with is the one the
/// gateways fall back to.
pub fn from_spec(spec: &RuleSetSpec, regions: &[String]) -> Result<Vec<GlobalRule>, String> {
    let rules = global_rules(spec);
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
            Ok(GlobalRule { id, split })
        })
        .collect()
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
        let e = from_spec(&spec("{ regions = [\"us\", \"eu\"] }"), &regions).unwrap_err();
        assert!(e.contains("rule api spans [\"us\", \"eu\"]"), "{e}");
        let none = RuleSetSpec::from_toml(
            "[[rules]]\nid = \"a\"\nreason = \"t\"\nlimits = [{ name = \"s\", rate = 1, per = \"1s\" }]\n",
        )
        .unwrap();
        assert!(from_spec(&none, &regions).unwrap_err().contains("no global rule"));
    }
}
