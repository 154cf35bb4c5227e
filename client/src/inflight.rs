//! In-flight limits for the typed calls: the limit of one key and the
//! answer of RL.ACQUIRE / RL.INFLIGHT (or the Lua script over a sorted set).

use std::time::Duration;

use redis::Value;
use rl_core::inflight::{valid_id, InflightParams, MAX_ID_LEN, MAX_INFLIGHT_LIMIT};
use rl_core::limits::in_range;

use crate::error::{Error, Result};
use crate::params::period_ms;

/// One in-flight limit for a raw call: at most `limit` requests hold a slot
/// of `key` at once, each slot for at most `timeout` (then it heals by
/// itself: the server drops it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inflight {
    key: String,
    pub(crate) params: InflightParams,
}

impl Inflight {
    /// At most `limit` (1 to 100,000; the server refuses a limit above its
    /// `max-inflight-limit`, 10,000 unless configured) in flight, each slot
    /// held at most `timeout` (whole ms, up to two years).
    pub fn new(key: impl Into<String>, limit: u64, timeout: Duration) -> Result<Inflight> {
        let key = key.into();
        Ok(Inflight { params: inflight_params(limit, timeout).map_err(|why| bad(&key, why))?, key })
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Most requests in flight.
    pub fn limit(&self) -> u64 {
        self.params.limit()
    }

    /// How long a slot is held at most.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.params.timeout_ms())
    }
}

fn bad(key: &str, why: String) -> Error {
    Error::invalid(format!("in-flight limit '{key}': {why}"))
}

/// Checks a limit and timeout against the module's hard limits.
pub fn inflight_params(limit: u64, timeout: Duration) -> std::result::Result<InflightParams, String> {
    let ms = period_ms(timeout).map_err(|why| why.replacen("period", "timeout", 1))?;
    InflightParams::new(limit, ms, MAX_INFLIGHT_LIMIT).map_err(|e| e.to_string())
}

/// A cost (slots taken in every key) in range.
pub fn validate_cost(cost: u64) -> Result<()> {
    in_range("cost", cost, 1, MAX_INFLIGHT_LIMIT)?;
    Ok(())
}

/// An id the module accepts: 1 to 64 bytes.
pub(crate) fn validate_id(id: &str) -> Result<()> {
    if valid_id(id.as_bytes()) {
        Ok(())
    } else {
        Err(Error::invalid(format!("id must be 1 to {MAX_ID_LEN} bytes, got {} bytes", id.len())))
    }
}

/// A fresh id: 128 bits as 32 hex characters, as the module makes them.
/// Made by the client so that a call whose answer is lost (a timeout, a
/// dropped future) can still be released by its id. Another client must not
/// guess it (or it could release this slot): the bits come from SipHash
/// keyed by std's `RandomState` (seeded from the OS's randomness) over a
/// counter, not from a predictable generator.
pub fn new_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let half = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u64(salt);
        h.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

/// The answer to RL.ACQUIRE or RL.INFLIGHT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquired {
    /// Whether the slot was taken (RL.INFLIGHT: would be).
    pub allowed: bool,
    /// Requests in flight in the binding key after the call (refused: now).
    pub in_flight: u64,
    /// Zero when allowed; otherwise how long until enough slots reach their
    /// deadline (a release may come sooner). `None`: the cost is above a
    /// limit and never fits.
    pub retry_after: Option<Duration>,
    /// The binding key's limit.
    pub limit: u64,
    /// Index of the binding key: the one that refused (longest wait) or,
    /// when allowed, the one with the fewest slots left.
    pub rule: usize,
    /// The slot's id: the one given, or the one the module made (empty for
    /// RL.INFLIGHT without an id).
    pub id: String,
}

impl Acquired {
    /// Reads `[allowed, in_flight, retry_after_ms, limit, binding, id]` for
    /// a call on `keys` keys.
    pub(crate) fn from_reply(value: Value, keys: usize) -> Result<Acquired> {
        let bad = |v: &dyn std::fmt::Debug| Error::Reply(format!("{v:?} is not the in-flight reply the module sends"));
        let Value::Array(items) = value else { return Err(bad(&value)) };
        let ints: Vec<i64> = items.iter().take(5).filter_map(|v| redis::from_redis_value(v.clone()).ok()).collect();
        let (&[allowed, in_flight, retry_ms, limit, binding], Some(Value::BulkString(id))) =
            (ints.as_slice(), items.get(5).filter(|_| items.len() == 6))
        else {
            return Err(bad(&items));
        };
        let id = String::from_utf8(id.clone()).map_err(|_| bad(&items))?;
        let rule = usize::try_from(binding).ok().filter(|&b| b < keys).ok_or_else(|| bad(&items))?;
        let retry_after = match retry_ms {
            -1 => None,
            ms => Some(Duration::from_millis(u64::try_from(ms).map_err(|_| bad(&items))?)),
        };
        let (Ok(in_flight), Ok(limit), 0 | 1) = (u64::try_from(in_flight), u64::try_from(limit), allowed) else {
            return Err(bad(&items));
        };
        Ok(Acquired { allowed: allowed == 1, in_flight, retry_after, limit, rule, id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked_before_sending() {
        let s = Duration::from_secs(1);
        let e = Inflight::new("k", 0, s).unwrap_err().to_string();
        assert!(e.contains("in-flight limit 'k': limit must be an integer from 1 to 100000, got 0"), "{e}");
        let e = Inflight::new("k", 1, Duration::ZERO).unwrap_err().to_string();
        assert!(e.contains("timeout must be a whole number of milliseconds"), "{e}");
        assert!(Inflight::new("k", 1, Duration::from_micros(1500)).is_err());
        assert!(Inflight::new("k", MAX_INFLIGHT_LIMIT + 1, s).is_err());
        assert_eq!(Inflight::new("k", 20, s).unwrap().timeout(), s);
        assert!(
            validate_id("").is_err() && validate_id(&"x".repeat(65)).is_err() && validate_id(&"x".repeat(64)).is_ok()
        );
        assert!(validate_cost(0).is_err() && validate_cost(MAX_INFLIGHT_LIMIT + 1).is_err());
        assert_eq!(new_id().len(), 32);
        assert_ne!(new_id(), new_id());
    }

    #[test]
    fn replies_are_read_strictly() {
        let reply = |v: Vec<Value>| Acquired::from_reply(Value::Array(v), 2);
        let ints = |xs: &[i64]| xs.iter().map(|&x| Value::Int(x)).collect::<Vec<_>>();
        let with_id = |xs: &[i64]| {
            let mut v = ints(xs);
            v.push(Value::BulkString(b"abc".to_vec()));
            v
        };
        let a = reply(with_id(&[0, 20, -1, 20, 1])).unwrap();
        assert_eq!(
            (a.allowed, a.in_flight, a.retry_after, a.limit, a.rule, a.id.as_str()),
            (false, 20, None, 20, 1, "abc")
        );
        assert!(reply(with_id(&[1, 3, 0, 20, 2])).is_err(), "binding out of range");
        assert!(reply(with_id(&[2, 3, 0, 20, 0])).is_err());
        assert!(reply(ints(&[1, 3, 0, 20, 0, 5])).is_err(), "the id is a string");
        assert!(reply(ints(&[1, 3, 0, 20, 0])).is_err());
        assert!(Acquired::from_reply(Value::Int(1), 1).is_err());
    }
}
