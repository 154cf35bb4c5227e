//! Several limits decided together: all of them admit, or none does.
//!
//! Every kind of limit (bucket, window, log) reports a `Check` for a cost;
//! `decide` turns the checks of one call into the six-field `Reply`, the
//! same way for every kind.

/// The answer to a call, as the six-integer reply carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Units taken from every limit: 0 when refused.
    pub granted: u64,
    /// Whole units left in the binding limit (never negative).
    pub remaining: u64,
    /// 0 when granted; otherwise ms (rounded up) until every limit would
    /// admit the cost; -1 when the cost exceeds some limit's capacity.
    pub retry_after_ms: i64,
    /// Ms (rounded up) until every limit is back to its full allowance.
    pub reset_after_ms: u64,
    /// Capacity of the binding limit.
    pub limit: u64,
    /// Index of the limit that refused (the one with the longest wait) or,
    /// when granted, of the one with the fewest units left. Ties go to the
    /// lower index.
    pub binding: usize,
}

impl Reply {
    pub fn allowed(&self) -> bool {
        self.granted > 0
    }
}

/// Wait value meaning "never": the cost exceeds the limit's capacity.
pub const NEVER: i64 = -1;

/// One limit's view of one cost. `decide` reads the `_after` fields when
/// every limit admits, the `_now` fields and `wait_ms` when one refuses: a
/// limit may leave the other side at its default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Check {
    /// Whether this limit alone would admit the cost now.
    pub admits: bool,
    /// Capacity (limit) of this limit.
    pub limit: u64,
    /// Whole units available now, and after taking the cost (if it admits).
    pub remaining_now: u64,
    pub remaining_after: u64,
    /// Ms until this limit would admit the cost (0 if it does now, NEVER).
    pub wait_ms: i64,
    /// Ms until fully reset, as things are now, and after taking the cost.
    pub reset_now_ms: u64,
    pub reset_after_ms: u64,
}

/// The decision for `cost` given every limit's check.
pub fn decide(checks: &[Check], cost: u64) -> Reply {
    debug_assert!(!checks.is_empty());
    if checks.iter().all(|c| c.admits) {
        let mut binding = 0;
        for (i, c) in checks.iter().enumerate() {
            if c.remaining_after < checks[binding].remaining_after {
                binding = i;
            }
        }
        let b = &checks[binding];
        return Reply {
            granted: cost,
            remaining: b.remaining_after,
            retry_after_ms: 0,
            reset_after_ms: checks.iter().map(|c| c.reset_after_ms).max().unwrap_or(0),
            limit: b.limit,
            binding,
        };
    }
    let mut binding = 0;
    for (i, c) in checks.iter().enumerate() {
        if longer(c.wait_ms, checks[binding].wait_ms) {
            binding = i;
        }
    }
    let b = &checks[binding];
    Reply {
        granted: 0,
        remaining: b.remaining_now,
        retry_after_ms: b.wait_ms,
        reset_after_ms: checks.iter().map(|c| c.reset_now_ms).max().unwrap_or(0),
        limit: b.limit,
        binding,
    }
}

/// Whether wait `a` is strictly longer than `b`, NEVER being the longest.
fn longer(a: i64, b: i64) -> bool {
    match (a, b) {
        (_, NEVER) => false,
        (NEVER, _) => true,
        _ => a > b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(admits: bool, now: u64, after: u64, wait: i64) -> Check {
        Check {
            admits,
            limit: 10,
            remaining_now: now,
            remaining_after: after,
            wait_ms: wait,
            reset_now_ms: 100,
            reset_after_ms: 200,
        }
    }

    #[test]
    fn allowed_binds_to_the_fewest_left_first_on_ties() {
        let d = decide(&[check(true, 5, 4, 0), check(true, 3, 2, 0), check(true, 3, 2, 0)], 1);
        assert_eq!((d.granted, d.binding, d.remaining, d.reset_after_ms), (1, 1, 2, 200));
    }

    #[test]
    fn refused_binds_to_the_longest_wait_never_first() {
        let d = decide(&[check(false, 0, 0, 50), check(true, 3, 2, 0), check(false, 1, 0, 70)], 2);
        assert_eq!((d.granted, d.binding, d.retry_after_ms, d.remaining, d.reset_after_ms), (0, 2, 70, 1, 100));
        let d = decide(&[check(false, 0, 0, 50), check(false, 9, 0, NEVER), check(false, 1, 0, 70)], 2);
        assert_eq!((d.binding, d.retry_after_ms), (1, NEVER));
    }
}
