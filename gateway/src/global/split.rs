//! How a global limit is split between regions: in proportion to recent
//! traffic, with a floor per region, or by fixed weights when there is no
//! traffic to follow. Integer parts per million, so the same inputs give the
//! same shares on every machine and rounding only ever gives away less.

/// A whole limit in parts per million: shares are `0..=WHOLE`.
pub const WHOLE: u32 = 1_000_000;

/// What a split needs besides traffic, checked once when made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitParams {
    floor: u32,
    weights: Vec<u32>,
}

impl SplitParams {
    /// `floor`: the share (ppm) every live region keeps whatever its traffic,
    /// so it can absorb a sudden shift; `weights`: the fixed split between
    /// the regions, in their order, used when there is no traffic to follow
    /// and when the balancer is gone.
    pub fn new(floor: u32, weights: Vec<u32>) -> Result<Self, String> {
        if weights.is_empty() {
            return Err("a split needs at least one region".into());
        }
        if weights.iter().all(|&w| w == 0) {
            return Err("the region weights are all 0: at least one must be positive".into());
        }
        let n = weights.len() as u64;
        if floor as u64 * n > WHOLE as u64 {
            return Err(format!(
                "a floor of {floor} ppm in each of {n} regions is more than the whole limit ({WHOLE} ppm)"
            ));
        }
        Ok(SplitParams { floor, weights })
    }

    /// The floor each live region keeps, in ppm.
    pub fn floor(&self) -> u32 {
        self.floor
    }

    /// How many regions the split spans.
    pub fn regions(&self) -> usize {
        self.weights.len()
    }

    /// The fixed split by weight: the default for subjects the balancer
    /// does not follow, and what gateways fall back to without a balancer.
    pub fn default_split(&self) -> Vec<u32> {
        proportional(WHOLE, &self.weights.iter().map(|&w| w as u64).collect::<Vec<_>>())
    }

    /// Shares following `usage` (requests admitted per region over the last
    /// interval), among the regions marked `live`, within `budget` ppm (the
    /// whole limit less what unreachable regions may still hold). Each live
    /// region gets the floor (or an even part of the budget if the floors
    /// do not fit), the rest goes in proportion to usage, or to the weights
    /// when no live region had traffic. Regions not live get 0.
    pub fn follow_traffic(&self, usage: &[u64], live: &[bool], budget: u32) -> Vec<u32> {
        let n = self.weights.len();
        assert!(usage.len() == n && live.len() == n, "usage and live must name every region");
        let budget = budget.min(WHOLE);
        let live_count = live.iter().filter(|&&l| l).count() as u32;
        if live_count == 0 {
            return vec![0; n];
        }
        let floor = self.floor.min(budget / live_count);
        let rest = budget - floor * live_count;
        let only_live = |values: Vec<u64>| -> Vec<u64> {
            values.into_iter().zip(live).map(|(v, &l)| if l { v } else { 0 }).collect()
        };
        let mut by = only_live(usage.to_vec());
        if by.iter().all(|&u| u == 0) {
            by = only_live(self.weights.iter().map(|&w| w as u64).collect());
        }
        if by.iter().all(|&u| u == 0) {
            // Live regions all weighted 0 and quiet: each keeps its floor.
            by = only_live(vec![1; n]);
        }
        proportional(rest, &by).into_iter().zip(live).map(|(s, &l)| if l { s + floor } else { 0 }).collect()
    }
}

