//! A bucket's parameters, checked against the module's limits where the
//! calls are made: a raw [`Bucket`](crate::Bucket) or window, and every
//! policy's rules (rl-gateway), name the field at fault the same way.

use std::time::Duration;

use rl_core::limits::{in_range, MAX_PERIOD_MS, MAX_TOKENS};
use rl_core::BucketParams;

/// Checks a bucket against the module's limits; the text names the field.
pub fn bucket_params(capacity: u64, refill: u64, period: Duration) -> std::result::Result<BucketParams, String> {
    // Capacity and refill are named before the period, as the module names them.
    in_range("capacity", capacity, 1, MAX_TOKENS)
        .and(in_range("refill", refill, 1, MAX_TOKENS))
        .map_err(|e| e.to_string())?;
    BucketParams::new(capacity, refill, period_ms(period)?).map_err(|e| e.to_string())
}

/// A period in whole milliseconds within the module's range.
pub fn period_ms(period: Duration) -> std::result::Result<u64, String> {
    let ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
    match in_range("period_ms", ms, 1, MAX_PERIOD_MS) {
        Ok(ms) if period.subsec_nanos().is_multiple_of(1_000_000) => Ok(ms),
        _ => Err(format!(
            "period must be a whole number of milliseconds from 1 ms to {MAX_PERIOD_MS} ms, got {period:?}"
        )),
    }
}

/// The largest bucket (capacity x period_ms, in units of 1/period_ms of a
/// token) the Lua backend computes exactly: levels stay within +-2^52, so
/// sums of two stay below 2^53, the doubles' exact-integer range.
pub const LUA_MAX_UNITS: u128 = 1 << 52;

/// The largest EXACT limit of the Lua backend: its window script reads and
/// writes a log whole, so it is held to the module's default
/// `max-log-limit`.
pub const MAX_LUA_LOG_LIMIT: u64 = 10_000;
