//! In-flight limits: at most `limit` requests at once, each holding a slot
//! until it is released or its deadline passes.
//!
//! A key holds the slots in flight, each an id (the caller's request id, or
//! one the module made), a deadline on the server's clock and a count (a
//! request that weighs `COST n` holds n). Every call first leaves out the
//! slots past their deadline: a holder that crashed before releasing heals
//! by itself once its timeout has passed, and those slots are the lost
//! releases an operator alarms on.
//!
//! An acquire with an id that already holds a slot replaces that slot (a new
//! deadline and count): renewing a long upload never takes a second slot.

use smallvec::SmallVec;

use crate::combine::{Check, Outcome, Update, INLINE, NEVER};
use crate::limits::{
    in_range, latest_period_end_ms, latest_reading_ms, ParamError, MAX_PERIOD_MS, MAX_TIME_MS, MAX_WAIT_MS,
};

/// Hard ceiling of an in-flight limit (and of the slots a key holds): the
/// module's configurable maximum can be raised up to this and no further.
pub const MAX_INFLIGHT_LIMIT: u64 = 100_000;
/// Default maximum in-flight limit, changeable with a module option.
pub const DEFAULT_INFLIGHT_LIMIT: u64 = 10_000;
/// Longest id a slot may have, in bytes.
pub const MAX_ID_LEN: usize = 64;

/// A validated in-flight limit: at most `limit` in flight, each slot held
/// at most `timeout_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InflightParams {
    limit: u64,
    timeout_ms: u64,
}

impl InflightParams {
    /// `max_limit` is the server's configured maximum (at most MAX_INFLIGHT_LIMIT).
    pub fn new(limit: u64, timeout_ms: u64, max_limit: u64) -> Result<Self, ParamError> {
        Ok(Self {
            limit: in_range("limit", limit, 1, max_limit.min(MAX_INFLIGHT_LIMIT))?,
            timeout_ms: in_range("timeout_ms", timeout_ms, 1, MAX_PERIOD_MS)?,
        })
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }
}

/// An id a slot can have: 1 to MAX_ID_LEN bytes.
pub fn valid_id(id: &[u8]) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len())
}

/// One slot: `count` requests of `id`, held until `deadline_ms`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub id: Box<[u8]>,
    pub deadline_ms: u64,
    pub count: u64,
}

/// What an in-flight key stores: its slots, in no particular order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Slots {
    slots: Vec<Slot>,
}

/// Why a stored or replicated set of slots was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotsError {
    /// More slots than any key may hold.
    Length,
    /// An empty or too long id, a count of 0 or too large, a time out of range.
    Slot,
    /// One id twice.
    Repeated,
    /// No slot at all: the module deletes an emptied set, so never writes one.
    Empty,
    /// A deadline later than the longest timeout from the reading server's
    /// clock (and a day of clock difference).
    Deadline,
    /// `expired_at` (a clock reading) more than a day ahead of the reading
    /// server's clock.
    Ahead,
}

impl std::fmt::Display for SlotsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SlotsError::Length => "more slots than an in-flight key may hold",
            SlotsError::Slot => "slot id, deadline or count out of range",
            SlotsError::Repeated => "an id holds two slots",
            SlotsError::Empty => "no slot (the module deletes an empty in-flight set, so never writes one)",
            SlotsError::Deadline => "slot deadline later than the longest timeout from this server's clock and a day",
            SlotsError::Ahead => "expired_at more than a day ahead of this server's clock",
        })
    }
}

/// The effect of one call on a key, deterministic given the key it is
/// applied to: leave out the slots whose deadline is at or before
/// `expired_at_ms`, then give `id` a slot of `count` until `deadline_ms`
/// (count 0: release it). This is what replicas and the AOF receive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub expired_at_ms: u64,
    /// Inline up to 32 bytes (the ids the module makes): a change costs no
    /// allocation of its own.
    pub id: SmallVec<[u8; 32]>,
    pub deadline_ms: u64,
    pub count: u64,
}

