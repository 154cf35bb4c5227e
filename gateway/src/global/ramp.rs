//! A raised share must not arrive as a fresh full bucket.
//!
//! A missing bucket key means a full bucket, at whatever capacity the call
//! names. If a region's capacity jumped from its old share to its new one,
//! a subject whose key had expired (full at the old capacity) would find
//! the new capacity full at once: tokens minted that no other region gave
//! up in time, and the global sum goes over. So a raised capacity grows
//! no faster than the region's new refill: a missing key is then worth at
//! most what a kept key would have refilled to, and the bound holds.
//! Lowered capacities apply at once (the module clamps the level).

/// The capacity a region enforces `elapsed_ms` after its share of a
/// bucket's capacity was raised from `from` to `to`, with a refill of
/// `refill` tokens every `period_ms` at the new share: `from`, growing at
/// the refill rate, up to `to`. Never below `from` nor above `to`.
pub fn ramped_capacity(from: u64, to: u64, refill: u64, period_ms: u64, elapsed_ms: u64) -> u64 {
    if to <= from {
        return to;
    }
    let grown = refill as u128 * elapsed_ms as u128 / period_ms.max(1) as u128;
    (from as u128 + grown).min(to as u128) as u64
}

/// How long a ramp from `from` to `to` takes, in ms (rounded up).
pub fn ramp_ms(from: u64, to: u64, refill: u64, period_ms: u64) -> u64 {
    if to <= from || refill == 0 {
        return 0;
    }
    let gap = (to - from) as u128 * period_ms as u128;
    gap.div_ceil(refill as u128).min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_raise_grows_at_the_refill_rate() {
        // 10 -> 70 tokens, refilling 70 a second: 60 tokens take 857.1 ms.
        assert_eq!(ramped_capacity(10, 70, 70, 1000, 0), 10);
        assert_eq!(ramped_capacity(10, 70, 70, 1000, 500), 45);
        assert_eq!(ramped_capacity(10, 70, 70, 1000, 857), 69);
        assert_eq!(ramped_capacity(10, 70, 70, 1000, 858), 70);
        assert_eq!(ramp_ms(10, 70, 70, 1000), 858);
        assert_eq!(ramped_capacity(70, 10, 10, 1000, 0), 10, "a lowering applies at once");
    }

    proptest! {
        /// Between any two moments the capacity grows by at most what the
        /// refill adds (plus one token of rounding): a missing key never
        /// holds more than a kept one could have refilled to.
        #[test]
        fn capacity_grows_no_faster_than_the_refill(
            from in 1u64..1_000_000, to in 1u64..1_000_000, refill in 1u64..1_000_000,
            period_ms in 1u64..100_000, a in 0u64..1_000_000, b in 0u64..1_000_000,
        ) {
            let (t1, t2) = (a.min(b), a.max(b));
            let c1 = ramped_capacity(from, to, refill, period_ms, t1);
            let c2 = ramped_capacity(from, to, refill, period_ms, t2);
            prop_assert!(c2 >= c1);
            let refilled = refill as u128 * (t2 - t1) as u128 / period_ms as u128;
            prop_assert!((c2 - c1) as u128 <= refilled + 1);
            prop_assert!(c1 >= from.min(to) && c2 <= to.max(from.min(to)));
            prop_assert_eq!(ramped_capacity(from, to, refill, period_ms, ramp_ms(from, to, refill, period_ms)), to);
        }
    }
}
