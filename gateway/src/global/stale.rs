//! Without a balancer: what a gateway enforces as its share table ages,
//! and what the balancer may assume a region it cannot reach still holds.
//!
//! A gateway keeps the last shares it was given for `stale_after` (5
//! minutes by default), so a balancer restart changes nothing. Then it
//! falls back to the fixed split in two steps, lower first as in any
//! change: for `settle` it enforces the smaller of its last share and the
//! fixed one, then the fixed one. Every region's table stops at about the
//! same moment when the balancer dies, so `settle` (longer than the spread
//! of the regions' last writes plus a gateway's sync) keeps the sum within
//! the whole while regions switch one after another.

use std::time::Duration;

/// The share a gateway enforces with a table `age` old: its `last` share,
/// then `min(last, fixed)` for `settle`, then the `fixed` split.
pub fn share_in_force(last: u32, fixed: u32, age: Duration, stale_after: Duration, settle: Duration) -> u32 {
    if age < stale_after {
        last
    } else if age < stale_after + settle {
        last.min(fixed)
    } else {
        fixed
    }
}

/// The most a region may still enforce when the balancer last wrote to
/// it `since` ago (a write that may or may not have landed counts as
/// landed): `last` until its gateways fall back, then its `fixed` split.
/// `lag` covers the gateways' sync and the write's own timeout. A region
/// the balancer cannot reach might be cut off rather than dead, so this,
/// not 0, is what the other regions must leave it.
pub fn held_by_unreachable(
    last: u32,
    fixed: u32,
    since: Duration,
    stale_after: Duration,
    settle: Duration,
    lag: Duration,
) -> u32 {
    if since < stale_after + settle + lag {
        last.max(fixed)
    } else {
        fixed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(300);
    const SETTLE: Duration = Duration::from_secs(10);

    #[test]
    fn the_table_ages_into_the_fixed_split() {
        let at = |secs| share_in_force(700, 333, Duration::from_secs(secs), S, SETTLE);
        assert_eq!((at(0), at(299), at(300), at(309), at(310)), (700, 700, 333, 333, 333));
        let up = |secs| share_in_force(50, 333, Duration::from_secs(secs), S, SETTLE);
        assert_eq!((up(299), up(300), up(309), up(310)), (50, 50, 50, 333), "a raise waits for settle");
    }

    proptest! {
        /// Regions whose tables stopped at moments up to `settle` apart,
        /// with last shares summing to at most the whole, and a fixed split
        /// summing to at most the whole: at no moment does the sum pass it.
        #[test]
        fn falling_back_never_sums_above_the_whole(
            regions in proptest::collection::vec((0u32..=1_000_000, 0u32..=1_000_000, 0u64..10_000), 1..5),
            now_ms in 0u64..400_000,
        ) {
            let sum_last: u64 = regions.iter().map(|r| r.0 as u64).sum();
            let sum_fixed: u64 = regions.iter().map(|r| r.1 as u64).sum();
            prop_assume!(sum_last <= 1_000_000 && sum_fixed <= 1_000_000);
            let total: u64 = regions.iter().map(|&(last, fixed, stopped_ms)| {
                let age = Duration::from_millis(now_ms.saturating_sub(stopped_ms));
                share_in_force(last, fixed, age, S, SETTLE) as u64
            }).sum();
            prop_assert!(total <= 1_000_000);
        }

        /// What the balancer assumes is never less than what the region's
        /// gateways enforce, whenever they last heard from it within `lag`.
        #[test]
        fn the_balancer_never_assumes_less_than_is_enforced(
            last in 0u32..=1_000_000, fixed in 0u32..=1_000_000,
            since_ms in 0u64..400_000, heard_later_ms in 0u64..2_000,
        ) {
            let lag = Duration::from_secs(2);
            let since = Duration::from_millis(since_ms);
            let age = since.saturating_sub(Duration::from_millis(heard_later_ms));
            prop_assert!(held_by_unreachable(last, fixed, since, S, SETTLE, lag) >= share_in_force(last, fixed, age, S, SETTLE));
        }
    }
}