impl Change {
    /// Whether a server whose clock reads `now_ms` could have made this
    /// change: `expired_at` is a clock reading, the deadline a reading plus
    /// a timeout.
    pub fn fits_clock(&self, now_ms: u64) -> Result<(), SlotsError> {
        if self.expired_at_ms > latest_reading_ms(now_ms) {
            return Err(SlotsError::Ahead);
        }
        if self.count > 0 && self.deadline_ms > latest_period_end_ms(now_ms) {
            return Err(SlotsError::Deadline);
        }
        Ok(())
    }
}

impl Slots {
    pub fn from_slots(slots: Vec<Slot>) -> Result<Slots, SlotsError> {
        if slots.len() as u64 > MAX_INFLIGHT_LIMIT {
            return Err(SlotsError::Length);
        }
        if slots.iter().any(|s| !valid_slot(&s.id, s.deadline_ms, s.count)) {
            return Err(SlotsError::Slot);
        }
        let mut ids: Vec<&[u8]> = slots.iter().map(|s| &*s.id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(SlotsError::Repeated);
        }
        Ok(Slots { slots })
    }

    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Bytes held on the heap, for MEMORY USAGE.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>() + self.slots.iter().map(|s| s.id.len()).sum::<usize>()
    }

    /// Requests in flight at `now_ms`, leaving out `id`'s own slot.
    fn live_count(&self, now_ms: u64, id: &[u8]) -> u64 {
        self.live(now_ms).filter(|s| &*s.id != id).map(|s| s.count).sum()
    }

    fn live(&self, now_ms: u64) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(move |s| s.deadline_ms > now_ms)
    }

    /// Whether `id` holds a live slot at `now_ms`.
    pub fn holds(&self, id: &[u8], now_ms: u64) -> bool {
        self.live(now_ms).any(|s| &*s.id == id)
    }

    /// The latest deadline, if any slot is left: the key's expiry.
    pub fn latest_deadline_ms(&self) -> Option<u64> {
        self.slots.iter().map(|s| s.deadline_ms).max()
    }

    /// Slots past their deadline at `now_ms`: releases that never came.
    pub fn expired(&self, now_ms: u64) -> u64 {
        self.slots.iter().filter(|s| s.deadline_ms <= now_ms).count() as u64
    }

    /// Whether a server whose clock reads `now_ms` could hold this set:
    /// not empty, and no deadline past the longest timeout from its clock.
    pub fn fits_clock(&self, now_ms: u64) -> Result<(), SlotsError> {
        match self.latest_deadline_ms() {
            None => Err(SlotsError::Empty),
            Some(d) if d > latest_period_end_ms(now_ms) => Err(SlotsError::Deadline),
            Some(_) => Ok(()),
        }
    }

    /// Whether `c` can be applied (what the RDB loader would accept after).
    pub fn accepts(&self, c: &Change) -> Result<(), SlotsError> {
        if !valid_id(&c.id) || c.expired_at_ms > MAX_TIME_MS {
            return Err(SlotsError::Slot);
        }
        if c.count > 0 && !valid_slot(&c.id, c.deadline_ms, c.count) {
            return Err(SlotsError::Slot);
        }
        let kept = self.live(c.expired_at_ms).filter(|s| *s.id != *c.id).count();
        if (kept + usize::from(c.count > 0)) as u64 > MAX_INFLIGHT_LIMIT {
            return Err(SlotsError::Length);
        }
        Ok(())
    }

    /// Applies a change if `accepts` says yes; returns how many slots it
    /// left out as expired.
    pub fn apply(&mut self, c: &Change) -> Result<u64, SlotsError> {
        self.accepts(c)?;
        let before = self.slots.len();
        self.slots.retain(|s| s.deadline_ms > c.expired_at_ms);
        let expired = (before - self.slots.len()) as u64;
        match self.slots.iter_mut().find(|s| *s.id == *c.id) {
            // A renewal reuses the slot (and its id's allocation).
            Some(slot) if c.count > 0 => (slot.deadline_ms, slot.count) = (c.deadline_ms, c.count),
            Some(_) => self.slots.retain(|s| *s.id != *c.id),
            None if c.count > 0 => {
                self.slots.push(Slot { id: c.id[..].into(), deadline_ms: c.deadline_ms, count: c.count })
            }
            None => {}
        }
        if self.slots.capacity() > 16 && self.slots.len() < self.slots.capacity() / 4 {
            self.slots.shrink_to(self.slots.len() * 2);
        }
        Ok(expired)
    }
}

