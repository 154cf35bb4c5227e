//! Module options, set at load (`loadmodule ... max-log-limit 50000`), in
//! redis.conf (`rl.max-log-limit 50000`) or at run time (`CONFIG SET`).
//!
//! The server checks the range of redis.conf and CONFIG SET values; load
//! arguments are checked here, against the same ranges, so that no entrance
//! lets in a value the module could not persist and load again.

use std::sync::atomic::{AtomicI64, Ordering};

use rl_core::inflight::{DEFAULT_INFLIGHT_LIMIT, MAX_INFLIGHT_LIMIT as INFLIGHT_CEILING};
use rl_core::limits::{in_range, DEFAULT_LOG_LIMIT, MAX_LOG_LIMIT as LOG_CEILING};

use crate::args::{int, shown};

/// The largest limit an EXACT window may have: its log keeps one 8-byte
/// entry per admitted millisecond, so this bounds a key's memory.
pub static MAX_LOG_LIMIT: AtomicI64 = AtomicI64::new(DEFAULT_LOG_LIMIT as i64);

/// The largest limit of an in-flight key: it keeps one slot per request in
/// flight (about 70 bytes with a 32-byte id), so this bounds its memory.
pub static MAX_INFLIGHT_LIMIT: AtomicI64 = AtomicI64::new(DEFAULT_INFLIGHT_LIMIT as i64);

/// Every option: its name, its range and where it is kept.
pub const OPTIONS: [(&str, u64, u64, &AtomicI64); 2] = [
    ("max-log-limit", 1, LOG_CEILING, &MAX_LOG_LIMIT),
    ("max-inflight-limit", 1, INFLIGHT_CEILING, &MAX_INFLIGHT_LIMIT),
];

pub fn max_log_limit() -> u64 {
    (MAX_LOG_LIMIT.load(Ordering::Relaxed).max(1) as u64).min(LOG_CEILING)
}

pub fn max_inflight_limit() -> u64 {
    (MAX_INFLIGHT_LIMIT.load(Ordering::Relaxed).max(1) as u64).min(INFLIGHT_CEILING)
}

/// Applies the `loadmodule` arguments: `option value` pairs, each checked
/// (an unknown name, a value that is not an integer or out of range, or an
/// option given twice refuse the load with a message naming the option).
/// Nothing is applied unless every pair is valid.
pub fn apply_load_args(args: &[&[u8]]) -> Result<(), String> {
    let names = || OPTIONS.map(|(n, ..)| n).join(", ");
    let mut values = [None; OPTIONS.len()];
    for pair in args.chunks(2) {
        let [name, raw] = pair else {
            return Err(format!("module option '{}' has no value (options: {})", shown(pair[0]), names()));
        };
        let Some(i) = OPTIONS.iter().position(|(n, ..)| name.eq_ignore_ascii_case(n.as_bytes())) else {
            return Err(format!("unknown module option '{}' (options: {})", shown(name), names()));
        };
        let (option, min, max, _) = OPTIONS[i];
        if values[i].is_some() {
            return Err(format!("module option '{option}' is given more than once"));
        }
        let value = int(raw)
            .ok_or_else(|| format!("{option} must be an integer from {min} to {max}, got '{}'", shown(raw)))
            .and_then(|v| in_range(option, v, min, max).map_err(|e| e.to_string()))?;
        values[i] = Some(value);
    }
    for ((.., cell), value) in OPTIONS.iter().zip(values) {
        if let Some(v) = value {
            cell.store(v as i64, Ordering::Relaxed);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(args: &str) -> Result<(), String> {
        let args: Vec<&[u8]> = args.split_whitespace().map(str::as_bytes).collect();
        apply_load_args(&args)
    }

    #[test]
    fn load_arguments_are_checked_like_config_set() {
        assert_eq!(
            apply("max-log-limit 5000000").unwrap_err(),
            "max-log-limit must be an integer from 1 to 1000000, got 5000000"
        );
        for bad in ["0", "-3", "9223372036854775807", "1e3", "abc"] {
            assert!(apply(&format!("max-log-limit {bad}")).unwrap_err().starts_with("max-log-limit must be"), "{bad}");
        }
        let options = "(options: max-log-limit, max-inflight-limit)";
        assert_eq!(apply("max-log-limt 50").unwrap_err(), format!("unknown module option 'max-log-limt' {options}"));
        assert_eq!(
            apply("max-log-limit").unwrap_err(),
            format!("module option 'max-log-limit' has no value {options}")
        );
        assert_eq!(
            apply("max-inflight-limit 100001").unwrap_err(),
            "max-inflight-limit must be an integer from 1 to 100000, got 100001"
        );
        assert_eq!(apply("max-inflight-limit 20 max-log-limit 7"), Ok(()));
        assert_eq!((max_inflight_limit(), max_log_limit()), (20, 7));
        assert_eq!(apply("MAX-LOG-LIMIT 50000"), Ok(()));
        assert_eq!(
            apply("max-log-limit 5 MAX-LOG-LIMIT 6").unwrap_err(),
            "module option 'max-log-limit' is given more than once"
        );
        assert_eq!(
            apply("max-log-limit 5 max-log-limt 6").unwrap_err(),
            format!("unknown module option 'max-log-limt' {options}")
        );
        assert_eq!(max_log_limit(), 50_000, "a refused load applies nothing");
        assert_eq!(apply(""), Ok(()));
    }
}
