//! A gateway's share of a rule while Redis cannot answer: the arithmetic
//! of rl-client's local fallback (client/src/fallback.rs keeps the buckets
//! and their notes: each of `gateways` gateways enforces `slack / gateways`
//! of the rule, one token at least), here so the scale model
//! (tools/sims/src/bin/sim_scale) sizes its fallback with the same code.

use crate::limits::{MAX_PERIOD_MS, MAX_TOKENS};
use crate::BucketParams;

/// Whether a rule's share of its capacity, `capacity x slack / gateways`,
/// is below one whole token.
pub fn below_one_token(rule: &BucketParams, slack: f64, gateways: u32) -> bool {
    // A slack of zero (the partial-failure budget of a slack of 1) is below
    // one token too.
    (rule.capacity() as f64 * slack / f64::from(gateways.max(1))) < 1.0
}

/// A rule's bucket scaled to `slack / gateways` of its capacity and rate.
/// The capacity is rounded down, to one token at least (see rl-client's
/// notes on shares below one token, client/src/fallback.rs). The rate `refill / period` is
/// rescaled as `refill x k / (period x k / share)` with k up to 1000, so
/// rounding the new period costs at most 0.05% of the rate (a period that
/// would pass two years is capped there).
pub fn share(rule: &BucketParams, slack: f64, gateways: u32) -> BucketParams {
    let gateways = f64::from(gateways.max(1));
    // Divided last: exact whenever the share is a whole number of tokens.
    let capacity = (rule.capacity() as f64 * slack / gateways).floor().clamp(1.0, MAX_TOKENS as f64) as u64;
    // A slack of zero (no partial-failure budget): one token, at the slowest rate.
    let share = (slack / gateways).max(f64::MIN_POSITIVE);
    let room_in_period = (MAX_PERIOD_MS as f64 * share / rule.period_ms() as f64) as u64;
    let k = (MAX_TOKENS / rule.refill()).min(1000).min(room_in_period).max(1);
    let period = (rule.period_ms() as f64 * k as f64 / share).round().clamp(1.0, MAX_PERIOD_MS as f64) as u64;
    // Every value is clamped into range; the rule itself is a safe answer.
    BucketParams::new(capacity, rule.refill() * k, period).unwrap_or(*rule)
}