fn valid_slot(id: &[u8], deadline_ms: u64, count: u64) -> bool {
    valid_id(id) && deadline_ms <= MAX_TIME_MS && (1..=MAX_INFLIGHT_LIMIT).contains(&count)
}

/// One key's view of `id` taking `cost` slots at `now_ms`.
fn check(p: &InflightParams, slots: Option<&Slots>, id: &[u8], cost: u64, now_ms: u64) -> Check {
    let empty = Slots::default();
    let slots = slots.unwrap_or(&empty);
    let others = slots.live_count(now_ms, id);
    let admits = others + cost <= p.limit;
    let wait = |until: u64| until.saturating_sub(now_ms).min(MAX_WAIT_MS);
    let wait_ms = if cost > p.limit {
        NEVER
    } else if admits {
        0
    } else {
        // The earliest deadlines free their slots first.
        let mut deadlines: SmallVec<[(u64, u64); 32]> =
            slots.live(now_ms).filter(|s| &*s.id != id).map(|s| (s.deadline_ms, s.count)).collect();
        deadlines.sort_unstable();
        let excess = others + cost - p.limit;
        let mut freed = 0;
        let until = deadlines.iter().find(|(_, n)| {
            freed += n;
            freed >= excess
        });
        until.map_or(0, |(t, _)| wait(*t)) as i64
    };
    let latest = slots.live(now_ms).map(|s| s.deadline_ms).max().unwrap_or(now_ms);
    Check {
        admits,
        limit: p.limit,
        remaining_now: p.limit.saturating_sub(others),
        remaining_after: p.limit.saturating_sub(others + cost),
        wait_ms,
        reset_now_ms: wait(latest),
        reset_after_ms: wait(latest.max(now_ms + p.timeout_ms)),
    }
}

/// Several in-flight limits decided together at `now_ms`: `id` gets `cost`
/// slots in every key (each until now + its timeout), or in none.
pub fn acquire(
    limits: &[InflightParams],
    sets: &[Option<&Slots>],
    id: &[u8],
    cost: u64,
    now_ms: u64,
) -> Outcome<Change> {
    let checks: SmallVec<[Check; INLINE]> =
        limits.iter().zip(sets).map(|(p, s)| check(p, *s, id, cost, now_ms)).collect();
    Outcome::of(&checks, cost, now_ms, |i| {
        let deadline_ms = now_ms + limits[i].timeout_ms;
        let latest = sets[i].and_then(|s| s.live(now_ms).filter(|s| &*s.id != id).map(|s| s.deadline_ms).max());
        Update::Store {
            state: Change { expired_at_ms: now_ms, id: SmallVec::from_slice(id), deadline_ms, count: cost },
            expires_at_ms: latest.unwrap_or(0).max(deadline_ms),
        }
    })
}

/// The `in_flight` an acquire answers for the key `set` (its binding key):
/// the requests in flight there after the call when `admitted` (`id`'s
/// earlier slot replaced by `cost`), else now, `id`'s own slot included.
/// The count RL.INSPECT shows, above the limit too (slots taken before the
/// limit was lowered stay until released or their deadline).
pub fn in_flight(set: Option<&Slots>, id: &[u8], cost: u64, admitted: bool, now_ms: u64) -> u64 {
    let Some(set) = set else { return if admitted { cost } else { 0 } };
    if admitted {
        set.live_count(now_ms, id) + cost
    } else {
        set.live(now_ms).map(|s| s.count).sum()
    }
}