/// `total` split in proportion to `by`, each part rounded down (the sum is
/// at most `total`). `by` must not be all 0.
fn proportional(total: u32, by: &[u64]) -> Vec<u32> {
    let sum: u128 = by.iter().map(|&b| b as u128).sum();
    by.iter().map(|&b| (total as u128 * b as u128 / sum) as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params() -> SplitParams {
        SplitParams::new(50_000, vec![1, 1, 1]).unwrap()
    }

    #[test]
    fn skewed_traffic_gets_its_proportion_above_the_floor() {
        let s = params().follow_traffic(&[700, 200, 100], &[true; 3], WHOLE);
        // 850,000 ppm above the floors, split 70/20/10.
        assert_eq!(s, vec![50_000 + 595_000, 50_000 + 170_000, 50_000 + 85_000]);
    }

    #[test]
    fn no_traffic_is_the_default_split() {
        let p = SplitParams::new(0, vec![2, 1, 1]).unwrap();
        assert_eq!(p.default_split(), vec![500_000, 250_000, 250_000]);
        assert_eq!(p.follow_traffic(&[0, 0, 0], &[true; 3], WHOLE), vec![500_000, 250_000, 250_000]);
    }

    #[test]
    fn a_dead_region_gets_nothing_and_the_budget_is_kept() {
        let s = params().follow_traffic(&[0, 500, 500], &[false, true, true], 700_000);
        assert_eq!(s, vec![0, 350_000, 350_000]);
    }

    #[test]
    fn floors_that_do_not_fit_the_budget_are_shared_evenly() {
        let s = SplitParams::new(300_000, vec![1, 1, 1]).unwrap().follow_traffic(&[9, 0, 0], &[true; 3], 600_000);
        assert_eq!(s, vec![200_000, 200_000, 200_000]);
    }

    #[test]
    fn bad_params_are_named() {
        assert!(SplitParams::new(400_000, vec![1, 1, 1]).unwrap_err().contains("more than the whole limit"));
        assert!(SplitParams::new(0, vec![0, 0]).unwrap_err().contains("all 0"));
        assert!(SplitParams::new(0, vec![]).unwrap_err().contains("at least one region"));
    }

    fn inputs() -> impl Strategy<Value = (SplitParams, Vec<u64>, Vec<bool>, u32)> {
        (1usize..6).prop_flat_map(|n| {
            (
                0..=WHOLE / n as u32,
                proptest::collection::vec(0u32..1000, n),
                proptest::collection::vec(prop_oneof![Just(0u64), 0u64..10, any::<u64>()], n),
                proptest::collection::vec(any::<bool>(), n),
                0..=WHOLE,
            )
                .prop_filter_map("weights all 0", |(floor, weights, usage, live, budget)| {
                    SplitParams::new(floor, weights).ok().map(|p| (p, usage, live, budget))
                })
        })
    }

    proptest! {
        #[test]
        fn shares_sum_to_at_most_the_budget((p, usage, live, budget) in inputs()) {
            let s = p.follow_traffic(&usage, &live, budget);
            prop_assert!(s.iter().map(|&x| x as u64).sum::<u64>() <= budget as u64);
            prop_assert!(p.default_split().iter().map(|&x| x as u64).sum::<u64>() <= WHOLE as u64);
        }

        #[test]
        fn the_floor_is_respected((p, usage, live, budget) in inputs()) {
            let s = p.follow_traffic(&usage, &live, budget);
            let live_count = live.iter().filter(|&&l| l).count() as u32;
            for (share, &l) in s.iter().zip(&live) {
                if l {
                    // The floor, or an even part of a budget too small for the floors.
                    prop_assert!(*share >= p.floor().min(budget / live_count));
                } else {
                    prop_assert_eq!(*share, 0);
                }
            }
        }

        #[test]
        fn same_inputs_same_shares((p, usage, live, budget) in inputs()) {
            prop_assert_eq!(p.follow_traffic(&usage, &live, budget), p.clone().follow_traffic(&usage, &live, budget));
        }

        #[test]
        fn more_traffic_never_means_a_smaller_share((p, usage, live, budget) in inputs(), extra in 1u64..1000) {
            let before = p.follow_traffic(&usage, &live, budget);
            let mut more = usage.clone();
            more[0] = more[0].saturating_add(extra);
            // Only when region 0 already had traffic: otherwise the split switches from weights to traffic.
            prop_assume!(usage.iter().zip(&live).any(|(&u, &l)| l && u > 0));
            prop_assume!(usage.iter().map(|&u| u as u128).sum::<u128>() < u64::MAX as u128 / 2);
            let after = p.follow_traffic(&more, &live, budget);
            prop_assert!(after[0] >= before[0]);
        }
    }
}
