//! A refusal remembered, pure: refused again from memory until the retry
//! time Redis named (or a longer hold), for costs as large or larger. Only
//! refusals are remembered, so a holder of one can never admit anything:
//! under, never over. rl-client's deny cache, the relay and the scale model
//! keep these; their maps and replies are theirs.
//!
//! The hold a holder passes is its share of the rule's refill of the cost
//! ([`crate::lease::share_ms`]): a subject refused everywhere then costs
//! about one call per token of refill, not one per holder per retry time.

/// A refusal of `cost` tokens, held until `until_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denial {
    pub cost: u64,
    pub until_ms: u64,
}

impl Denial {
    /// A refusal of `cost` at `now_ms` that named `retry_ms`, held that long
    /// or `hold_ms`, whichever is longer. None without a retry time (a
    /// refusal that names none, or an admission): nothing to remember.
    pub fn new(cost: u64, retry_ms: u64, hold_ms: u64, now_ms: u64) -> Option<Denial> {
        (retry_ms > 0).then(|| Denial { cost, until_ms: now_ms.saturating_add(retry_ms.max(hold_ms)) })
    }

    /// Whether it refuses a request for `cost` at `now_ms`: until the retry
    /// time, costs as large or larger (a smaller one may fit).
    pub fn refuses(&self, cost: u64, now_ms: u64) -> bool {
        now_ms < self.until_ms && cost >= self.cost
    }

    /// The wait a refusal from it names at `now_ms`.
    pub fn retry_after_ms(&self, now_ms: u64) -> u64 {
        self.until_ms.saturating_sub(now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_until_the_retry_time_then_not() {
        let d = Denial::new(1, 120, 0, 1000).unwrap();
        assert!(d.refuses(1, 1050));
        assert_eq!(d.retry_after_ms(1050), 70);
        assert!(!d.refuses(1, 1120));
    }

    #[test]
    fn a_refused_cost_refuses_larger_costs_only() {
        let d = Denial::new(5, 100, 0, 0).unwrap();
        assert!(d.refuses(5, 10) && d.refuses(9, 10));
        assert!(!d.refuses(4, 10));
    }

    #[test]
    fn held_at_least_the_hold_and_only_with_a_retry_time() {
        let d = Denial::new(1, 1, 3000, 0).unwrap();
        assert!(d.refuses(1, 2999) && !d.refuses(1, 3000));
        assert_eq!(Denial::new(1, 0, 3000, 0), None);
        assert_eq!(Denial::new(1, u64::MAX, 0, 5).unwrap().until_ms, u64::MAX, "saturates");
    }
}
