//! Several buckets decided together: all of them give, or none does.
//!
//! RL.TAKE is `acquire(want = cost, min = cost)`; a lease is `acquire(want,
//! min)`. The decision is computed from the levels at one instant, so the
//! result is the same as if the buckets were one.

use smallvec::SmallVec;

use crate::bucket::{BucketParams, BucketState};
use crate::limits::MAX_WAIT_MS;

/// Inline room for the common case; more buckets spill to the heap.
pub const INLINE: usize = 4;

/// The answer to a call, as the six-integer reply carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Tokens taken from every bucket: 0 when refused.
    pub granted: u64,
    /// Whole tokens left in the binding bucket (never negative).
    pub remaining: u64,
    /// 0 when granted; otherwise ms (rounded up) until every bucket holds
    /// the minimum; -1 when the minimum exceeds some bucket's capacity.
    pub retry_after_ms: i64,
    /// Ms (rounded up) until every bucket is full again.
    pub reset_after_ms: u64,
    /// Capacity of the binding bucket.
    pub limit: u64,
    /// Index of the bucket that refused (the one with the longest wait) or,
    /// when granted, of the one with the fewest whole tokens left. Ties go to
    /// the lower index.
    pub binding: usize,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        self.granted > 0
    }
}

/// What to write back for one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Update {
    /// Save this state; the key expires when the bucket would be full.
    Store { state: BucketState, expires_at_ms: u64 },
    /// The bucket is full: a full bucket and a missing one are the same.
    Remove,
}

/// A decision and, when tokens were granted, the writes that carry it out
/// (one per bucket, in order). A refusal writes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    pub updates: SmallVec<[Update; INLINE]>,
}

/// Takes as many tokens as every bucket can give, up to `want`, from every
/// bucket; or nothing when fewer than `min` are available (1 <= min <= want).
pub fn acquire(
    buckets: &[BucketParams],
    states: &[Option<BucketState>],
    want: u64,
    min: u64,
    now_ms: u64,
) -> Outcome {
    debug_assert_eq!(buckets.len(), states.len());
    debug_assert!(!buckets.is_empty() && 1 <= min && min <= want);
    let levels: SmallVec<[i128; INLINE]> = buckets
        .iter()
        .zip(states)
        .map(|(b, s)| b.level_at(s.as_ref(), now_ms))
        .collect();
    let available = buckets
        .iter()
        .zip(&levels)
        .map(|(b, &l)| b.whole_tokens(l))
        .min()
        .unwrap_or(0);
    let granted = available.clamp(0, want as i128) as u64;
    if granted < min {
        return Outcome { decision: refusal(buckets, &levels, min), updates: SmallVec::new() };
    }
    let after: SmallVec<[i128; INLINE]> =
        buckets.iter().zip(&levels).map(|(b, &l)| l - b.units(granted)).collect();
    let decision = Decision { granted, retry_after_ms: 0, ..standing(buckets, &after) };
    Outcome { decision, updates: updates(buckets, &after, now_ms) }
}

/// The decision `acquire` would make, without the writes.
pub fn peek(
    buckets: &[BucketParams],
    states: &[Option<BucketState>],
    want: u64,
    min: u64,
    now_ms: u64,
) -> Decision {
    acquire(buckets, states, want, min, now_ms).decision
}

/// The writes that record `levels` at `now_ms`.
pub fn updates(
    buckets: &[BucketParams],
    levels: &[i128],
    now_ms: u64,
) -> SmallVec<[Update; INLINE]> {
    buckets
        .iter()
        .zip(levels)
        .map(|(b, &level)| {
            let missing = b.full_units() - level;
            if missing <= 0 {
                Update::Remove
            } else {
                Update::Store {
                    state: BucketState::from_units(b, level, now_ms),
                    expires_at_ms: now_ms + b.wait_ms(missing),
                }
            }
        })
        .collect()
}

/// Remaining, limit, binding and reset for buckets at `levels`: the binding
/// bucket is the one with the fewest whole tokens.
fn standing(buckets: &[BucketParams], levels: &[i128]) -> Decision {
    let mut binding = 0;
    let mut fewest = i128::MAX;
    let mut reset = 0;
    for (i, (b, &l)) in buckets.iter().zip(levels).enumerate() {
        let whole = b.whole_tokens(l);
        if whole < fewest {
            fewest = whole;
            binding = i;
        }
        reset = reset.max(b.wait_ms(b.full_units() - l));
    }
    Decision {
        granted: 0,
        remaining: fewest.max(0) as u64,
        retry_after_ms: 0,
        reset_after_ms: reset,
        limit: buckets[binding].capacity(),
        binding,
    }
}

