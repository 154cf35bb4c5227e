//! CL.THROTTLE's GCRA against an independent model: the continuous-state
//! leaky bucket of ITU-T I.371, which keeps a backlog X (ns of work ahead of
//! schedule) and the last conformance time, instead of a TAT.

use proptest::prelude::*;
use rl_core::gcra::{throttle, GcraParams};

struct LeakyBucket {
    emission_ns: i64,
    tolerance_ns: i64,
    /// Backlog as of the last conforming request; None for a new key.
    state: Option<(i64, i64)>,
}

impl LeakyBucket {
    /// Returns (conforming, remaining, retry_ns or None, reset_ns).
    fn offer(&mut self, now: i64, quantity: i64) -> (bool, i64, Option<i64>, i64) {
        // Backlog left now (negative once the schedule is in the past).
        let backlog = self.state.map_or(0, |(b, last)| b - (now - last));
        let drained = backlog.max(0);
        let increment = self.emission_ns * quantity;
        if drained + increment <= self.tolerance_ns {
            if quantity > 0 {
                self.state = Some((drained + increment, now));
            }
            let left = self.tolerance_ns - (drained + increment);
            (true, left / self.emission_ns, None, drained + increment)
        } else {
            let retry = (increment <= self.tolerance_ns).then_some(drained + increment - self.tolerance_ns);
            // A schedule in the past is an empty backlog: nothing to reset,
            // the whole limit remaining. (redis-cell reports the backlog
            // unclamped there: a negative reset, a remaining above the
            // limit. CL.THROTTLE does not.)
            let left = self.tolerance_ns - drained;
            let remaining = if left > -self.emission_ns { left / self.emission_ns } else { 0 };
            (false, remaining, retry, drained)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Emission intervals that are whole microseconds and clock readings in
    /// whole microseconds (what the server clock gives): then redis-cell's
    /// float steps are exact and both must agree on everything.
    #[test]
    fn gcra_matches_the_leaky_bucket(
        max_burst in 0i64..20,
        per_us in 1i64..5_000_000,
        steps in proptest::collection::vec((0i64..3_000_000, 0i64..5), 1..200),
    ) {
        // count requests per period with period*1e6/count = per_us exactly.
        let (count, period_s) = (1_000_000, per_us);
        let p = GcraParams::new(max_burst, count, period_s).unwrap();
        let emission_ns = per_us * 1_000;
        let mut model = LeakyBucket {
            emission_ns,
            tolerance_ns: emission_ns * (max_burst + 1),
            state: None,
        };
        let mut tat = None;
        let mut now = 1_700_000_000_000_000_000i64;
        for (step_us, quantity) in steps {
            now += step_us * 1_000;
            let r = throttle(&p, tat, now, quantity).unwrap();
            let (ok, remaining, retry, reset) = model.offer(now, quantity);
            prop_assert_eq!(!r.limited, ok);
            prop_assert_eq!(r.limit, max_burst + 1);
            prop_assert_eq!(r.remaining, remaining.max(0));
            prop_assert_eq!(r.retry_after_ns, retry.unwrap_or(-1_000_000_000));
            prop_assert_eq!(r.reset_after_ns, reset);
            if let Some(t) = r.new_tat_ns {
                tat = Some(t);
            }
        }
    }
}
