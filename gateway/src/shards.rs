//! Which shard serves a slot, so each shard has its own circuit breaker:
//! one bad shard degrades only its own subjects.
//!
//! A standalone server is one shard. A cluster's slot map is read with
//! CLUSTER SLOTS when first needed and every `refresh_ms` after; until it is
//! known, every slot shares one breaker. A shard keeps its breaker across
//! refreshes while the same primary serves it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rl_client::internal::{slot_of, Breaker, Ticket, SLOTS};

struct Table {
    /// Index into `breakers` per slot; empty when all slots share breakers[0].
    slots: Vec<u16>,
    breakers: Vec<(String, Arc<Breaker>)>,
}

pub(crate) struct Shards {
    /// Swapped whole on a refresh; read without a lock.
    table: ArcSwap<Table>,
    /// A standalone server's one breaker (also in the table, never swapped):
    /// asked on the request path without loading the table.
    standalone: Option<Arc<Breaker>>,
    cluster: bool,
    trip_after: u32,
    open_for_ms: u64,
    failure_rate: f64,
    refresh_ms: u64,
    next_refresh_ms: AtomicU64,
    refreshing: AtomicBool,
}

impl Shards {
    pub(crate) fn new(cluster: bool, trip_after: u32, open_for_ms: u64, failure_rate: f64, refresh_ms: u64) -> Shards {
        let name = if cluster { "unknown" } else { "standalone" };
        let breaker = Arc::new(Breaker::new(trip_after, open_for_ms, failure_rate));
        let table = Table { slots: Vec::new(), breakers: vec![(name.to_string(), breaker.clone())] };
        Shards {
            table: ArcSwap::from_pointee(table),
            standalone: (!cluster).then_some(breaker),
            cluster,
            trip_after,
            open_for_ms,
            failure_rate,
            refresh_ms,
            next_refresh_ms: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
        }
    }

    /// The breaker of the shard serving `slot` (calls ask [`Shards::admit`]).
    #[cfg(test)]
    fn breaker(&self, slot: u16) -> Arc<Breaker> {
        let t = self.table.load();
        let i = t.slots.get(slot as usize).copied().unwrap_or(0) as usize;
        t.breakers
            .get(i)
            .or(t.breakers.first())
            .map(|(_, b)| b.clone())
            .unwrap_or_else(|| Arc::new(Breaker::new(self.trip_after, self.open_for_ms, self.failure_rate)))
    }

    /// Whether the breaker of the shard serving hash tag `tag` refuses
    /// every call at `now_ms` (see [`Breaker::refuses`]).
    pub(crate) fn refuses(&self, tag: &str, now_ms: u64) -> bool {
        match &self.standalone {
            Some(breaker) => breaker.refuses(now_ms),
            None => Shards::of(&self.table.load(), tag).is_some_and(|b| b.refuses(now_ms)),
        }
    }

    /// Whether a call on the keys of hash tag `tag` (a subject) may go to
    /// its shard at `now_ms`: the shard's breaker and the ticket to report
    /// the outcome with, or `None` while the breaker is open. Asked before
    /// a call is built.
    pub(crate) fn admit(&self, tag: &str, now_ms: u64) -> Option<(Arc<Breaker>, Ticket)> {
        let admit = |breaker: &Arc<Breaker>| {
            let ticket = breaker.admit(now_ms)?;
            Some((breaker.clone(), ticket))
        };
        match &self.standalone {
            Some(breaker) => admit(breaker),
            None => admit(Shards::of(&self.table.load(), tag)?),
        }
    }

    /// Which shard serves hash tag `tag` (an index, the same for every tag
    /// on that primary), or `None` in a cluster whose slot map is not known
    /// yet: calls are then sent slot by slot.
    pub(crate) fn shard_of(&self, tag: &str) -> Option<usize> {
        if self.standalone.is_some() {
            return Some(0);
        }
        let t = self.table.load();
        (!t.slots.is_empty()).then(|| t.slots.get(slot_of(tag) as usize).copied().unwrap_or(0) as usize)
    }

