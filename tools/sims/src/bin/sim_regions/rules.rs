//! The simulation's rule set: one customer limit across the three regions.

use rl_gateway::live::RuleSetSpec;

/// The global rule every gateway enforces: the busy customer's limit is
/// `RATE` a second with a burst of `BURST`, split between the regions.
pub const RATE: u64 = 1000;
pub const BURST: u64 = 200;
pub const FLOOR: f64 = 0.05;

pub fn rules() -> RuleSetSpec {
    RuleSetSpec::from_toml(&format!(
        r#"
key_prefix = "sim"
[[rules]]
id = "api"
reason = "one customer limit across three regions (the simulation)"
limits = [{{ name = "per_second", rate = {RATE}, per = "1s", burst = {BURST} }}]
global = {{ regions = ["eu", "us", "ap"], floor = {FLOOR} }}
"#
    ))
    .expect("the simulation's rules are valid")
}
