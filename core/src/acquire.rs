//! Token buckets decided together: all of them give, or none does.
//!
//! RL.TAKE is `acquire(want = cost, min = cost)`; a lease is `acquire(want,
//! min)`. `force` debits even into debt (a cost settled higher after the
//! response) and `refund` gives unused tokens back. Each works from the
//! levels at one instant, so several buckets behave as one.

use smallvec::SmallVec;

use crate::bucket::{BucketParams, BucketState};
use crate::combine::{decide, keep_until, Check, Reply, INLINE, NEVER};
use crate::limits::{in_range, ParamError, MAX_TOKENS};

/// What a call does to its buckets: the one definition the module's
/// commands, the client's calls and its Lua backend share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BucketOp {
    /// RL.TAKE: `cost` from every bucket, all or nothing.
    Take { cost: u64 },
    /// RL.PEEK: the answer `Take` would give, changing nothing.
    Peek { cost: u64 },
    /// RL.TAKE ... FORCE: `cost` from every bucket even into debt.
    Force { cost: u64 },
    /// RL.LEASE: as many as every bucket can give up to `want`; nothing
    /// below `min`.
    Lease { want: u64, min: u64 },
    /// RL.REFUND: `tokens` back to every bucket, never above capacity.
    Refund { tokens: u64 },
}

impl BucketOp {
    /// The operation if its amounts are in range (1 to MAX_TOKENS; a
    /// lease's `min` from 1 to `want`).
    pub fn validate(self) -> Result<Self, ParamError> {
        match self {
            BucketOp::Take { cost } | BucketOp::Peek { cost } | BucketOp::Force { cost } => {
                in_range("cost", cost, 1, MAX_TOKENS)?;
            }
            BucketOp::Lease { want, min } => {
                in_range("want", want, 1, MAX_TOKENS)?;
                in_range("min", min, 1, want)?;
            }
            BucketOp::Refund { tokens } => {
                in_range("tokens", tokens, 1, MAX_TOKENS)?;
            }
        }
        Ok(self)
    }

    /// Whether the operation may change the buckets (all but Peek).
    pub fn writes(self) -> bool {
        !matches!(self, BucketOp::Peek { .. })
    }

    /// The decision at `now_ms` and the writes that carry it out (none for
    /// Peek or a refusal). Amounts must have been validated.
    pub fn run(self, buckets: &[BucketParams], states: &[Option<BucketState>], now_ms: u64) -> BucketOutcome {
        match self {
            BucketOp::Take { cost } => acquire(buckets, states, cost, cost, now_ms),
            BucketOp::Peek { cost } => BucketOutcome {
                decision: peek(buckets, states, cost, cost, now_ms),
                updates: SmallVec::new(),
                keep_until_ms: SmallVec::new(),
            },
            BucketOp::Force { cost } => force(buckets, states, cost, now_ms),
            BucketOp::Lease { want, min } => acquire(buckets, states, want, min, now_ms),
            BucketOp::Refund { tokens } => refund(buckets, states, tokens, now_ms),
        }
    }
}

/// A bucket call's outcome: writes of whole states.
pub type BucketOutcome = crate::combine::Outcome<BucketState>;
/// What to write back for one bucket.
pub type BucketUpdate = crate::combine::Update<BucketState>;

type Levels = SmallVec<[i128; INLINE]>;

fn levels(buckets: &[BucketParams], states: &[Option<BucketState>], now_ms: u64) -> Levels {
    debug_assert_eq!(buckets.len(), states.len());
    buckets.iter().zip(states).map(|(b, s)| b.level_at(s.as_ref(), now_ms)).collect()
}

/// A bucket's standing at `level` and at `after`, the level once the call
/// is applied. `admits` and `wait_ms` are the caller's to set.
fn standing(b: &BucketParams, level: i128, after: i128) -> Check {
    let remaining = |l: i128| b.whole_tokens(l).max(0) as u64;
    Check {
        admits: true,
        limit: b.capacity(),
        remaining_now: remaining(level),
        remaining_after: remaining(after),
        wait_ms: 0,
        reset_now_ms: b.wait_ms(b.full_units() - level),
        reset_after_ms: b.wait_ms(b.full_units() - after),
    }
}

