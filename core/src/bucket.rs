//! One token bucket: its parameters, its saved state and its level at a time.
//!
//! Exactness comes from the unit: a bucket's level is counted in units of
//! 1/period_ms of a token. In those units the bucket holds `capacity *
//! period_ms` when full, a token costs `period_ms`, and every millisecond adds
//! exactly `refill` units. All arithmetic is on integers (i128 where products
//! grow), so there is no drift however many calls are made.

use crate::limits::{in_range, ParamError, MAX_PERIOD_MS, MAX_TIME_MS, MAX_TOKENS, MAX_WAIT_MS};

/// A validated bucket: holds at most `capacity` tokens and gains `refill`
/// tokens every `period_ms` milliseconds, continuously.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketParams {
    capacity: u64,
    refill: u64,
    period_ms: u64,
}

impl BucketParams {
    pub fn new(capacity: u64, refill: u64, period_ms: u64) -> Result<Self, ParamError> {
        Ok(Self {
            capacity: in_range("capacity", capacity, 1, MAX_TOKENS)?,
            refill: in_range("refill", refill, 1, MAX_TOKENS)?,
            period_ms: in_range("period_ms", period_ms, 1, MAX_PERIOD_MS)?,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn refill(&self) -> u64 {
        self.refill
    }

    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// The level of a full bucket, in units.
    pub(crate) fn full_units(&self) -> i128 {
        self.capacity as i128 * self.period_ms as i128
    }

    /// `tokens` whole tokens, in units.
    pub(crate) fn units(&self, tokens: u64) -> i128 {
        tokens as i128 * self.period_ms as i128
    }

    /// Whole tokens in a level (negative while in debt).
    pub(crate) fn whole_tokens(&self, units: i128) -> i128 {
        div_floor(units, self.period_ms as i128)
    }

    /// Milliseconds, rounded up, until `missing` units have been refilled.
    pub(crate) fn wait_ms(&self, missing: i128) -> u64 {
        if missing <= 0 {
            return 0;
        }
        let refill = self.refill as i128;
        let ms = div_floor(missing + refill - 1, refill);
        ms.min(MAX_WAIT_MS as i128) as u64
    }

    /// The level at `now_ms` of a bucket saved as `state` (a bucket never
    /// seen, or expired, is full).
    ///
    /// A lowered capacity clamps the level; a changed refill applies from the
    /// last update on. A clock reading earlier than the last update counts as
    /// no time passed: a backward step mints nothing.
    pub fn level_at(&self, state: Option<&BucketState>, now_ms: u64) -> i128 {
        let full = self.full_units();
        let Some(state) = state else { return full };
        let elapsed = now_ms.saturating_sub(state.updated_ms);
        (state.units(self) + self.refill as i128 * elapsed as i128).min(full)
    }
}

/// Floor division (`b` > 0). Levels need i128 in the worst case, but nearly
/// always fit an i64, whose division is several times cheaper: this is on
/// every call's path.
fn div_floor(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) => a.div_euclid(b) as i128,
        _ => a.div_euclid(b),
    }
}

/// What a bucket key stores: the level `tokens + fraction / period_ms` as of
/// `updated_ms`.
///
/// The fraction is kept in units of the period in force when it was saved. If
/// the period of a key changes, the fraction is read in the new units (capped
/// just below one token): the whole tokens carry over exactly and the change
/// moves the level by less than one token, once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketState {
    /// Whole tokens; negative while the bucket is in debt.
    pub tokens: i64,
    /// Part of the next token, in units of 1/period_ms; below period_ms.
    pub fraction: u64,
    /// Server time of the last update, milliseconds since the Unix epoch.
    pub updated_ms: u64,
}

/// Why a stored or replicated state was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateError {
    Tokens,
    Fraction,
    Time,
}

impl BucketState {
    /// The lowest level a bucket may be pushed to by forced debits.
    pub const MIN_TOKENS: i64 = -(MAX_TOKENS as i64);

    /// The state that records `units` at `now_ms`.
    pub fn from_units(params: &BucketParams, units: i128, now_ms: u64) -> Self {
        let period = params.period_ms as i128;
        let whole = div_floor(units, period);
        Self {
            tokens: whole.max(Self::MIN_TOKENS as i128) as i64,
            fraction: (units - whole * period) as u64,
            updated_ms: now_ms,
        }
    }

    fn units(&self, params: &BucketParams) -> i128 {
        let fraction = self.fraction.min(params.period_ms - 1);
        self.tokens as i128 * params.period_ms as i128 + fraction as i128
    }

