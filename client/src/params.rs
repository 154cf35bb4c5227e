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

/// Why the Lua scripts cannot count `limit` (a bucket's capacity or a
/// window's limit) per `period_ms`, in the words their errors use; None
/// when they can. `exact_log`: an EXACT window. The one statement of the
/// scripts' bounds beyond the module's, for those that check a limit
/// before it is sent (the gateway's policies, the relay's Envoy config).
pub fn beyond_lua(limit: u64, period_ms: u64, exact_log: bool) -> Option<String> {
    if exact_log && limit > MAX_LUA_LOG_LIMIT {
        return Some(format!(
            "an EXACT window's limit must be at most {MAX_LUA_LOG_LIMIT} on the Lua scripts, got {limit}"
        ));
    }
    if u128::from(limit) * u128::from(period_ms) > LUA_MAX_UNITS {
        let most = LUA_MAX_UNITS / u128::from(period_ms.max(1));
        return Some(format!(
            "limit x period_ms must be at most 2^52 on the Lua scripts: at most {most} per {period_ms} ms, got {limit}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_lua_holds_the_scripts_bounds_at_their_edges() {
        let year = 365 * 86_400_000;
        let most = (LUA_MAX_UNITS / year as u128) as u64;
        assert_eq!(beyond_lua(most, year, false), None);
        let e = beyond_lua(most + 1, year, false).unwrap();
        assert!(e.contains(&format!("at most {most} per {year} ms, got {}", most + 1)), "{e}");
        assert_eq!(beyond_lua(MAX_LUA_LOG_LIMIT, 1000, true), None);
        let e = beyond_lua(MAX_LUA_LOG_LIMIT + 1, 1000, true).unwrap();
        assert!(e.contains("EXACT window's limit must be at most 10000"), "{e}");
        // A sliding window of the same limit fits.
        assert_eq!(beyond_lua(MAX_LUA_LOG_LIMIT + 1, 1000, false), None);
    }
}
