//! The RLS front's limits while Redis cannot answer, for those that fail
//! open (`failure_mode: allow`, the default). A stall is not an outage:
//! each limit starts from what Redis last said of it, never from a full
//! bucket.
//!
//! - Every answer Redis gives is a reading ([`Fallback::reading`]): the
//!   room it said the limit had. This relay's part of it (room /
//!   `--relays`) is what the fallback may spend, less what it admitted
//!   since. A reading never raises what is left: the lower stands (a
//!   reading taken before the fallback's own admissions reached Redis
//!   would count them again).
//! - A token bucket's stand-in is a local bucket at this relay's share of
//!   the limit (rl-core's `fallback::share` of `--relays`), as a gateway's
//!   fallback is at its share; its level is the lower of its own and the
//!   last reading's, refilled at the share's rate since.
//! - A window's last reading holds until the window ends (a sliding or
//!   exact window: until its reset, at most a window): only the room left
//!   is admitted, nothing refills. Past that, or with no reading, the
//!   stand-in holds half of the relay's share and refills the other half
//!   over a window, so at most the limit fleet-wide in any window; a
//!   window whose half share is below one token refuses.
//!
//! Calls on their way to Redis ([`Fallback::sent`]) may take room no
//! reading shows yet: the fallback keeps their cost aside, its own call's
//! too (under by a request's cost, never over). Through a stall (a
//! decision's deadline passed while its call waits at Redis, which counts
//! it when the stall ends) the fallback so admits no more than Redis had
//! left. Through an outage, at most that room plus what the stand-ins
//! refill (docs/error-bounds.md).
//!
//! Bounded: at most `max_entries` limits; a new one takes the place of one
//! drawn at random (which starts from its stand-in if it comes back: one
//! more local burst, under heavy churn during an outage).

use indexmap::IndexMap;
use rl_core::fallback::{below_one_token, share};
use rl_core::{acquire_in_place, BucketParams, BucketState, Reply};

#[derive(Debug)]
pub struct Fallback {
    relays: u32,
    max_entries: usize,
    table: IndexMap<String, Entry>,
    seed: u64,
}

/// What a limit is, for its stand-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bucket(BucketParams),
    /// `limit` per `window_ms`.
    Window {
        limit: u64,
        window_ms: u64,
    },
}

#[derive(Debug)]
struct Entry {
    kind: Kind,
    /// The stand-in bucket's level.
    state: Option<BucketState>,
    /// A window's room as last read, while it holds.
    known: Option<Known>,
    /// The cost of the calls on their way to Redis.
    in_flight: u64,
}

/// This relay's part of a window's room, and until when.
#[derive(Clone, Copy, Debug)]
struct Known {
    left: u64,
    until_ms: u64,
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

    /// `key`'s entry for `kind` (a changed limit starts afresh). Called on
    /// every Redis answer: a key already held is found without allocating.
    fn entry(&mut self, key: &str, kind: Kind) -> &mut Entry {
        let index = match self.table.get_index_of(key) {
            Some(index) => index,
            None => {
                if self.table.len() >= self.max_entries {
                    let victim = (crate::pool::xorshift(&mut self.seed) % self.table.len() as u64) as usize;
                    self.table.swap_remove_index(victim);
                }
                let fresh = Entry { kind, state: None, known: None, in_flight: 0 };
                self.table.insert_full(key.to_string(), fresh).0
            }
        };
        let entry = &mut self.table[index];
        if entry.kind != kind {
            *entry = Entry { kind, state: None, known: None, in_flight: entry.in_flight };
        }
        entry
    }

    /// A call that may take `cost` of `key`'s limit is on its way to Redis.
    pub fn sent(&mut self, key: &str, kind: Kind, cost: u64) {
        let entry = self.entry(key, kind);
        entry.in_flight = entry.in_flight.saturating_add(cost);
    }

    /// That call came back, `cost` no longer on its way (0: none was), with
    /// Redis's `(room, reset_after_ms)` if it answered: one look-up.
    pub fn returned(&mut self, key: &str, kind: Kind, cost: u64, reading: Option<(u64, u64)>, now_ms: u64) {
        match reading {
            Some((room, reset_after_ms)) => self.reading(key, kind, cost, room, reset_after_ms, now_ms),
            None => {
                if let Some(entry) = self.table.get_mut(key) {
                    entry.in_flight = entry.in_flight.saturating_sub(cost);
                }
            }
        }
    }

