//! The largest values the limiter accepts, in one place so the parser, the
//! state encoding and the README agree.

/// Largest capacity, refill, COST or WANT: 10^14 tokens. Capacity times
/// period fits comfortably in the i128 arithmetic and the whole-token part
/// of a bucket fits the 48 signed bits of its stored form.
pub const MAX_TOKENS: u64 = 100_000_000_000_000;

/// Longest refill period: two years of 365 days. The fractional token of a
/// bucket is kept in units of 1/period_ms and stored in 36 bits.
pub const MAX_PERIOD_MS: u64 = 63_072_000_000;

/// Most keys (buckets) one call may name.
pub const MAX_KEYS: usize = 32;

/// Latest clock reading a bucket can record: 2^44 - 1 ms after the Unix
/// epoch (the year 2527). The stored form keeps 44 bits of time.
pub const MAX_TIME_MS: u64 = (1 << 44) - 1;

/// How far ahead of a server's clock a stored time may lie when that server
/// reads it: one day. The module stamps a state with its own clock, so a
/// state read where the clock is a little behind (a replica, the host a dump
/// is restored on, a clock that stepped back) is a little ahead; years
/// ahead, it would hold its key as long (a window that never rolls, a slot
/// that never heals), and no server the module ran on wrote it.
pub const MAX_CLOCK_AHEAD_MS: u64 = 86_400_000;

/// The latest clock reading (a window's start, a log entry, the time a call
/// left expired slots out) a state may hold when read at `now_ms`.
pub fn latest_reading_ms(now_ms: u64) -> u64 {
    now_ms.saturating_add(MAX_CLOCK_AHEAD_MS).min(MAX_TIME_MS)
}

/// The latest time a reading plus the longest period or timeout may reach
/// when read at `now_ms`: a slot's deadline, the expiry of an in-flight or
/// EXACT key.
pub fn latest_period_end_ms(now_ms: u64) -> u64 {
    latest_reading_ms(now_ms).saturating_add(MAX_PERIOD_MS).min(MAX_TIME_MS)
}

/// Longest wait ever reported (retry_after_ms, reset_after_ms) or used for a
/// key's TTL: 10^15 ms, about 31,700 years. Only absurd parameter mixes
/// (huge capacity, one token a year) reach it.
pub const MAX_WAIT_MS: u64 = 1_000_000_000_000_000;

/// Largest limit (and COST) of a SLIDING or FIXED window: 10^12 requests.
/// Its counters are stored in 42 bits each.
pub const MAX_WINDOW_LIMIT: u64 = 1_000_000_000_000;

/// Hard ceiling of an EXACT log's limit: one entry per admitted millisecond
/// costs 8 bytes, so the module's configurable maximum (default
/// `DEFAULT_LOG_LIMIT`) can be raised up to this and no further.
pub const MAX_LOG_LIMIT: u64 = 1_000_000;

/// Default maximum limit of an EXACT log, changeable at module load.
pub const DEFAULT_LOG_LIMIT: u64 = 10_000;

/// A parameter out of its accepted range: which one, what was given and
/// what is accepted. The module, the client and the rules all word their
/// refusals from it, so a limit reads the same wherever it is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamError {
    /// The parameter's name as users write it (`capacity`, `window_ms`, ...).
    pub field: &'static str,
    pub value: u64,
    pub min: u64,
    pub max: u64,
}

impl std::fmt::Display for ParamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} must be an integer from {} to {}, got {}", self.field, self.min, self.max, self.value)
    }
}

impl std::error::Error for ParamError {}

/// `value` if it lies in `min..=max`, else the error naming `field`.
pub fn in_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<u64, ParamError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ParamError { field, value, min, max })
    }
}