/// Each bucket's check of taking `cost` tokens. Divisions are most of a
/// decision's cost, so only the fields `decide` reads are computed: the
/// standing after the take when every bucket admits it, the standing now
/// and the waits when one refuses.
fn take_checks(buckets: &[BucketParams], levels: &[i128], cost: u64) -> SmallVec<[Check; INLINE]> {
    let all_admit = buckets.iter().zip(levels).all(|(b, &l)| l >= b.units(cost));
    let remaining = |b: &BucketParams, l: i128| b.whole_tokens(l).max(0) as u64;
    buckets
        .iter()
        .zip(levels)
        .map(|(b, &level)| {
            let need = b.units(cost);
            let blank = Check { admits: level >= need, limit: b.capacity(), ..Check::default() };
            if all_admit {
                let after = level - need;
                Check {
                    remaining_after: remaining(b, after),
                    reset_after_ms: b.wait_ms(b.full_units() - after),
                    ..blank
                }
            } else {
                Check {
                    remaining_now: remaining(b, level),
                    reset_now_ms: b.wait_ms(b.full_units() - level),
                    wait_ms: if cost > b.capacity() { NEVER } else { b.wait_ms(need - level) as i64 },
                    ..blank
                }
            }
        })
        .collect()
}

/// Takes as many tokens as every bucket can give, up to `want`, from every
/// bucket; or nothing when fewer than `min` are available (1 <= min <= want).
/// A refusal reports the wait for `min` tokens.
pub fn acquire(
    buckets: &[BucketParams],
    states: &[Option<BucketState>],
    want: u64,
    min: u64,
    now_ms: u64,
) -> BucketOutcome {
    let levels = levels(buckets, states, now_ms);
    let (decision, checks) = take_decision(buckets, &levels, want, min);
    if !decision.allowed() {
        if states.iter().flatten().any(|s| s.updated_ms > now_ms) {
            // Stamped ahead of the clock (it stepped back, or the state came
            // from a server whose clock ran ahead): no time would pass until
            // the clock caught up, freezing the limit. Re-stamp at now, the
            // level unchanged, so refill resumes from now; nothing minted.
            return BucketOutcome {
                decision,
                updates: updates(buckets, &levels, now_ms),
                keep_until_ms: SmallVec::new(),
            };
        }
        return BucketOutcome { decision, updates: SmallVec::new(), keep_until_ms: keep_until(&checks, now_ms) };
    }
    let after: Levels = buckets.iter().zip(&levels).map(|(b, &l)| l - b.units(decision.granted)).collect();
    BucketOutcome { decision, updates: updates(buckets, &after, now_ms), keep_until_ms: SmallVec::new() }
}

/// `acquire` on states kept in memory (a gateway's local buckets): the
/// states are updated in place, with no writes to describe.
pub fn acquire_in_place(
    buckets: &[BucketParams],
    states: &mut [Option<BucketState>],
    want: u64,
    min: u64,
    now_ms: u64,
) -> Reply {
    let levels = levels(buckets, states, now_ms);
    let (decision, _) = take_decision(buckets, &levels, want, min);
    if decision.allowed() {
        for ((b, state), &level) in buckets.iter().zip(states.iter_mut()).zip(&levels) {
            let after = level - b.units(decision.granted);
            *state = (after < b.full_units()).then(|| BucketState::from_units(b, after, now_ms));
        }
    }
    decision
}

/// The decision of taking up to `want` (at least `min`) from buckets at
/// `levels`, and each bucket's check.
fn take_decision(buckets: &[BucketParams], levels: &[i128], want: u64, min: u64) -> (Reply, SmallVec<[Check; INLINE]>) {
    debug_assert!(!buckets.is_empty() && 1 <= min && min <= want);
    // A take (want = min) is all or nothing: no need to count what is there.
    let cost = if want == min {
        want
    } else {
        let available = buckets.iter().zip(levels).map(|(b, &l)| b.whole_tokens(l)).min().unwrap_or(0);
        let granted = available.clamp(0, want as i128) as u64;
        if granted >= min {
            granted
        } else {
            min
        }
    };
    let checks = take_checks(buckets, levels, cost);
    (decide(&checks, cost), checks)
}

/// The decision `acquire` would make, without computing any write.
pub fn peek(buckets: &[BucketParams], states: &[Option<BucketState>], want: u64, min: u64, now_ms: u64) -> Reply {
    take_decision(buckets, &levels(buckets, states, now_ms), want, min).0
}

/// Takes `cost` from every bucket whatever they hold: a bucket may go into
/// debt (down to -MAX_TOKENS), which later refill pays back before anything
/// is admitted. Always granted.
pub fn force(buckets: &[BucketParams], states: &[Option<BucketState>], cost: u64, now_ms: u64) -> BucketOutcome {
    let floor = |b: &BucketParams| -b.units(BucketState::MIN_TOKENS.unsigned_abs());
    apply(buckets, states, cost, now_ms, |b, l| (l - b.units(cost)).max(floor(b)))
}

