//! The server's clock, read once per command.

use redis_module::raw;
use rl_core::limits::MAX_TIME_MS;

/// Milliseconds since the Unix epoch on the server's clock.
///
/// Redis 7.2+ and Valkey export `CachedMicroseconds`, fixed for the whole
/// command; Redis 7.0 has only the live `Milliseconds` (the clock its own
/// expiry uses). Either is read once per call; the algorithms treat a reading
/// earlier than a bucket's last update as no time passed.
pub fn now_ms() -> Result<u64, &'static str> {
    now_us().map(|us| us / 1000)
}

/// Nanoseconds since the Unix epoch, for CL.THROTTLE (redis-cell keeps
/// nanoseconds); as precise as the server's clock (µs, or ms on 7.0).
pub fn now_ns() -> Result<i64, &'static str> {
    now_us().map(|us| us as i64 * 1000)
}

/// Milliseconds since the Unix epoch on the system clock, outside any
/// command (loading a value, freeing one); 0 if it reads before 1970.
pub fn system_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn now_us() -> Result<u64, &'static str> {
    // SAFETY: the server fills these pointers before OnLoad; None on servers
    // that lack the function.
    let us = unsafe {
        if let Some(cached_us) = raw::RedisModule_CachedMicroseconds {
            cached_us()
        } else if let Some(ms) = raw::RedisModule_Milliseconds {
            ms().saturating_mul(1000)
        } else {
            return Err("ERR the server exports no clock to modules");
        }
    };
    match u64::try_from(us) {
        Ok(us) if us / 1000 <= MAX_TIME_MS => Ok(us),
        _ => Err("ERR the server clock is outside the range the limiter stores (1970 to 2527)"),
    }
}
