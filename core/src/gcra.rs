//! GCRA exactly as redis-cell computes it, for `CL.THROTTLE`.
//!
//! The state is a theoretical arrival time (TAT) in nanoseconds since the
//! Unix epoch, the same number redis-cell keeps in its string keys. The
//! arithmetic follows redis-cell 0.4 step by step, including its float
//! steps (emission interval, remaining) and its rounding of seconds, so a
//! switch from redis-cell changes no answer. Only the clock differs: ours is
//! the server's.

const NS_PER_S: i64 = 1_000_000_000;
const NS_PER_MS: i64 = 1_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GcraError {
    /// max_burst below 0 or so large that the tolerance overflows.
    MaxBurst,
    /// count_per_period below 1.
    Count,
    /// period below 1 or above what nanoseconds can hold.
    Period,
    /// count_per_period so high for the period that the interval is 0 ns.
    ZeroRate,
    /// quantity below 0.
    Quantity,
    /// An allowed call would store a TAT past the year 2262 (i64 ns): the
    /// tolerance (max_burst and period) reaches that far.
    Overflow,
}

/// A validated CL.THROTTLE quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcraParams {
    /// Nanoseconds between requests at the steady rate (T).
    emission_ns: i64,
    /// How far ahead of the schedule a caller may be (tau = T * limit).
    tolerance_ns: i64,
    /// max_burst + 1.
    limit: i64,
}

/// Longest period accepted, in seconds (whose nanoseconds fit an i64).
pub const MAX_PERIOD_S: i64 = i64::MAX / NS_PER_S;

impl GcraParams {
    pub fn new(max_burst: i64, count: i64, period_s: i64) -> Result<Self, GcraError> {
        if max_burst < 0 {
            return Err(GcraError::MaxBurst);
        }
        if count < 1 {
            return Err(GcraError::Count);
        }
        if !(1..=MAX_PERIOD_S).contains(&period_s) {
            return Err(GcraError::Period);
        }
        // redis-cell: Rate::per_period, a float division truncated to ns.
        let emission_ns = ((period_s * NS_PER_S) as f64 / count as f64) as i64;
        if emission_ns == 0 {
            return Err(GcraError::ZeroRate);
        }
        let limit = max_burst.checked_add(1).ok_or(GcraError::MaxBurst)?;
        let tolerance_ns = emission_ns.checked_mul(limit).ok_or(GcraError::MaxBurst)?;
        Ok(Self { emission_ns, tolerance_ns, limit })
    }

    pub fn limit(&self) -> i64 {
        self.limit
    }
}

/// The outcome of one CL.THROTTLE call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttle {
    pub limited: bool,
    pub limit: i64,
    pub remaining: i64,
    /// Nanoseconds, or -1 s when allowed (or never possible).
    pub retry_after_ns: i64,
    pub reset_after_ns: i64,
    /// The TAT to store when allowed with a quantity above 0.
    pub new_tat_ns: Option<i64>,
}

/// redis-cell's rate_limit for a key holding `tat_ns` (None: no key; -1,
/// redis-cell's own "no value", reads as no key too).
///
/// Times are i128 inside: a key may hold any i64 (redis-cell keys, or a
/// string someone wrote), and differences of two i64 overflow one. Results
/// are clamped back to i64.
pub fn throttle(p: &GcraParams, tat_ns: Option<i64>, now_ns: i64, quantity: i64) -> Result<Throttle, GcraError> {
    if quantity < 0 {
        return Err(GcraError::Quantity);
    }
    let clamp = |v: i128| v.clamp(i64::MIN as i128, i64::MAX as i128) as i64;
    let (emission, tolerance, now) = (p.emission_ns as i128, p.tolerance_ns as i128, now_ns as i128);
    let increment = emission * quantity as i128;
    let tat = tat_ns.filter(|&t| t != -1).map_or(now, i128::from);
    // i128 holds any i64 TAT plus any increment; only a TAT that is stored
    // must fit an i64. A quantity that can never pass (above the limit,
    // however large) is refused like any other, as redis-cell refuses it.
    let new_tat = tat.max(now) + increment;
    let allow_at = new_tat - tolerance;
    let diff = now - allow_at;
    let (limited, retry_after_ns, ttl) = if diff < 0 {
        let retry = if increment <= tolerance { -diff } else { -(NS_PER_S as i128) };
        // A TAT in the past is a full bucket: nothing to reset. (redis-cell
        // reports the negative difference, and a remaining above the limit.)
        (true, retry, tat.max(now) - now)
    } else {
        (false, -(NS_PER_S as i128), new_tat - now)
    };
    if !limited && new_tat > i64::MAX as i128 {
        return Err(GcraError::Overflow);
    }
    let next = tolerance - ttl;
    let remaining = if next > -emission {
        // Microseconds through f64, truncated, as redis-cell does.
        ((next / 1_000) as f64 / (emission / 1_000) as f64) as i64
    } else {
        0
    };
    Ok(Throttle {
        limited,
        limit: p.limit,
        remaining: remaining.min(p.limit),
        retry_after_ns: clamp(retry_after_ns),
        reset_after_ns: clamp(ttl),
        new_tat_ns: (!limited && quantity > 0).then_some(new_tat as i64),
    })
}

