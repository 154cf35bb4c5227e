//! The RLS front's limits while Redis cannot answer, for those that fail
//! open (`failure_mode: allow`, the default): a local token bucket per
//! counter at this relay's share of the limit (rl-core's `fallback::share`
//! of `--relays`), as a gateway's fallback is at its share:
//!
//! - a token bucket admits at most `max(capacity, relays)` at once, then
//!   its rate, fleet-wide;
//! - a window's stand-in holds half of the relay's share and refills the
//!   other half over a window, so at most the limit fleet-wide in any
//!   window; a window whose half share is below one token refuses.
//!
//! Bounded: at most `max_entries` counters; a new one takes the place of
//! one drawn at random (which starts full again if it comes back: one more
//! local burst, under heavy churn during an outage).

use indexmap::IndexMap;
use rl_core::fallback::{below_one_token, share};
use rl_core::{acquire_in_place, BucketParams, BucketState, Reply};

#[derive(Debug)]
pub struct Fallback {
    relays: u32,
    max_entries: usize,
    table: IndexMap<String, (BucketParams, Option<BucketState>)>,
    seed: u64,
}

/// What a limit is, for its stand-in.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Bucket(BucketParams),
    /// `limit` per `window_ms`.
    Window {
        limit: u64,
        window_ms: u64,
    },
}

impl Fallback {
    pub fn new(relays: u32, max_entries: usize) -> Fallback {
        Fallback { relays: relays.max(1), max_entries: max_entries.max(1), table: IndexMap::new(), seed: 0x9e37_79b9 }
    }

    /// The stand-in of `kind`; None for a window whose share is below one
    /// token (it refuses).
    fn stand_in(&self, kind: Kind) -> Option<BucketParams> {
        match kind {
            Kind::Bucket(params) => Some(share(&params, 1.0, self.relays)),
            Kind::Window { limit, window_ms } => {
                let rule = BucketParams::new(limit, limit, window_ms).ok()?;
                (!below_one_token(&rule, 0.5, self.relays)).then(|| share(&rule, 0.5, self.relays))
            }
        }
    }

    /// Takes `cost` from `key`'s stand-in at `now_ms` (a monotonic clock).
    pub fn take(&mut self, key: &str, kind: Kind, cost: u64, now_ms: u64) -> Reply {
        let Some(params) = self.stand_in(kind) else {
            return Reply { granted: 0, remaining: 0, retry_after_ms: -1, reset_after_ms: 0, limit: 0, binding: 0 };
        };
        if !self.table.contains_key(key) && self.table.len() >= self.max_entries {
            let victim = (crate::pool::xorshift(&mut self.seed) % self.table.len() as u64) as usize;
            self.table.swap_remove_index(victim);
        }
        let entry = self.table.entry(key.to_string()).or_insert((params, None));
        if entry.0 != params {
            *entry = (params, None);
        }
        let (params, state) = entry;
        let states = std::slice::from_mut(state);
        if cost == 0 {
            return rl_core::peek(std::slice::from_ref(params), states, 1, 1, now_ms);
        }
        acquire_in_place(std::slice::from_ref(params), states, cost, cost, now_ms)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_stand_in_admits_at_most_the_relays_share_in_a_window() {
        let mut f = Fallback::new(2, 10);
        let window = Kind::Window { limit: 100, window_ms: 1000 };
        let admitted = (0..1000).filter(|i| f.take("k", window, 1, *i).granted > 0).count();
        // Half of the relay's share (25) at once, the other half refilled
        // over the window.
        assert!((45..=50).contains(&admitted), "{admitted}");
        let tiny = Kind::Window { limit: 3, window_ms: 1000 };
        assert_eq!(f.take("t", tiny, 1, 0).granted, 0, "below one token: refused");
    }

    #[test]
    fn the_table_is_bounded() {
        let mut f = Fallback::new(1, 3);
        let bucket = Kind::Bucket(BucketParams::new(10, 10, 1000).unwrap());
        for i in 0..10 {
            assert_eq!(f.take(&format!("k{i}"), bucket, 1, 0).granted, 1);
        }
        assert_eq!(f.len(), 3);
    }
}