    /// Redis said, as of `now_ms` (a monotonic clock), that `key`'s limit
    /// had `room` left (a window's reading holds `reset_after_ms`), in
    /// answer to a call of `returned` cost (0: a reading from elsewhere).
    pub fn reading(&mut self, key: &str, kind: Kind, returned: u64, room: u64, reset_after_ms: u64, now_ms: u64) {
        let part = room / u64::from(self.relays);
        let stand_in = self.stand_in(kind);
        let entry = self.entry(key, kind);
        entry.in_flight = entry.in_flight.saturating_sub(returned);
        match kind {
            Kind::Bucket(_) => {
                let Some(params) = stand_in else { return };
                let tokens = i64::try_from(part).unwrap_or(i64::MAX).min(params.capacity() as i64);
                let read = BucketState { tokens, fraction: 0, updated_ms: now_ms };
                if params.level_at(Some(&read), now_ms) < params.level_at(entry.state.as_ref(), now_ms) {
                    entry.state = Some(read);
                }
            }
            Kind::Window { window_ms, .. } => {
                let until_ms = now_ms.saturating_add(reset_after_ms.clamp(1, window_ms));
                entry.known = match entry.known.filter(|k| now_ms < k.until_ms) {
                    // The same window: the lower room and the earlier end.
                    Some(k) if until_ms <= k.until_ms.saturating_add(window_ms / 2) => {
                        Some(Known { left: k.left.min(part), until_ms: k.until_ms.min(until_ms) })
                    }
                    _ => Some(Known { left: part, until_ms }),
                };
            }
        }
    }

    /// Takes `cost` (0: only looks) from `key`'s limit at `now_ms` (a
    /// monotonic clock), keeping aside what is on its way to Redis (with
    /// `also_in_flight`, calls this table was not told of): from a window's
    /// reading while it holds, else from the stand-in.
    pub fn take(&mut self, key: &str, kind: Kind, cost: u64, also_in_flight: u64, now_ms: u64) -> Reply {
        let stand_in = self.stand_in(kind);
        let entry = self.entry(key, kind);
        let aside = entry.in_flight.saturating_add(also_in_flight);
        if let Some(known) = entry.known.as_mut().filter(|k| now_ms < k.until_ms) {
            let reset_after_ms = known.until_ms - now_ms;
            let granted = u64::from(known.left >= cost.saturating_add(aside));
            if granted > 0 {
                known.left -= cost;
            }
            let retry_after_ms = if granted > 0 { 0 } else { reset_after_ms as i64 };
            return Reply { granted, remaining: known.left, retry_after_ms, reset_after_ms, limit: 0, binding: 0 };
        }
        let Some(params) = stand_in else {
            return Reply { granted: 0, remaining: 0, retry_after_ms: -1, reset_after_ms: 0, limit: 0, binding: 0 };
        };
        let states = std::slice::from_mut(&mut entry.state);
        if cost == 0 {
            return rl_core::peek(std::slice::from_ref(&params), states, 1, 1, now_ms);
        }
        let need = cost.saturating_add(aside);
        if params.level_at(states[0].as_ref(), now_ms) < i128::from(need) * i128::from(params.period_ms()) {
            // Refused: the room is spoken for by the calls on their way.
            let r = rl_core::peek(std::slice::from_ref(&params), states, need, need, now_ms);
            return Reply { granted: 0, ..r };
        }
        acquire_in_place(std::slice::from_ref(&params), states, cost, cost, now_ms)
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
        let admitted = (0..1000).filter(|i| f.take("k", window, 1, 0, *i).granted > 0).count();
        // Half of the relay's share (25) at once, the other half refilled
        // over the window.
        assert!((45..=50).contains(&admitted), "{admitted}");
        let tiny = Kind::Window { limit: 3, window_ms: 1000 };
        assert_eq!(f.take("t", tiny, 1, 0, 0).granted, 0, "below one token: refused");
    }

    #[test]
    fn the_table_is_bounded() {
        let mut f = Fallback::new(1, 3);
        let bucket = Kind::Bucket(BucketParams::new(10, 10, 1000).unwrap());
        for i in 0..10 {
            assert_eq!(f.take(&format!("k{i}"), bucket, 1, 0, 0).granted, 1);
        }
        assert_eq!(f.len(), 3);
    }
}

#[cfg(test)]
mod readings {
    use super::*;

    #[test]
    fn a_bucket_starts_from_its_last_reading_and_refills_at_its_rate() {
        let mut f = Fallback::new(1, 10);
        let bucket = Kind::Bucket(BucketParams::new(100, 100, 60_000).unwrap());
        f.reading("k", bucket, 0, 2, 0, 1_000);
        let admitted = (0..10).filter(|_| f.take("k", bucket, 1, 0, 1_000).granted > 0).count();
        assert_eq!(admitted, 2);
        // 600 ms later, one more token.
        assert_eq!(f.take("k", bucket, 1, 0, 1_600).granted, 1);
        assert_eq!(f.take("k", bucket, 1, 0, 1_600).granted, 0);
        // A reading never raises the level: the lower stands.
        f.reading("k", bucket, 0, 50, 0, 1_600);
        assert_eq!(f.take("k", bucket, 1, 0, 1_600).granted, 0);
    }
}
