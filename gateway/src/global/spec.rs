//! A global rule's split as its rule file writes it (`global = { ... }`):
//! the regions it spans, the floor each keeps, the fixed split's weights.

use serde::{Deserialize, Serialize};

/// A rule whose limits are global, split between the regions it spans:
/// `global = { regions = ["eu", "us", "ap"], floor = 0.1, weights = [5, 3, 2] }`.
/// Each region's gateways enforce the region's share (set by the quota
/// balancer, rl-balancer) with their own Redis; without a balancer, the
/// fixed split by `weights`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalSpec {
    /// The regions, as gateways name theirs; at least one, each once.
    pub regions: Vec<String>,
    /// The fraction of the global limit every region always keeps, so it
    /// can absorb a sudden shift: `0 <= floor <= 1 / regions`. Default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub floor: f64,
    /// The fixed split, one weight per region in order; default equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Vec<u32>>,
}

/// `floor` is checked finite when a set is compiled, and a NaN never
/// reaches a snapshot; equality is only used to compare rule sets.
impl Eq for GlobalSpec {}

impl GlobalSpec {
    /// The floor in parts per million of the global limit (rounded down).
    pub fn floor_ppm(&self) -> u32 {
        (self.floor.clamp(0.0, 1.0) * 1_000_000.0) as u32
    }

    /// The weights of the fixed split: as written, or 1 for every region.
    pub fn weights(&self) -> Vec<u32> {
        self.weights.clone().unwrap_or_else(|| vec![1; self.regions.len()])
    }

    /// Where `region` is in `regions`.
    pub fn region_index(&self, region: &str) -> Option<usize> {
        self.regions.iter().position(|r| r == region)
    }
}

/// `eu 50%, us 30%, ap 20% (fixed split), floor 10%`: what rlctl shows.
impl std::fmt::Display for GlobalSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let weights = self.weights();
        let sum: u64 = weights.iter().map(|&w| w as u64).sum::<u64>().max(1);
        let parts: Vec<String> = self
            .regions
            .iter()
            .zip(&weights)
            .map(|(r, &w)| format!("{r} {}%", percent(w as f64 / sum as f64)))
            .collect();
        write!(f, "{} (fixed split), floor {}%", parts.join(", "), percent(self.floor))
    }
}

/// A fraction as a percentage with at most one decimal: `33.3`, `50`.
fn percent(fraction: f64) -> String {
    let tenths = (fraction * 1000.0).round() / 10.0;
    format!("{tenths}")
}

fn is_zero(floor: &f64) -> bool {
    *floor == 0.0
}
