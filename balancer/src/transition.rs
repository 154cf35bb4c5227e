//! Changing shares without ever going over: lower first, raise later.
//!
//! Regions apply a change at different moments (the balancer writes to each
//! region's Redis, and each region's gateways pick it up on their next
//! sync). If one region raised before another lowered, their shares would
//! briefly sum above the whole. So a change is two phases: phase one lowers
//! every share that goes down (and touches nothing that goes up); only once
//! phase one is in effect everywhere (written, acknowledged, and given the
//! gateways' sync time) does phase two raise. Whatever mix of old, phase-one
//! and new shares the regions hold at any moment, the sum is at most the
//! larger of the old and new sums.

/// The two writes of one change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Phase one: each share at the smaller of its current and target value.
    pub lower: Vec<u32>,
    /// Phase two: the targets; written only after phase one is in effect.
    pub raise: Vec<u32>,
}

impl Plan {
    /// The plan from `current` to `target` (the same regions, in order).
    pub fn new(current: &[u32], target: &[u32]) -> Plan {
        assert_eq!(current.len(), target.len(), "current and target must name the same regions");
        Plan { lower: current.iter().zip(target).map(|(&c, &t)| c.min(t)).collect(), raise: target.to_vec() }
    }

    /// True when phase one changes something (a region goes down).
    pub fn lowers(&self, current: &[u32]) -> bool {
        self.lower != current
    }

    /// True when phase two changes something after phase one (a region goes up).
    pub fn raises(&self) -> bool {
        self.raise != self.lower
    }
}

/// A region's guard against a stale balancer: it keeps the highest epoch it
/// has seen and refuses writes from a lower one. A balancer claims a new
/// epoch in every region before it reads or writes anything, so once a
/// restarted balancer has claimed, the old one's writes are refused there.
/// This is the model of the script the share store runs in Redis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fence {
    epoch: u64,
}

/// A write refused because a newer balancer has claimed the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stale {
    /// The epoch in force.
    pub current: u64,
}

impl Fence {
    /// The epoch in force.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A balancer claims `epoch`: accepted if it is not below the one in force.
    pub fn claim(&mut self, epoch: u64) -> Result<(), Stale> {
        self.check(epoch)?;
        self.epoch = epoch;
        Ok(())
    }

    /// A write by the balancer of `epoch`: accepted only at the epoch in force.
    pub fn check(&self, epoch: u64) -> Result<(), Stale> {
        if epoch < self.epoch {
            return Err(Stale { current: self.epoch });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rl_gateway::global::WHOLE;

    #[test]
    fn a_move_lowers_then_raises() {
        let p = Plan::new(&[700_000, 200_000, 100_000], &[100_000, 200_000, 700_000]);
        assert_eq!(p.lower, vec![100_000, 200_000, 100_000]);
        assert_eq!(p.raise, vec![100_000, 200_000, 700_000]);
        assert!(p.lowers(&[700_000, 200_000, 100_000]) && p.raises());
        let same = Plan::new(&[1, 2], &[1, 2]);
        assert!(!same.lowers(&[1, 2]) && !same.raises());
    }

    #[test]
    fn a_stale_balancer_is_refused_after_a_claim() {
        let mut f = Fence::default();
        f.claim(1).unwrap();
        f.check(1).unwrap();
        f.claim(2).unwrap();
        assert_eq!(f.check(1), Err(Stale { current: 2 }));
        assert_eq!(f.claim(1), Err(Stale { current: 2 }));
    }

    fn shares(n: usize) -> impl Strategy<Value = Vec<u32>> {
        proptest::collection::vec(0..=WHOLE, n).prop_map(|mut v| {
            // Scale down to a sum of at most WHOLE, as the split gives.
            let sum: u64 = v.iter().map(|&x| x as u64).sum();
            if sum > WHOLE as u64 {
                v.iter_mut().for_each(|x| *x = (*x as u64 * WHOLE as u64 / sum) as u32);
            }
            v
        })
    }

    proptest! {
        /// Every region at any stage (old, phase one, or, once phase one is
        /// everywhere, new): the sum never passes the whole.
        #[test]
        fn no_mix_of_stages_sums_above_the_whole(
            (current, target, first, second) in (1usize..6).prop_flat_map(|n| (
                shares(n), shares(n),
                proptest::collection::vec(any::<bool>(), n),
                proptest::collection::vec(any::<bool>(), n),
            ))
        ) {
            let plan = Plan::new(&current, &target);
            let sum = |v: &[u32]| v.iter().map(|&x| x as u64).sum::<u64>();
            // During phase one: some regions lowered, the others not yet.
            let during_one: Vec<u32> = (0..current.len()).map(|i| if first[i] { plan.lower[i] } else { current[i] }).collect();
            prop_assert!(sum(&during_one) <= sum(&current));
            // During phase two: every region lowered, some raised.
            let during_two: Vec<u32> = (0..current.len()).map(|i| if second[i] { plan.raise[i] } else { plan.lower[i] }).collect();
            prop_assert!(sum(&during_two) <= sum(&target));
            prop_assert!(sum(&during_one) <= WHOLE as u64 && sum(&during_two) <= WHOLE as u64);
        }

        /// Two balancers interleaving claims and writes: once the newer one
        /// has claimed a region, no write of an older epoch is accepted there.
        #[test]
        fn fencing_refuses_stale_epochs(steps in proptest::collection::vec((1u64..6, any::<bool>()), 1..40)) {
            let mut fence = Fence::default();
            let mut highest_claimed = 0;
            for (epoch, is_claim) in steps {
                let result = if is_claim { fence.claim(epoch) } else { fence.check(epoch) };
                prop_assert_eq!(result.is_ok(), epoch >= highest_claimed);
                if is_claim && result.is_ok() {
                    highest_claimed = epoch;
                }
                prop_assert_eq!(fence.epoch(), highest_claimed);
            }
        }
    }
}
