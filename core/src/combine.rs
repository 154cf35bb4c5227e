//! Several limits decided together: all of them admit, or none does.
//!
//! Every kind of limit (bucket, window, log) reports a `Check` for a cost;
//! `decide` turns the checks of one call into the six-field `Reply`, the
//! same way for every kind.

use smallvec::SmallVec;

/// Inline room for the common case; more limits spill to the heap.
pub const INLINE: usize = 4;

/// What to write back for one limit: its new state (or, for an EXACT log,
/// the admission to apply) and when the key expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Update<S> {
    /// Save this; the key expires when its state is worth nothing.
    Store { state: S, expires_at_ms: u64 },
    /// The limit is back to "nothing stored" (a full bucket): no key.
    Remove,
}

/// A decision and, when it was granted, the writes that carry it out (one
/// per limit, in order). A refusal writes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome<S> {
    pub decision: Reply,
    pub updates: SmallVec<[Update<S>; INLINE]>,
    /// After a refusal, for each limit, when its state as it is now becomes
    /// the same as no key: a stored key must not expire earlier. (Empty
    /// when granted: the writes carry the expiries.)
    pub keep_until_ms: SmallVec<[u64; INLINE]>,
}

impl<S> Outcome<S> {
    /// The outcome of `checks` for `cost`: `update(i)` gives limit i's write
    /// when every limit admits it; a refusal keeps each key until its
    /// current state resets.
    pub fn of(checks: &[Check], cost: u64, now_ms: u64, update: impl FnMut(usize) -> Update<S>) -> Self {
        let decision = decide(checks, cost);
        if decision.allowed() {
            Outcome { decision, updates: (0..checks.len()).map(update).collect(), keep_until_ms: SmallVec::new() }
        } else {
            Outcome { decision, updates: SmallVec::new(), keep_until_ms: keep_until(checks, now_ms) }
        }
    }
}

/// When each limit, as it is now, resets: how long a key must live.
pub fn keep_until(checks: &[Check], now_ms: u64) -> SmallVec<[u64; INLINE]> {
    checks.iter().map(|c| now_ms + c.reset_now_ms).collect()
}

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