/// Gives `tokens` back to every bucket, never above capacity. Always granted.
pub fn refund(buckets: &[BucketParams], states: &[Option<BucketState>], tokens: u64, now_ms: u64) -> BucketOutcome {
    apply(buckets, states, tokens, now_ms, |b, l| (l + b.units(tokens)).min(b.full_units()))
}

/// Moves every bucket to `to(bucket, level)` unconditionally.
fn apply(
    buckets: &[BucketParams],
    states: &[Option<BucketState>],
    tokens: u64,
    now_ms: u64,
    to: impl Fn(&BucketParams, i128) -> i128,
) -> BucketOutcome {
    let levels = levels(buckets, states, now_ms);
    let after: Levels = buckets.iter().zip(&levels).map(|(b, &l)| to(b, l)).collect();
    let checks: SmallVec<[Check; INLINE]> =
        buckets.iter().zip(levels.iter().zip(&after)).map(|(b, (&l, &a))| standing(b, l, a)).collect();
    BucketOutcome {
        decision: decide(&checks, tokens),
        updates: updates(buckets, &after, now_ms),
        keep_until_ms: SmallVec::new(),
    }
}

/// The writes that record `levels` at `now_ms`.
pub fn updates(buckets: &[BucketParams], levels: &[i128], now_ms: u64) -> SmallVec<[BucketUpdate; INLINE]> {
    buckets
        .iter()
        .zip(levels)
        .map(|(b, &level)| {
            let missing = b.full_units() - level;
            if missing <= 0 {
                BucketUpdate::Remove
            } else {
                BucketUpdate::Store {
                    state: BucketState::from_units(b, level, now_ms),
                    expires_at_ms: now_ms + b.wait_ms(missing),
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(c: u64, r: u64, ms: u64) -> BucketParams {
        BucketParams::new(c, r, ms).unwrap()
    }

    fn apply_updates(states: &mut [Option<BucketState>], out: &BucketOutcome) {
        for (s, u) in states.iter_mut().zip(&out.updates) {
            *s = match u {
                BucketUpdate::Store { state, .. } => Some(*state),
                BucketUpdate::Remove => None,
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
            apply_updates(&mut s, &out);
        }
        let out = acquire(&b, &s, 1, 1, 0);
        assert_eq!(
            out.decision,
            Reply { granted: 0, remaining: 0, retry_after_ms: 1000, reset_after_ms: 3000, limit: 3, binding: 0 }
        );
        assert!(out.updates.is_empty());
    }

    #[test]
    fn ttl_is_time_to_full() {
        let b = [p(10, 2, 1000)]; // a token every 500 ms
        let out = acquire(&b, &[None], 3, 3, 7_000);
        assert_eq!(out.decision.reset_after_ms, 1500);
        match out.updates[0] {
            BucketUpdate::Store { state, expires_at_ms } => {
                assert_eq!(expires_at_ms, 8_500);
                assert_eq!((state.tokens, state.fraction, state.updated_ms), (7, 0, 7_000));
            }
            BucketUpdate::Remove => panic!("a debited bucket is not full"),
        }
    }

    #[test]
    fn all_or_nothing_across_buckets() {
        let b = [p(10, 10, 1000), p(2, 1, 60_000)];
        let mut s = [None, None];
        for _ in 0..2 {
            let out = acquire(&b, &s, 1, 1, 0);
            assert!(out.decision.allowed());
            apply_updates(&mut s, &out);
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
    fn in_place_matches_the_writes_of_acquire() {
        let b = [p(10, 1, 1000), p(3, 1, 60_000)];
        let mut written = [None, None];
        let mut in_place = [None, None];
        for (t, cost) in [(0, 1), (10, 2), (20, 1), (5_000, 1), (70_000, 3)] {
            let out = acquire(&b, &written, cost, cost, t);
            apply_updates(&mut written, &out);
            assert_eq!(acquire_in_place(&b, &mut in_place, cost, cost, t), out.decision);
            assert_eq!(in_place, written);
        }
    }

    #[test]
    fn refusal_says_how_long_the_state_must_live() {
        // Saved under 10 tokens a second, now 1 a second: empty, so it
        // must live 10 s, whatever TTL the old rate gave it.
        let b = [p(10, 1, 1000)];
        let s = [Some(BucketState { tokens: 0, fraction: 0, updated_ms: 0 })];
        let out = acquire(&b, &s, 10, 10, 0);
        assert!(!out.decision.allowed());
        assert_eq!(out.keep_until_ms[..], [10_000]);
    }

    #[test]
    fn operations_check_their_amounts() {
        assert_eq!(BucketOp::Take { cost: 0 }.validate().unwrap_err().field, "cost");
        assert_eq!(BucketOp::Refund { tokens: MAX_TOKENS + 1 }.validate().unwrap_err().field, "tokens");
        let e = BucketOp::Lease { want: 2, min: 3 }.validate().unwrap_err();
        assert_eq!(e.to_string(), "min must be an integer from 1 to 2, got 3");
        assert!(BucketOp::Lease { want: MAX_TOKENS, min: MAX_TOKENS }.validate().is_ok());
    }

    #[test]
    fn peek_decides_as_take_and_writes_nothing() {
        let b = [p(3, 1, 1000)];
        let s = [Some(BucketState { tokens: 1, fraction: 0, updated_ms: 0 })];
        for cost in [1, 2, 4] {
            let peeked = BucketOp::Peek { cost }.run(&b, &s, 500);
            let taken = BucketOp::Take { cost }.run(&b, &s, 500);
            assert_eq!(peeked.decision, taken.decision);
            assert!(peeked.updates.is_empty() && peeked.keep_until_ms.is_empty());
        }
    }

    #[test]
    fn a_refusal_re_stamps_a_state_from_the_future() {
        let b = [p(10, 1, 1000)];
        // Empty, stamped an hour ahead of the clock.
        let s = [Some(BucketState { tokens: 0, fraction: 0, updated_ms: 3_600_000 })];
        let out = acquire(&b, &s, 1, 1, 0);
        assert!(!out.decision.allowed());
        assert_eq!(out.decision.retry_after_ms, 1000, "the wait counts from now, not from the stamp");
        match out.updates[..] {
            [BucketUpdate::Store { state, expires_at_ms }] => {
                assert_eq!((state.tokens, state.fraction, state.updated_ms), (0, 0, 0), "level kept");
                assert_eq!(expires_at_ms, 10_000);
            }
            _ => panic!("a re-stamp is one store per bucket: {:?}", out.updates),
        }
        // A state stamped in the past is refused without a write.
        let s = [Some(BucketState { tokens: 0, fraction: 0, updated_ms: 0 })];
        assert!(acquire(&b, &s, 1, 1, 500).updates.is_empty());
    }

    #[test]
    fn full_level_is_removed() {
        let b = [p(10, 1, 1000)];
        assert_eq!(updates(&b, &[b[0].full_units()], 0)[0], BucketUpdate::Remove);
    }

    #[test]
    fn force_goes_into_debt_and_refill_pays_it_back() {
        let b = [p(10, 1, 1000)];
        let s = [Some(BucketState { tokens: 2, fraction: 0, updated_ms: 0 })];
        let out = force(&b, &s, 5, 0);
        assert_eq!((out.decision.granted, out.decision.remaining, out.decision.reset_after_ms), (5, 0, 13_000));
        let mut s = s;
        apply_updates(&mut s, &out);
        assert_eq!(s[0].unwrap().tokens, -3);
        assert!(!peek(&b, &s, 1, 1, 3_999).allowed());
        assert!(peek(&b, &s, 1, 1, 4_000).allowed());
    }

    #[test]
    fn force_debt_has_a_floor() {
        let b = [p(10, 1, 1000)];
        let out = force(&b, &[None], crate::limits::MAX_TOKENS, 0);
        let out2 = force(
            &b,
            &[match out.updates[0] {
                BucketUpdate::Store { state, .. } => Some(state),
                _ => None,
            }],
            crate::limits::MAX_TOKENS,
            0,
        );
        match out2.updates[0] {
            BucketUpdate::Store { state, .. } => assert_eq!(state.tokens, BucketState::MIN_TOKENS),
            BucketUpdate::Remove => panic!(),
        }
    }

    #[test]
    fn refund_never_goes_above_capacity() {
        let b = [p(10, 1, 1000), p(5, 1, 1000)];
        let s = [
            Some(BucketState { tokens: 2, fraction: 0, updated_ms: 0 }),
            Some(BucketState { tokens: 4, fraction: 0, updated_ms: 0 }),
        ];
        let out = refund(&b, &s, 3, 0);
        assert_eq!(out.decision.granted, 3);
        assert_eq!(out.updates[1], BucketUpdate::Remove, "5 of 5: full, so no key");
        match out.updates[0] {
            BucketUpdate::Store { state, expires_at_ms } => assert_eq!((state.tokens, expires_at_ms), (5, 5_000)),
            BucketUpdate::Remove => panic!(),
        }
        assert_eq!((out.decision.binding, out.decision.remaining), (0, 5));
    }
}