    /// The breaker of the shard serving hash tag `tag`; the tag is hashed
    /// only when the slot map is known. Never `None`: a table is made with
    /// one breaker and replaced only by a non-empty map.
    fn of<'t>(t: &'t Table, tag: &str) -> Option<&'t Arc<Breaker>> {
        let slot = if t.slots.is_empty() { 0 } else { slot_of(tag) };
        let i = t.slots.get(slot as usize).copied().unwrap_or(0) as usize;
        t.breakers.get(i).or(t.breakers.first()).map(|(_, b)| b)
    }

    /// Whether there is a slot map to read at all (a cluster).
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Whether the slot map should be read now; if so, the caller reads it
    /// and reports with `installed` or `failed`.
    pub(crate) fn refresh_due(&self, now_ms: u64) -> bool {
        self.cluster
            && now_ms >= self.next_refresh_ms.load(Ordering::Relaxed)
            && !self.refreshing.swap(true, Ordering::AcqRel)
    }

    /// Whether a slot map read is under way.
    pub(crate) fn is_refreshing(&self) -> bool {
        self.refreshing.load(Ordering::Acquire)
    }

    /// Installs a slot map `(first, last, primary)`.
    pub(crate) fn installed(&self, ranges: &[(u16, u16, String)], now_ms: u64) {
        let old = self.table.load_full();
        let mut breakers: Vec<(String, Arc<Breaker>)> = Vec::new();
        let mut slots = vec![0u16; SLOTS];
        for (first, last, primary) in ranges {
            let i = match breakers.iter().position(|(name, _)| name == primary) {
                Some(i) => i,
                None => {
                    let kept = old.breakers.iter().find(|(name, _)| name == primary).map(|(_, b)| b.clone());
                    breakers.push((
                        primary.clone(),
                        kept.unwrap_or_else(|| {
                            Arc::new(Breaker::new(self.trip_after, self.open_for_ms, self.failure_rate))
                        }),
                    ));
                    breakers.len() - 1
                }
            };
            let range = *first as usize..=(*last as usize).min(SLOTS - 1);
            if let Some(slots) = slots.get_mut(range) {
                slots.fill(i as u16);
            }
        }
        if !breakers.is_empty() {
            self.table.store(Arc::new(Table { slots, breakers }));
        }
        self.next_refresh_ms.store(now_ms.saturating_add(self.refresh_ms), Ordering::Relaxed);
        self.refreshing.store(false, Ordering::Release);
    }

    /// The slot map could not be read: try again within a second.
    pub(crate) fn failed(&self, now_ms: u64) {
        self.next_refresh_ms.store(now_ms.saturating_add(self.refresh_ms.min(1000)), Ordering::Relaxed);
        self.refreshing.store(false, Ordering::Release);
    }

    /// Every known shard (by primary address) and whether its breaker is
    /// open at `now_ms`.
    pub(crate) fn states(&self, now_ms: u64) -> Vec<(String, bool)> {
        self.table.load().breakers.iter().map(|(name, b)| (name.clone(), b.is_open(now_ms))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_is_one_shard_and_never_refreshes() {
        let s = Shards::new(false, 1, 1000, 1.0, 10_000);
        assert!(Arc::ptr_eq(&s.breaker(0), &s.breaker(16_383)));
        assert!(!s.refresh_due(0));
    }

    #[test]
    fn a_cluster_has_a_breaker_per_primary() {
        let s = Shards::new(true, 1, 1000, 1.0, 10_000);
        assert!(s.refresh_due(0));
        assert!(!s.refresh_due(0), "one refresh at a time");
        let map = [(0, 5460, "a:1".to_string()), (5461, 10922, "b:1".to_string()), (10923, 16383, "a:1".to_string())];
        s.installed(&map, 0);
        assert!(Arc::ptr_eq(&s.breaker(0), &s.breaker(16_000)));
        assert!(!Arc::ptr_eq(&s.breaker(0), &s.breaker(6000)));
        let b = s.breaker(6000);
        b.failure(b.admit(5).unwrap(), 5);
        assert_eq!(s.states(6), [("a:1".to_string(), false), ("b:1".to_string(), true)]);
        // A refresh keeps the breaker of a primary that still serves.
        assert!(!s.refresh_due(9_999) && s.refresh_due(10_000));
        s.installed(&map, 10_000);
        assert_eq!(s.states(7)[1], ("b:1".to_string(), true));
    }

    #[test]
    fn a_call_is_admitted_by_its_subjects_shard() {
        let s = Shards::new(true, 1, 1000, 1.0, 10_000);
        let (b, _) = s.admit("foo", 0).expect("closed");
        assert!(Arc::ptr_eq(&b, &s.breaker(0)), "until the map is known, one breaker for all");
        // "somekey" hashes to slot 11058, "foo" to 12182.
        s.installed(&[(0, 11_999, "a:1".to_string()), (12_000, 16_383, "b:1".to_string())], 0);
        let (b, ticket) = s.admit("foo", 0).expect("closed");
        assert!(Arc::ptr_eq(&b, &s.breaker(12_182)));
        assert!(b.failure(ticket, 1));
        assert!(s.admit("foo", 2).is_none(), "its shard's breaker is open");
        assert!(s.admit("somekey", 2).is_some(), "the other shard's is not");
        assert!(s.admit("foo", 1001).is_some(), "the probe");
    }

    #[test]
    fn a_failed_refresh_is_retried_soon() {
        let s = Shards::new(true, 1, 1000, 1.0, 10_000);
        assert!(s.refresh_due(0));
        s.failed(0);
        assert!(!s.refresh_due(999) && s.refresh_due(1000));
    }
}