/// Releases `id`'s slot in each key that holds it live at `now_ms`. A key
/// left with no live slot is removed; a key where `id` holds nothing is not
/// touched (so a release never makes room that was not taken).
pub fn release(sets: &[Option<&Slots>], id: &[u8], now_ms: u64) -> SmallVec<[Option<Update<Change>>; INLINE]> {
    sets.iter()
        .map(|s| {
            let s = (*s)?;
            if !s.holds(id, now_ms) {
                return None;
            }
            let left = s.live(now_ms).filter(|s| &*s.id != id).map(|s| s.deadline_ms).max();
            Some(match left {
                None => Update::Remove,
                Some(latest) => Update::Store {
                    state: Change { expired_at_ms: now_ms, id: SmallVec::from_slice(id), deadline_ms: 0, count: 0 },
                    expires_at_ms: latest,
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(limit: u64, timeout: u64) -> InflightParams {
        InflightParams::new(limit, timeout, MAX_INFLIGHT_LIMIT).unwrap()
    }

    /// Runs an acquire and applies it; returns (allowed, in flight, retry).
    fn take(limits: &[InflightParams], sets: &mut [Slots], id: &str, cost: u64, now: u64) -> (bool, u64, i64) {
        let before = sets.to_vec();
        let views: Vec<Option<&Slots>> = sets.iter().map(Some).collect();
        let out = acquire(limits, &views, id.as_bytes(), cost, now);
        for (s, u) in sets.iter_mut().zip(&out.updates) {
            if let Update::Store { state, .. } = u {
                s.apply(state).unwrap();
            }
        }
        let d = out.decision;
        let held = in_flight(Some(&before[d.binding]), id.as_bytes(), cost, d.allowed(), now);
        (d.allowed(), held, d.retry_after_ms)
    }

    #[test]
    fn params_are_checked() {
        assert_eq!(InflightParams::new(0, 1, 10).unwrap_err().field, "limit");
        assert_eq!(InflightParams::new(11, 1, 10).unwrap_err().max, 10);
        assert_eq!(InflightParams::new(1, 0, 10).unwrap_err().field, "timeout_ms");
        assert_eq!(InflightParams::new(1, 1, u64::MAX).unwrap().limit(), 1);
    }

    #[test]
    fn at_most_limit_in_flight_and_releases_make_room() {
        let l = [p(2, 1000)];
        let mut s = [Slots::default()];
        assert_eq!(take(&l, &mut s, "a", 1, 0), (true, 1, 0));
        assert_eq!(take(&l, &mut s, "b", 1, 10), (true, 2, 0));
        assert_eq!(take(&l, &mut s, "c", 1, 20), (false, 2, 980), "until a's deadline");
        let rel = release(&[Some(&s[0])], b"a", 30);
        let Some(Update::Store { state, expires_at_ms }) = &rel[0] else { panic!("{rel:?}") };
        assert_eq!(*expires_at_ms, 1010, "b's deadline");
        s[0].apply(state).unwrap();
        assert_eq!(take(&l, &mut s, "c", 1, 40), (true, 2, 0));
        // Unknown and released ids release nothing.
        assert_eq!(release(&[Some(&s[0])], b"a", 50)[0], None);
        assert_eq!(release(&[None], b"zz", 50)[0], None);
    }

    #[test]
    fn a_lost_release_heals_at_the_deadline() {
        let l = [p(1, 1000)];
        let mut s = [Slots::default()];
        assert!(take(&l, &mut s, "crashed", 1, 0).0);
        assert!(!take(&l, &mut s, "next", 1, 999).0);
        assert_eq!(s[0].expired(1000), 1);
        let views = [Some(&s[0])];
        let out = acquire(&l, &views, b"next", 1, 1000);
        assert!(out.decision.allowed());
        let Update::Store { state, .. } = &out.updates[0] else { panic!() };
        assert_eq!(s[0].apply(state), Ok(1), "the crashed holder's slot is counted as healed");
    }

    #[test]
    fn the_same_id_renews_its_slot() {
        let l = [p(2, 1000)];
        let mut s = [Slots::default()];
        assert!(take(&l, &mut s, "upload", 1, 0).0);
        assert!(take(&l, &mut s, "other", 1, 0).0);
        assert_eq!(take(&l, &mut s, "upload", 1, 900), (true, 2, 0), "renewed, not a second slot");
        assert_eq!(s[0].slots().iter().find(|s| &*s.id == b"upload").unwrap().deadline_ms, 1900);
        assert!(!take(&l, &mut s, "upload", 2, 950).0, "a renewal with more weight must fit");
    }

    #[test]
    fn in_flight_is_the_true_count_above_a_lowered_limit() {
        let mut s = [Slots::default()];
        for i in 0..20 {
            assert!(take(&[p(20, 1000)], &mut s, &format!("s{i}"), 1, i).0);
        }
        // 16 must reach their deadlines (the 16th at 1015) before one more fits.
        assert_eq!(take(&[p(5, 1000)], &mut s, "new", 1, 100), (false, 20, 915));
        assert_eq!(take(&[p(20, 1000)], &mut s, "s0", 2, 100), (false, 20, 901), "its own slot still held");
        assert_eq!(take(&[p(20, 1000)], &mut s, "s0", 1, 100), (true, 20, 0), "renewed in place");
        assert_eq!(in_flight(None, b"x", 3, true, 0), 3);
        assert_eq!(in_flight(None, b"x", 3, false, 0), 0);
    }

    #[test]
    fn all_or_nothing_across_keys_and_costs() {
        let l = [p(10, 1000), p(2, 5000)];
        let mut s = [Slots::default(), Slots::default()];
        assert!(take(&l, &mut s, "a", 2, 0).0);
        let (ok, _, retry) = take(&l, &mut s, "b", 1, 0);
        assert!(!ok);
        assert_eq!(retry, 5000);
        assert_eq!(s[0].slots().len(), 1, "the first key lost nothing to the refusal");
        assert_eq!(take(&l, &mut s, "big", 3, 0).2, NEVER, "more than a limit never fits");
    }

    #[test]
    fn sets_and_changes_are_bounded_by_the_reading_clock() {
        use crate::limits::MAX_CLOCK_AHEAD_MS as DAY;
        let now = 1_700_000_000_000;
        let longest = now + DAY + MAX_PERIOD_MS;
        let set = |d: u64| Slots::from_slots(vec![Slot { id: (*b"a").into(), deadline_ms: d, count: 1 }]).unwrap();
        assert_eq!(set(longest).fits_clock(now), Ok(()));
        assert_eq!(set(longest + 1).fits_clock(now), Err(SlotsError::Deadline));
        assert_eq!(Slots::default().fits_clock(now), Err(SlotsError::Empty));
        let change = |expired_at_ms, deadline_ms, count| Change {
            expired_at_ms,
            id: SmallVec::from_slice(b"a"),
            deadline_ms,
            count,
        };
        assert_eq!(change(now + DAY, longest, 1).fits_clock(now), Ok(()));
        assert_eq!(change(now + DAY + 1, longest, 1).fits_clock(now), Err(SlotsError::Ahead));
        assert_eq!(change(now, longest + 1, 1).fits_clock(now), Err(SlotsError::Deadline));
        assert_eq!(change(now, u64::MAX, 0).fits_clock(now), Ok(()), "a release has no deadline");
        // Every change the module makes fits the clock it was made at.
        let out = acquire(&[p(2, MAX_PERIOD_MS)], &[Some(&set(now + 5))], b"b", 1, now);
        let Update::Store { state, expires_at_ms } = &out.updates[0] else { panic!("{out:?}") };
        assert_eq!((state.fits_clock(now), *expires_at_ms), (Ok(()), now + MAX_PERIOD_MS));
    }

    #[test]
    fn stored_sets_are_checked() {
        let slot = |id: &str, d: u64, n: u64| Slot { id: id.as_bytes().into(), deadline_ms: d, count: n };
        assert!(Slots::from_slots(vec![slot("a", 1, 1), slot("b", 2, 3)]).is_ok());
        assert_eq!(Slots::from_slots(vec![slot("a", 1, 1), slot("a", 2, 1)]), Err(SlotsError::Repeated));
        assert_eq!(Slots::from_slots(vec![slot("", 1, 1)]), Err(SlotsError::Slot));
        assert_eq!(Slots::from_slots(vec![slot("a", 1, 0)]), Err(SlotsError::Slot));
        assert_eq!(Slots::from_slots(vec![slot("a", MAX_TIME_MS + 1, 1)]), Err(SlotsError::Slot));
        let long = "x".repeat(MAX_ID_LEN + 1);
        assert_eq!(Slots::from_slots(vec![slot(&long, 1, 1)]), Err(SlotsError::Slot));
    }
}