    /// Checks the ranges a state can legally have, whatever its bucket.
    pub fn validate(&self) -> Result<(), StateError> {
        if !(Self::MIN_TOKENS..=MAX_TOKENS as i64).contains(&self.tokens) {
            return Err(StateError::Tokens);
        }
        if self.fraction >= MAX_PERIOD_MS {
            return Err(StateError::Fraction);
        }
        if self.updated_ms > MAX_TIME_MS {
            return Err(StateError::Time);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(c: u64, r: u64, ms: u64) -> BucketParams {
        BucketParams::new(c, r, ms).unwrap()
    }

    #[test]
    fn params_are_validated() {
        let field = |r: Result<BucketParams, ParamError>| r.unwrap_err().field;
        assert_eq!(field(BucketParams::new(0, 1, 1)), "capacity");
        assert_eq!(field(BucketParams::new(MAX_TOKENS + 1, 1, 1)), "capacity");
        assert_eq!(field(BucketParams::new(1, 0, 1)), "refill");
        assert_eq!(field(BucketParams::new(1, 1, 0)), "period_ms");
        assert_eq!(
            BucketParams::new(1, 1, MAX_PERIOD_MS + 1).unwrap_err().to_string(),
            format!("period_ms must be an integer from 1 to {MAX_PERIOD_MS}, got {}", MAX_PERIOD_MS + 1)
        );
        assert!(BucketParams::new(MAX_TOKENS, MAX_TOKENS, MAX_PERIOD_MS).is_ok());
    }

    #[test]
    fn missing_bucket_is_full() {
        let b = p(200, 100, 1000);
        assert_eq!(b.level_at(None, 5), 200 * 1000);
    }

    #[test]
    fn refill_is_continuous_and_capped() {
        let b = p(10, 3, 1000); // 3 tokens a second
        let empty = BucketState { tokens: 0, fraction: 0, updated_ms: 1_000 };
        assert_eq!(b.level_at(Some(&empty), 1_001), 3); // 3/1000 of a token
        assert_eq!(b.whole_tokens(b.level_at(Some(&empty), 1_333)), 0);
        assert_eq!(b.whole_tokens(b.level_at(Some(&empty), 1_334)), 1);
        assert_eq!(b.level_at(Some(&empty), 1_000_000), b.full_units());
    }

    #[test]
    fn backward_clock_mints_nothing() {
        let b = p(10, 1, 1);
        let s = BucketState { tokens: 2, fraction: 0, updated_ms: 5_000 };
        assert_eq!(b.level_at(Some(&s), 4_000), 2);
    }

    #[test]
    fn lowered_capacity_clamps() {
        let s = BucketState { tokens: 90, fraction: 0, updated_ms: 0 };
        assert_eq!(p(50, 1, 1000).level_at(Some(&s), 0), 50 * 1000);
    }

    #[test]
    fn changed_period_keeps_whole_tokens() {
        let s = BucketState { tokens: 7, fraction: 900, updated_ms: 0 };
        // Saved under period 1000 (7.9 tokens); read under period 10.
        let b = p(100, 1, 10);
        assert_eq!(b.whole_tokens(b.level_at(Some(&s), 0)), 7);
        assert_eq!(b.level_at(Some(&s), 0), 79);
    }

    #[test]
    fn debt_rounds_toward_minus_infinity() {
        let b = p(10, 1, 1000);
        let s = BucketState::from_units(&b, -1, 0);
        assert_eq!((s.tokens, s.fraction), (-1, 999));
        assert_eq!(b.level_at(Some(&s), 0), -1);
    }

    #[test]
    fn wait_rounds_up_and_is_capped() {
        let b = p(10, 3, 1000);
        assert_eq!(b.wait_ms(0), 0);
        assert_eq!(b.wait_ms(1), 1);
        assert_eq!(b.wait_ms(1000), 334);
        let slow = p(MAX_TOKENS, 1, MAX_PERIOD_MS);
        assert_eq!(slow.wait_ms(slow.full_units()), MAX_WAIT_MS);
    }

    #[test]
    fn floor_division_is_the_same_on_both_paths() {
        for a in
            [i128::from(i64::MIN), -7, -1, 0, 1, 7, i128::from(i64::MAX), i128::from(i64::MAX) + 1, -(1i128 << 100)]
        {
            for b in [1i128, 3, 1000, i128::from(i64::MAX), 1i128 << 70] {
                assert_eq!(div_floor(a, b), a.div_euclid(b), "{a} / {b}");
            }
        }
    }

    #[test]
    fn state_ranges() {
        let ok = BucketState { tokens: -5, fraction: 3, updated_ms: MAX_TIME_MS };
        assert_eq!(ok.validate(), Ok(()));
        let bad = BucketState { tokens: MAX_TOKENS as i64 + 1, ..ok };
        assert_eq!(bad.validate(), Err(StateError::Tokens));
        let bad = BucketState { fraction: MAX_PERIOD_MS, ..ok };
        assert_eq!(bad.validate(), Err(StateError::Fraction));
        let bad = BucketState { updated_ms: MAX_TIME_MS + 1, ..ok };
        assert_eq!(bad.validate(), Err(StateError::Time));
    }
}
