//! Exactness over millions of calls with an explicit clock: a bucket admits
//! exactly `capacity + refill * elapsed / period_ms` tokens under saturating
//! demand, and never more under any demand or clock.

use proptest::prelude::*;
use rl_core::{acquire, BucketOutcome, BucketParams, BucketState, BucketUpdate};

/// Applies an outcome's writes, as the module does to its keys.
fn apply(states: &mut [Option<BucketState>], out: &BucketOutcome) {
    for (s, u) in states.iter_mut().zip(&out.updates) {
        *s = match u {
            BucketUpdate::Store { state, .. } => Some(*state),
            BucketUpdate::Remove => None,
        };
    }
}

/// Calls with `cost` until refused; returns the tokens admitted.
fn drain(b: &[BucketParams], s: &mut [Option<BucketState>], cost: u64, now: u64) -> u64 {
    let mut admitted = 0;
    loop {
        let out = acquire(b, s, cost, cost, now);
        apply(s, &out);
        if !out.decision.allowed() {
            return admitted;
        }
        admitted += out.decision.granted;
    }
}

/// floor(capacity + refill * elapsed / period), the exact bound.
fn bound(b: &BucketParams, elapsed: u64) -> u64 {
    b.capacity() + ((b.refill() as u128 * elapsed as u128) / b.period_ms() as u128) as u64
}

#[test]
fn five_million_calls_admit_exactly_the_bound() {
    // 100/s with bursts of 200, drained every millisecond for 50,000 s of
    // simulated time: about five million admitted calls.
    let b = [BucketParams::new(200, 100, 1000).unwrap()];
    let mut s = [None];
    let start = 1_700_000_000_000;
    let mut admitted = 0;
    let mut now = start;
    while now <= start + 50_000_000 {
        admitted += drain(&b, &mut s, 1, now);
        assert_eq!(admitted, bound(&b[0], now - start));
        now += 7; // an awkward step: accrual is 0.7 tokens per call
    }
    assert!(admitted > 5_000_000, "admitted {admitted}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Saturating demand: equality with the bound after every instant, as
    /// long as the steps are short enough that the bucket never fills (a
    /// full bucket drops refill, which the bound does not subtract).
    #[test]
    fn saturating_demand_admits_exactly_the_bound(
        capacity in 2u64..500,
        refill in 1u64..5_000,
        period in 1u64..100_000,
        steps in proptest::collection::vec(0u64..1_000_000, 1..400),
        start in 0u64..2_000_000_000_000,
    ) {
        let b = [BucketParams::new(capacity, refill, period).unwrap()];
        let max_step = (capacity - 1) * period / refill;
        let mut s = [None];
        let mut now = start;
        let mut admitted = drain(&b, &mut s, 1, now);
        prop_assert_eq!(admitted, capacity);
        for step in steps {
            now += step % (max_step + 1);
            admitted += drain(&b, &mut s, 1, now);
            prop_assert_eq!(admitted, bound(&b[0], now - start));
        }
    }

    /// Any demand, any cost, several buckets, a clock that may step back:
    /// no bucket ever admits more than its bound over the forward time, and
    /// under saturating single-token demand nothing is lost to backward steps.
    #[test]
    fn never_above_the_bound(
        specs in proptest::collection::vec((1u64..50, 1u64..100, 1u64..10_000), 1..4),
        calls in proptest::collection::vec((-2_000i64..20_000, 1u64..4), 1..300),
    ) {
        let b: Vec<BucketParams> =
            specs.iter().map(|&(c, r, p)| BucketParams::new(c, r, p).unwrap()).collect();
        let mut s = vec![None; b.len()];
        let mut now: u64 = 1_000_000;
        let mut forward = 0u64;
        let mut admitted = 0u64;
        for (step, cost) in calls {
            let next = now.saturating_add_signed(step);
            forward += next.saturating_sub(now);
            now = next;
            let out = acquire(&b, &s, cost, cost, now);
            if out.decision.allowed() {
                admitted += cost;
            }
            // A refusal may re-stamp a state from the future: the module
            // writes whatever the outcome carries.
            apply(&mut s, &out);
            for p in &b {
                prop_assert!(admitted <= bound(p, forward), "admitted {} > bound {}", admitted, bound(p, forward));
            }
        }
    }

    /// A clock that steps backwards neither mints nor loses tokens: a
    /// reading earlier than the last write counts as no time passed. Under
    /// saturating demand the admitted total stays between the bound over
    /// the forward time minus the spans walked back (time the clock covered
    /// twice) and the bound over all the forward time.
    #[test]
    fn backward_steps_neither_mint_nor_lose(
        capacity in 2u64..100,
        refill in 1u64..100,
        period in 1u64..1_000,
        steps in proptest::collection::vec(-5_000i64..5_000, 1..300),
    ) {
        let b = [BucketParams::new(capacity, refill, period).unwrap()];
        let max_step = ((capacity - 1) * period / refill) as i64;
        let mut s = [None];
        let mut now: u64 = 10_000_000;
        let (mut forward, mut back) = (0u64, 0u64);
        let mut admitted = drain(&b, &mut s, 1, now);
        for step in steps {
            let step = step.min(max_step);
            let next = now.saturating_add_signed(step);
            forward += next.saturating_sub(now);
            back += now.saturating_sub(next);
            now = next;
            if let Some(saved) = s[0] {
                if now < saved.updated_ms {
                    // Read before the last write: exactly the saved level.
                    let saved_level = b[0].level_at(Some(&saved), saved.updated_ms);
                    prop_assert_eq!(b[0].level_at(Some(&saved), now), saved_level);
                }
            }
            admitted += drain(&b, &mut s, 1, now);
            prop_assert!(admitted <= bound(&b[0], forward));
            prop_assert!(admitted >= bound(&b[0], forward.saturating_sub(back)));
        }
    }
}