/// Whole seconds the way redis-cell replies: truncated, plus one if at least
/// a millisecond is left over.
pub fn cell_seconds(ns: i64) -> i64 {
    let whole = ns / NS_PER_S;
    if (ns % NS_PER_S) / NS_PER_MS > 0 {
        whole + 1
    } else {
        whole
    }
}

/// The expiry of a key holding `new_tat`: when the TAT has passed, rounded
/// up to the millisecond (redis-cell rounds down and can drop a key a
/// fraction of a millisecond early).
pub fn expires_at_ms(new_tat_ns: i64) -> i64 {
    new_tat_ns.div_euclid(NS_PER_MS) + i64::from(new_tat_ns.rem_euclid(NS_PER_MS) > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = NS_PER_S;
    const MS: i64 = NS_PER_MS;

    /// redis-cell's own table (its test `it_rate_limits`): limit 5 (max_burst
    /// 4), one per second. Columns: time offset ms, quantity, remaining,
    /// reset_after, retry_after, limited.
    #[test]
    fn redis_cell_table() {
        let p = GcraParams::new(4, 1, 1).unwrap();
        let start = 1_700_000_000 * S;
        let cases: [(i64, i64, i64, i64, i64, bool); 15] = [
            (0, 6, 5, 0, -S, true),
            (0, 1, 4, S, -S, false),
            (0, 1, 3, 2 * S, -S, false),
            (0, 1, 2, 3 * S, -S, false),
            (0, 1, 1, 4 * S, -S, false),
            (0, 1, 0, 5 * S, -S, false),
            (0, 1, 0, 5 * S, S, true),
            (3000, 1, 2, 3000 * MS, -S, false),
            (3100, 1, 1, 3900 * MS, -S, false),
            (4000, 1, 1, 4000 * MS, -S, false),
            (8000, 1, 4, 1000 * MS, -S, false),
            (9500, 1, 4, 1000 * MS, -S, false),
            (9500, 0, 4, S, -S, false),
            (9500, 2, 2, 3 * S, -S, false),
            (9500, 5, 2, 3 * S, 3 * S, true),
        ];
        let mut tat = None;
        for (i, (at, q, remaining, reset, retry, limited)) in cases.into_iter().enumerate() {
            let r = throttle(&p, tat, start + at * MS, q).unwrap();
            assert_eq!(
                (r.limited, r.limit, r.remaining, r.reset_after_ns, r.retry_after_ns),
                (limited, 5, remaining, reset, retry),
                "case {i}"
            );
            if let Some(t) = r.new_tat_ns {
                tat = Some(t);
            }
        }
    }

    /// The example of redis-cell's README: `CL.THROTTLE user123 15 30 60`.
    #[test]
    fn redis_cell_readme_example() {
        let p = GcraParams::new(15, 30, 60).unwrap();
        let r = throttle(&p, None, 1_700_000_000 * S, 1).unwrap();
        assert_eq!(
            (r.limited, r.limit, r.remaining, cell_seconds(r.retry_after_ns), cell_seconds(r.reset_after_ns)),
            (false, 16, 15, -1, 2)
        );
    }

    #[test]
    fn seconds_round_like_redis_cell() {
        assert_eq!(cell_seconds(-S), -1);
        assert_eq!(cell_seconds(0), 0);
        assert_eq!(cell_seconds(999_999), 0); // under a millisecond: not rounded
        assert_eq!(cell_seconds(MS), 1);
        assert_eq!(cell_seconds(S), 1);
        assert_eq!(cell_seconds(S + MS), 2);
    }

    #[test]
    fn params_are_validated() {
        assert_eq!(GcraParams::new(-1, 1, 1), Err(GcraError::MaxBurst));
        assert_eq!(GcraParams::new(1, 0, 1), Err(GcraError::Count));
        assert_eq!(GcraParams::new(1, 1, 0), Err(GcraError::Period));
        assert_eq!(GcraParams::new(1, 1, MAX_PERIOD_S + 1), Err(GcraError::Period));
        assert_eq!(GcraParams::new(1, 2_000_000_000, 1), Err(GcraError::ZeroRate));
        assert_eq!(GcraParams::new(i64::MAX, 1, 1), Err(GcraError::MaxBurst));
        let p = GcraParams::new(1, 1, 1).unwrap();
        assert_eq!(throttle(&p, None, 0, -1), Err(GcraError::Quantity));
        // A quantity above the limit is refused however large (redis-cell
        // answers 1e12 that way; its i64 product overflows for i64::MAX).
        for q in [3, 1_000_000_000_000, i64::MAX] {
            let r = throttle(&p, None, S, q).unwrap();
            assert_eq!((r.limited, r.remaining, r.retry_after_ns, r.reset_after_ns), (true, 2, -S, 0), "{q}");
        }
        // Any stored i64 is read without overflow.
        let r = throttle(&p, Some(i64::MIN), i64::MAX / 2, 5).unwrap();
        assert!(r.limited && r.reset_after_ns == 0 && r.remaining == r.limit);
        assert!(throttle(&p, Some(i64::MAX), 0, 0).unwrap().limited);
        // A TAT near the end of i64 time is a bucket empty for centuries.
        let r = throttle(&p, Some(i64::MAX - 10), 0, 1).unwrap();
        assert!(r.limited && r.remaining == 0 && r.retry_after_ns > 0, "{r:?}");
        // An allowed call whose TAT would pass i64 is refused, not wrapped.
        let wide = GcraParams::new(0, 1, 9_000_000_000).unwrap();
        assert_eq!(throttle(&wide, None, 1_796_000_000 * S, 1), Err(GcraError::Overflow));
        // -1 is redis-cell's "no value".
        assert_eq!(throttle(&p, Some(-1), S, 1), throttle(&p, None, S, 1));
    }

    /// `SET oldtat 1000000000; CL.THROTTLE oldtat 0 1 1 5` answered
    /// remaining 1796053136 and reset -1796053135 (as redis-cell does).
    #[test]
    fn a_stale_stored_time_reads_as_a_full_bucket() {
        let now = 1_796_053_136 * S;
        let p = GcraParams::new(0, 1, 1).unwrap();
        let r = throttle(&p, Some(1_000_000_000), now, 5).unwrap();
        assert_eq!((r.limited, r.limit, r.remaining, r.retry_after_ns, r.reset_after_ns), (true, 1, 1, -S, 0));
        // Whatever is stored, whatever the rate: remaining within the limit,
        // times never negative (-1 s is the "allowed"/"never" marker).
        for tat in [i64::MIN, -5, 0, 1, now - 10 * S, now - 1, now, now + S, now + 1_000 * S] {
            for (burst, count, period) in [(0, 1, 1), (4, 1, 1), (15, 30, 60), (1_000, 1_000_000, 1)] {
                let p = GcraParams::new(burst, count, period).unwrap();
                for q in [0, 1, 3, 5, 2_000] {
                    let Ok(r) = throttle(&p, Some(tat), now, q) else { continue };
                    assert!((0..=r.limit).contains(&r.remaining), "{tat} {burst} {q}: {r:?}");
                    assert!(r.reset_after_ns >= 0 && r.retry_after_ns >= -S, "{tat} {burst} {q}: {r:?}");
                }
            }
        }
    }

    #[test]
    fn expiry_rounds_up_to_the_millisecond() {
        assert_eq!(expires_at_ms(5 * MS), 5);
        assert_eq!(expires_at_ms(5 * MS + 1), 6);
    }
}