/// The decision for a refusal: binding is the bucket that makes the caller
/// wait longest for `min` tokens (a bucket too small for them, first).
fn refusal(buckets: &[BucketParams], levels: &[i128], min: u64) -> Decision {
    let mut binding = 0;
    let mut longest: i64 = 0;
    for (i, (b, &l)) in buckets.iter().zip(levels).enumerate() {
        let wait = if min > b.capacity() {
            -1
        } else {
            b.wait_ms(b.units(min) - l) as i64
        };
        let worse = match (wait, longest) {
            (_, -1) => false,
            (-1, _) => true,
            _ => wait > longest,
        };
        if worse {
            longest = wait;
            binding = i;
        }
    }
    let b = &buckets[binding];
    let reset = buckets
        .iter()
        .zip(levels)
        .map(|(b, &l)| b.wait_ms(b.full_units() - l))
        .max()
        .unwrap_or(0);
    Decision {
        granted: 0,
        remaining: b.whole_tokens(levels[binding]).max(0) as u64,
        retry_after_ms: longest.min(MAX_WAIT_MS as i64),
        reset_after_ms: reset,
        limit: b.capacity(),
        binding,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(c: u64, r: u64, ms: u64) -> BucketParams {
        BucketParams::new(c, r, ms).unwrap()
    }

    fn apply(states: &mut [Option<BucketState>], out: &Outcome) {
        for (s, u) in states.iter_mut().zip(&out.updates) {
            *s = match u {
                Update::Store { state, .. } => Some(*state),
                Update::Remove => None,
            };
        }
    }

    #[test]
    fn new_bucket_starts_full_and_counts_down() {
        let b = [p(3, 1, 1000)];
        let mut s = [None];
        for left in [2, 1, 0] {
            let out = acquire(&b, &s, 1, 1, 0);
            assert_eq!(out.decision.granted, 1);
            assert_eq!(out.decision.remaining, left);
            assert_eq!(out.decision.limit, 3);
            apply(&mut s, &out);
        }
        let out = acquire(&b, &s, 1, 1, 0);
        assert_eq!(
            out.decision,
            Decision {
                granted: 0,
                remaining: 0,
                retry_after_ms: 1000,
                reset_after_ms: 3000,
                limit: 3,
                binding: 0
            }
        );
        assert!(out.updates.is_empty());
    }

    #[test]
    fn ttl_is_time_to_full() {
        let b = [p(10, 2, 1000)]; // a token every 500 ms
        let out = acquire(&b, &[None], 3, 3, 7_000);
        assert_eq!(out.decision.reset_after_ms, 1500);
        match out.updates[0] {
            Update::Store { state, expires_at_ms } => {
                assert_eq!(expires_at_ms, 8_500);
                assert_eq!((state.tokens, state.fraction, state.updated_ms), (7, 0, 7_000));
            }
            Update::Remove => panic!("a debited bucket is not full"),
        }
    }

    #[test]
    fn all_or_nothing_across_buckets() {
        let b = [p(10, 10, 1000), p(2, 1, 60_000)];
        let mut s = [None, None];
        for _ in 0..2 {
            let out = acquire(&b, &s, 1, 1, 0);
            assert!(out.decision.allowed());
            apply(&mut s, &out);
        }
        let out = acquire(&b, &s, 1, 1, 0);
        assert!(!out.decision.allowed());
        assert_eq!(out.decision.binding, 1);
        assert_eq!(out.decision.limit, 2);
        assert_eq!(out.decision.retry_after_ms, 60_000);
        // The first bucket lost nothing to the refusal.
        assert_eq!(b[0].whole_tokens(b[0].level_at(s[0].as_ref(), 0)), 8);
    }

    #[test]
    fn binding_when_allowed_is_the_fewest_left() {
        let b = [p(100, 1, 1000), p(5, 1, 1000), p(5, 1, 1000)];
        let out = acquire(&b, &[None, None, None], 2, 2, 0);
        assert_eq!((out.decision.binding, out.decision.remaining, out.decision.limit), (1, 3, 5));
        assert_eq!(out.decision.reset_after_ms, 2000);
    }

    #[test]
    fn cost_above_capacity_never_succeeds() {
        let b = [p(100, 1, 1000), p(5, 1, 1000)];
        let d = acquire(&b, &[None, None], 6, 6, 0).decision;
        assert_eq!((d.granted, d.retry_after_ms, d.binding, d.limit), (0, -1, 1, 5));
    }

    #[test]
    fn retry_is_the_longest_wait() {
        // Bucket 0 lacks 1 token at 1/ms, bucket 1 lacks 1 token at 1/s.
        let b = [p(1, 1, 1), p(1, 1, 1000)];
        let s = [
            Some(BucketState { tokens: 0, fraction: 0, updated_ms: 0 }),
            Some(BucketState { tokens: 0, fraction: 0, updated_ms: 0 }),
        ];
        let d = peek(&b, &s, 1, 1, 0);
        assert_eq!((d.retry_after_ms, d.binding), (1000, 1));
    }

    #[test]
    fn lease_grants_what_is_there() {
        let b = [p(10, 1, 1000)];
        let s = [Some(BucketState { tokens: 4, fraction: 0, updated_ms: 0 })];
        let d = peek(&b, &s, 8, 1, 0);
        assert_eq!((d.granted, d.remaining), (4, 0));
        let d = peek(&b, &s, 8, 5, 0);
        assert_eq!((d.granted, d.retry_after_ms), (0, 1000));
    }

    #[test]
    fn debt_is_paid_back_before_anything_is_admitted() {
        let b = [p(10, 1, 1000)];
        let s = [Some(BucketState { tokens: -3, fraction: 0, updated_ms: 0 })];
        let d = peek(&b, &s, 1, 1, 0);
        assert_eq!((d.granted, d.remaining, d.retry_after_ms, d.reset_after_ms), (0, 0, 4000, 13000));
        assert!(peek(&b, &s, 1, 1, 4000).allowed());
    }

    #[test]
    fn full_level_is_removed() {
        let b = [p(10, 1, 1000)];
        assert_eq!(updates(&b, &[b[0].full_units()], 0)[0], Update::Remove);
    }
}
