//! Module options, set at load (`loadmodule ... max-log-limit 50000`), in
//! redis.conf (`rl.max-log-limit 50000`) or at run time (`CONFIG SET`).

use std::sync::atomic::{AtomicI64, Ordering};

use rl_core::limits::DEFAULT_LOG_LIMIT;

/// The largest limit an EXACT window may have: its log keeps one 8-byte
/// entry per admitted millisecond, so this bounds a key's memory.
pub static MAX_LOG_LIMIT: AtomicI64 = AtomicI64::new(DEFAULT_LOG_LIMIT as i64);

pub fn max_log_limit() -> u64 {
    MAX_LOG_LIMIT.load(Ordering::Relaxed).max(1) as u64
}
