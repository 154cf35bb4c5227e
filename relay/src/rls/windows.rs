//! The RLS front's windows in memory, pure (time a parameter): leases of
//! fixed windows and the deny cache of every window.
//!
//! A fixed window (envoyproxy/ratelimit's counter) is leased as a bucket
//! is: a batch is the relay's share of `lease_window` of the limit's rate
//! (`rl_core::lease::batch` of a bucket of the same rate), taken from the
//! window with one `RL.WINDOW ... COST batch FIXED` in the background and
//! spent from memory until the window ends. The window counted the batch
//! when it was taken, so tokens spent later are already counted: never
//! over. Tokens unspent when the window ends are lost (under, at most a
//! batch per relay and window). Held tokens end where Redis said the
//! window ends, measured from when the call was sent: never after the
//! window's end on Redis's clock.
//!
//! At most one lease call per window is on its way; meanwhile, and while
//! memory cannot pay, a request asks Redis for its own cost (exactly). A
//! batch Redis cannot give in full (the window is nearly spent) is asked
//! again at the room Redis said was left; once no room is left the window
//! is refused from memory until it ends.
//!
//! A refusal Redis named is remembered for every window (fixed, sliding,
//! exact), for costs as large or larger, until the retry time it named
//! (a fixed window's end) and at most `max_hold_ms`. Other callers only
//! take room, so until that time Redis would refuse it too; only refusals
//! are added: never over.
//!
//! What the local fallback admitted on a window is owed to it ([`Windows::owe`])
//! until the window ends: the late call that would have counted it may never
//! reach Redis (a connection dropped after timeouts in a row takes the calls
//! waiting on it with it). The next counts Redis grants pay for it first: a
//! lease brings that many tokens fewer, a request's own count is refused to
//! it. So the window admits no more than Redis counts (under by what was
//! counted twice, never over).
//!
//! The table is bounded (`max_subjects`): a new window takes the place of
//! the least recently used of a few sampled entries that have no call on
//! its way (tokens an evicted entry held are lost: under); if none is
//! free the request goes to Redis, exactly.

use indexmap::IndexMap;
use rl_core::deny::Denial;
use rl_core::Reply;

use crate::pool::Settings;

const EVICTION_SAMPLES: usize = 16;

/// A window: at most `limit` per `window_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub limit: u64,
    pub window_ms: u64,
    /// Leased in batches (fixed windows with a share of more than a token).
    pub leased: bool,
}

/// What to do with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Paid from memory.
    Paid { reply: Reply, lease: Option<u64> },
    /// Refused from memory: a refusal Redis named, still running.
    Refused { reply: Reply },
    /// Ask Redis for the request's cost.
    Exact { lease: Option<u64> },
    /// Memory cannot pay while a lease call is on its way: wait for it
    /// (asked beside it, Redis's answer could count the lease or not, and
    /// the room it shows would be off by it). One request per lease call
    /// waits: a lone caller's answers are exact.
    Wait,
}

impl Plan {
    /// The lease call to send in the background (`RL.WINDOW ... COST n`),
    /// then [`Windows::leased`].
    pub fn lease(&self) -> Option<u64> {
        match *self {
            Plan::Paid { lease, .. } | Plan::Exact { lease } => lease,
            Plan::Refused { .. } | Plan::Wait => None,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Entry {
    window: Option<Window>,
    tokens: u64,
    /// When the held tokens' window ends (local clock).
    ends_ms: u64,
    /// The room Redis last said its window had (an upper bound: only
    /// falls within a window), and until when that holds.
    room: Option<u64>,
    leasing: bool,
    /// A request waits for the lease call on its way (one at most: others
    /// ask Redis beside it, as before, and never wait a round trip more).
    waiter: bool,
    denied: Option<Denial>,
    /// When the refusal held in `denied` ends as Redis named it (its retry
    /// time, from when the call was sent): the retry a refusal from memory
    /// answers, never the hold (`max_hold_ms`, how long memory keeps it).
    retry_at_ms: Option<u64>,
    /// Redis's last answer and when: the standing replies.
    last: Option<(Reply, u64)>,
    /// What the fallback admitted that no count Redis made paid for yet,
    /// and until when it is owed (the end of the window it was admitted in).
    owed: u64,
    owed_until_ms: u64,
    last_used_ms: u64,
}

impl Entry {
    /// A new window (by the local clock) drops what was held for the last.
    fn roll(&mut self, now_ms: u64) {
        if now_ms >= self.ends_ms {
            self.tokens = 0;
            self.room = None;
        }
    }

    /// The reply for a request granted (1) or not (0) now, from memory.
    fn standing(&self, window: Window, granted: u64, retry_after_ms: i64, now_ms: u64) -> Reply {
        let room = self.room.unwrap_or(window.limit);
        let reset =
            if self.ends_ms > now_ms { self.ends_ms - now_ms } else { window.window_ms - now_ms % window.window_ms };
        Reply {
            granted,
            remaining: room.saturating_add(self.tokens).min(window.limit),
            retry_after_ms,
            reset_after_ms: reset,
            limit: window.limit,
            binding: 0,
        }
    }

    /// Redis said at `sent_ms` (when the call went) that its window ends
    /// in `reset_ms`. The same window keeps the earliest of its estimates;
    /// a later window drops what was held for the last one.
    fn ends_in(&mut self, sent_ms: u64, reset_ms: u64) {
        let end = sent_ms.saturating_add(reset_ms);
        let half = self.window.map_or(0, |w| w.window_ms / 2);
        if self.ends_ms == 0 || end > self.ends_ms.saturating_add(half) {
            self.tokens = 0;
            self.room = None;
            self.ends_ms = end;
        } else {
            self.ends_ms = self.ends_ms.min(end);
        }
    }

    /// Redis said the window has `room` left. Within a window room only
    /// falls (but by a refund): of answers that cross on their way, the
    /// lowest is the latest, and it counts every lease already held.
    fn saw_room(&mut self, room: u64) {
        self.room = Some(self.room.map_or(room, |r| r.min(room)));
    }

    /// Pays what is owed from `counted` (counts Redis made that nobody was
    /// admitted for): the part paid.
    fn repay(&mut self, counted: u64, now_ms: u64) -> u64 {
        if now_ms >= self.owed_until_ms {
            self.owed = 0;
        }
        let paid = self.owed.min(counted);
        self.owed -= paid;
        paid
    }

    /// The lease call wanted at `now_ms`, claimed: when memory holds half a
    /// batch or less, none is on its way and the window has room. It asks
    /// at most half of the limit, and half of the room Redis last said was
    /// left, so that requests asking Redis meanwhile still find some.
    fn claim(&mut self, batch: u64) -> Option<u64> {
        if self.leasing || 2 * self.tokens > batch || self.room == Some(0) {
            return None;
        }
        self.leasing = true;
        let half_limit = self.window.map_or(1, |w| w.limit / 2);
        let half_room = self.room.map_or(u64::MAX, |r| r.div_ceil(2));
        Some(batch.min(half_limit).min(half_room).max(1))
    }
}

/// Every window the RLS front has seen lately, by counter key.
#[derive(Debug)]
pub struct Windows {
    settings: Settings,
    table: IndexMap<String, Entry>,
    evictions: u64,
    seed: u64,
}

impl Windows {
    pub fn new(settings: Settings) -> Windows {
        Windows { settings, table: IndexMap::new(), evictions: 0, seed: 0x2545_f491_4f6c_dd1d }
    }

    /// Tokens a lease call takes for `window`: the relay's share of
    /// `window_ms` (the lease window) of its rate; 1: not leased.
    pub fn batch(&self, window: Window) -> u64 {
        if !window.leased {
            return 1;
        }
        let Ok(as_bucket) = rl_core::BucketParams::new(window.limit, window.limit, window.window_ms) else { return 1 };
        rl_core::lease::batch(&[as_bucket], self.settings.window_ms, self.settings.relays)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    fn entry(&mut self, key: &str, window: Window, now_ms: u64) -> Option<&mut Entry> {
        if !self.table.contains_key(key) {
            if !self.make_room(now_ms) {
                return None;
            }
            self.table.insert(key.to_string(), Entry::default());
        }
        let entry = self.table.get_mut(key)?;
        if entry.window != Some(window) {
            // New or changed limits: what was held was taken under the old.
            *entry = Entry { window: Some(window), leasing: entry.leasing, ..Entry::default() };
        }
        entry.last_used_ms = now_ms;
        Some(entry)
    }

    /// What to do with a request of `cost` (at least 1) on `window`.
    pub fn plan(&mut self, key: &str, window: Window, cost: u64, now_ms: u64) -> Plan {
        let batch = self.batch(window);
        let Some(entry) = self.entry(key, window, now_ms) else { return Plan::Exact { lease: None } };
        entry.roll(now_ms);
        if let Some(denied) = entry.denied.filter(|d| d.refuses(cost, now_ms)) {
            let retry = match entry.retry_at_ms {
                Some(at) => at.saturating_sub(now_ms).max(1),
                None => denied.retry_after_ms(now_ms),
            };
            let retry = i64::try_from(retry).unwrap_or(i64::MAX);
            return Plan::Refused { reply: entry.standing(window, 0, retry, now_ms) };
        }
        if batch <= 1 {
            return Plan::Exact { lease: None };
        }
        if entry.tokens >= cost {
            entry.tokens -= cost;
            let reply = entry.standing(window, 1, 0, now_ms);
            return Plan::Paid { reply, lease: entry.claim(batch) };
        }
        if entry.leasing && !entry.waiter {
            entry.waiter = true;
            return Plan::Wait;
        }
        Plan::Exact { lease: entry.claim(batch) }
    }

    /// Redis answered a lease call of `want` sent at `sent_ms`: what of
    /// the batch paid for what the fallback admitted.
    pub fn leased(&mut self, key: &str, want: u64, reply: Reply, sent_ms: u64, now_ms: u64) -> u64 {
        let max_hold_ms = self.settings.max_hold_ms;
        let Some(entry) = self.table.get_mut(key) else { return 0 };
        entry.leasing = false;
        entry.waiter = false;
        entry.roll(now_ms);
        entry.last = Some((reply, now_ms));
        entry.ends_in(sent_ms, reply.reset_after_ms);
        entry.saw_room(reply.remaining);
        if reply.granted == 0 {
            if reply.remaining == 0 {
                entry.denied = hold(1, reply, max_hold_ms, sent_ms);
                entry.retry_at_ms = retry_at(reply, sent_ms);
            }
            return 0;
        }
        let paid = entry.repay(want, now_ms);
        entry.tokens += want - paid;
        entry.denied = None;
        paid
    }

    /// The fallback admitted `cost` on `window` at `now_ms`, owed until
    /// `until_ms` (when the window it was admitted in ends).
    pub fn owe(&mut self, key: &str, window: Window, cost: u64, until_ms: u64, now_ms: u64) {
        let Some(entry) = self.entry(key, window, now_ms) else { return };
        if now_ms >= entry.owed_until_ms {
            entry.owed = 0;
        }
        entry.owed = entry.owed.saturating_add(cost);
        entry.owed_until_ms = entry.owed_until_ms.max(until_ms);
    }

    /// `counted` of `key`'s window that Redis counted for nobody admitted
    /// (or is about to admit): the part that paid what the fallback owes.
    pub fn repay(&mut self, key: &str, counted: u64, now_ms: u64) -> u64 {
        self.table.get_mut(key).map_or(0, |e| e.repay(counted, now_ms))
    }

    /// A fallback admission nobody saw (a late decision's own): not owed.
    pub fn forgive(&mut self, key: &str, cost: u64) {
        if let Some(entry) = self.table.get_mut(key) {
            entry.owed = entry.owed.saturating_sub(cost);
        }
    }

    /// Whether a lease call for `key` is on its way.
    pub fn leasing(&self, key: &str) -> bool {
        self.table.get(key).is_some_and(|e| e.leasing)
    }

    /// A lease call failed: the next request may send one.
    pub fn lease_failed(&mut self, key: &str) {
        if let Some(entry) = self.table.get_mut(key) {
            entry.leasing = false;
            entry.waiter = false;
        }
    }

    /// Redis answered a request's own call for `cost`, sent at `sent_ms`:
    /// a refusal is remembered.
    pub fn answered(&mut self, key: &str, cost: u64, reply: Reply, sent_ms: u64, now_ms: u64) {
        let max_hold_ms = self.settings.max_hold_ms;
        let Some(entry) = self.table.get_mut(key) else { return };
        entry.roll(now_ms);
        entry.last = Some((reply, now_ms));
        if entry.window.is_some_and(|w| w.leased) {
            entry.ends_in(sent_ms, reply.reset_after_ms);
            entry.saw_room(reply.remaining);
        }
        if reply.granted == 0 {
            entry.denied = hold(cost, reply, max_hold_ms, sent_ms);
            entry.retry_at_ms = retry_at(reply, sent_ms);
        }
    }

    /// Pays `cost` from memory if it holds that much (a request Redis
    /// refused while a lease call took the window's last room).
    pub fn pay(&mut self, key: &str, cost: u64, now_ms: u64) -> Option<Reply> {
        let entry = self.table.get_mut(key)?;
        let window = entry.window?;
        entry.roll(now_ms);
        if entry.tokens < cost {
            return None;
        }
        entry.tokens -= cost;
        Some(entry.standing(window, 1, 0, now_ms))
    }

    /// Usage of `cost` paid from the tokens held for `key` (at most all of
    /// them): what was paid, and the standing reply.
    pub fn pay_usage(&mut self, key: &str, window: Window, cost: u64, now_ms: u64) -> (u64, Reply) {
        let Some(entry) = self.entry(key, window, now_ms) else {
            return (0, Reply { granted: 1, remaining: 0, retry_after_ms: 0, reset_after_ms: 0, limit: 0, binding: 0 });
        };
        entry.roll(now_ms);
        let paid = entry.tokens.min(cost);
        entry.tokens -= paid;
        (paid, entry.standing(window, 1, 0, now_ms))
    }

    /// A refund of `n` is on its way to `key`'s window: the room memory
    /// holds (which otherwise only falls) rises by it, within the limit.
    pub fn raise_room(&mut self, key: &str, n: u64) {
        if let Some(entry) = self.table.get_mut(key) {
            let limit = entry.window.map_or(0, |w| w.limit);
            entry.room = entry.room.map(|r| r.saturating_add(n).min(limit));
        }
    }

    /// A negative hit gave back to `key`'s window, leaving `room`: a
    /// refusal held for it no longer stands.
    pub fn refunded(&mut self, key: &str, room: u64) {
        if let Some(entry) = self.table.get_mut(key) {
            entry.denied = None;
            if entry.room.is_some() {
                entry.room = Some(room);
            }
        }
    }

    /// What memory knows of a fixed window's room at `now_ms` (Redis's last
    /// word on it in the window it was said for, with the tokens held), if
    /// anything: for a limit not asked.
    pub fn known(&self, key: &str, window: Window, now_ms: u64) -> Option<Reply> {
        let entry = self.table.get(key).filter(|e| e.window == Some(window) && now_ms < e.ends_ms)?;
        entry.room?;
        Some(entry.standing(window, 1, 0, now_ms))
    }

    /// The room Redis last said `key`'s leased window has (the lowest of
    /// its answers in the window), if known.
    pub fn room(&self, key: &str) -> Option<u64> {
        self.table.get(key)?.room
    }

    /// Tokens held for `key`'s window at `now_ms`: Redis counted them, the
    /// relay may still spend them (a reply's remaining counts them in).
    pub fn held(&self, key: &str, now_ms: u64) -> u64 {
        self.table.get(key).filter(|e| now_ms < e.ends_ms).map_or(0, |e| e.tokens)
    }

    /// Tokens a request was paid from memory and did not use (another of
    /// its limits refused it), back where they came from, unless their
    /// window ended meanwhile.
    pub fn give_back(&mut self, key: &str, tokens: u64, now_ms: u64) {
        if let Some(entry) = self.table.get_mut(key) {
            if now_ms < entry.ends_ms {
                entry.tokens += tokens;
            }
        }
    }

    fn make_room(&mut self, now_ms: u64) -> bool {
        if self.table.len() < self.settings.max_subjects {
            return true;
        }
        let len = self.table.len();
        let mut victim: Option<(usize, u64)> = None;
        for _ in 0..EVICTION_SAMPLES.min(len) {
            let i = (self.next_random() % len as u64) as usize;
            let e = &self.table[i];
            if e.leasing || (e.owed > 0 && now_ms < e.owed_until_ms) {
                continue;
            }
            // Held tokens are worth keeping while they are fresh.
            let busy = e.tokens > 0 && now_ms.saturating_sub(e.last_used_ms) < self.settings.ttl_ms;
            let rank = if busy { u64::MAX } else { e.last_used_ms };
            if victim.is_none_or(|(_, best)| rank < best) {
                victim = Some((i, rank));
            }
        }
        match victim {
            Some((i, rank)) if rank < u64::MAX => {
                self.table.swap_remove_index(i);
                self.evictions += 1;
                true
            }
            _ => false,
        }
    }

    fn next_random(&mut self) -> u64 {
        crate::pool::xorshift(&mut self.seed)
    }
}

/// When a refusal Redis named at `sent_ms` ends (None: never, a cost above
/// the limit).
fn retry_at(refused: Reply, sent_ms: u64) -> Option<u64> {
    u64::try_from(refused.retry_after_ms).ok().map(|r| sent_ms.saturating_add(r))
}

/// A refusal of `cost` named by Redis at `sent_ms`, held until its retry
/// time and at most `max_hold_ms`; a cost above the limit (retry -1) for
/// `max_hold_ms`.
fn hold(cost: u64, refused: Reply, max_hold_ms: u64, sent_ms: u64) -> Option<Denial> {
    let retry = match refused.retry_after_ms {
        r if r < 0 => max_hold_ms,
        r => (r as u64).min(max_hold_ms),
    };
    Denial::new(cost, retry, 0, sent_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXED: Window = Window { limit: 100, window_ms: 1000, leased: true };

    fn windows() -> Windows {
        Windows::new(Settings { window_ms: 100, max_subjects: 4, ..Settings::default() })
    }

    fn reply(granted: u64, remaining: u64, retry: i64, reset: u64) -> Reply {
        Reply { granted, remaining, retry_after_ms: retry, reset_after_ms: reset, limit: 100, binding: 0 }
    }

    #[test]
    fn a_hot_window_is_paid_from_a_batch_it_leased() {
        let mut w = windows();
        assert_eq!(w.batch(FIXED), 10);
        // Memory holds nothing: the request asks Redis, a lease goes beside.
        assert_eq!(w.plan("k", FIXED, 1, 5_000), Plan::Exact { lease: Some(10) });
        assert_eq!(w.plan("k", FIXED, 1, 5_000), Plan::Wait, "one lease call at a time: one request waits for it");
        assert_eq!(w.plan("k", FIXED, 1, 5_000), Plan::Exact { lease: None }, "the others ask Redis");
        w.answered("k", 1, reply(1, 99, 0, 1000), 5_000, 5_000);
        w.leased("k", 10, reply(1, 88, 0, 1000), 5_000, 5_001);
        let mut paid = 0;
        let mut lease = None;
        while let Plan::Paid { reply, lease: l } = w.plan("k", FIXED, 1, 5_002) {
            assert_eq!(reply.granted, 1);
            paid += 1;
            lease = lease.or(l);
        }
        assert_eq!(paid, 10, "exactly the batch");
        assert_eq!(lease, Some(10), "a top-up at half a batch");
        // At the window's end (as Redis said, from when it was sent) the
        // held tokens are gone.
        w.leased("k", 10, reply(1, 78, 0, 995), 5_002, 5_003);
        assert!(matches!(w.plan("k", FIXED, 1, 5_996), Plan::Paid { .. }));
        assert!(matches!(w.plan("k", FIXED, 1, 5_997), Plan::Exact { .. }), "the earliest estimate of the end");
    }

    #[test]
    fn a_spent_window_is_leased_at_its_room_then_refused_until_it_ends() {
        let mut w = windows();
        assert_eq!(w.plan("k", FIXED, 1, 0), Plan::Exact { lease: Some(10) });
        // Refused: only 4 left. Then Redis grants what is asked while it lasts.
        w.leased("k", 10, reply(0, 4, 1000, 1000), 0, 1);
        let (mut room, mut paid) = (4u64, 0);
        for t in 2..100 {
            let lease = match w.plan("k", FIXED, 1, t) {
                Plan::Paid { lease, .. } => {
                    paid += 1;
                    lease
                }
                Plan::Exact { lease: None } => break,
                Plan::Exact { lease } => lease,
                Plan::Refused { .. } => panic!("refused with room left"),
                Plan::Wait => panic!("no lease call on its way"),
            };
            if let Some(n) = lease {
                assert!(n <= room.div_ceil(2), "asks at most half of what is left");
                room -= n;
                w.leased("k", n, reply(1, room, 0, 998), t, t);
            }
        }
        assert_eq!((paid, room), (4, 0), "the window's last room, leased and spent");
        // Empty: Redis is asked, refuses, and the refusal holds to the end.
        w.answered("k", 1, reply(0, 0, 995, 995), 5, 6);
        assert!(matches!(w.plan("k", FIXED, 1, 999), Plan::Refused { reply } if reply.retry_after_ms == 1));
        assert_eq!(w.plan("k", FIXED, 1, 1000), Plan::Exact { lease: Some(10) }, "a new window");
    }

    #[test]
    fn given_back_tokens_stay_within_their_window() {
        let mut w = windows();
        w.plan("k", FIXED, 1, 0);
        w.leased("k", 10, reply(1, 90, 0, 1000), 0, 0);
        assert!(matches!(w.plan("k", FIXED, 3, 1), Plan::Paid { .. }));
        w.give_back("k", 3, 2);
        let mut paid = 0;
        while let Plan::Paid { .. } = w.plan("k", FIXED, 1, 3) {
            paid += 1;
        }
        assert_eq!(paid, 10);
        // The top-up the loop sent failed: nothing on its way.
        w.lease_failed("k");
        w.give_back("k", 1, 1000);
        assert!(matches!(w.plan("k", FIXED, 1, 1000), Plan::Exact { .. }), "the window ended: dropped");
    }

    #[test]
    fn what_the_fallback_admitted_is_paid_by_the_next_counts_until_its_window_ends() {
        let mut w = windows();
        w.owe("k", FIXED, 3, 1000, 0);
        w.owe("k", FIXED, 2, 1000, 1);
        // A lease of 10 brings 5 tokens: the other 5 paid what was owed.
        assert_eq!(w.plan("k", FIXED, 1, 2), Plan::Exact { lease: Some(10) });
        assert_eq!(w.leased("k", 10, reply(1, 80, 0, 998), 2, 2), 5);
        assert_eq!(w.held("k", 3), 5);
        assert_eq!(w.repay("k", 1, 3), 0, "nothing owed any more");
        // Owed in a window that ended: nothing to pay.
        w.owe("k", FIXED, 4, 1000, 500);
        w.forgive("k", 1);
        assert_eq!(w.repay("k", 10, 999), 3);
        w.owe("k", FIXED, 4, 1000, 999);
        assert_eq!(w.repay("k", 10, 1000), 0, "the window it was owed to ended");
    }

    #[test]
    fn quiet_windows_go_to_redis_and_remember_refusals() {
        let mut w = windows();
        let quiet = Window { limit: 5, window_ms: 3_600_000, leased: true };
        assert_eq!(w.batch(quiet), 1);
        assert_eq!(w.plan("q", quiet, 1, 0), Plan::Exact { lease: None });
        w.answered("q", 1, reply(0, 0, 60_000, 60_000), 0, 1);
        // Answered with the retry Redis named, not the hold.
        assert!(matches!(w.plan("q", quiet, 2, 10), Plan::Refused { reply } if reply.retry_after_ms == 59_990));
        // Held at most max_hold_ms (30 s by default), not the hour.
        assert_eq!(w.plan("q", quiet, 1, 30_000), Plan::Exact { lease: None });
    }

    #[test]
    fn the_table_is_bounded_and_keeps_calls_in_flight() {
        let mut w = windows();
        for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
            assert_eq!(w.plan(key, FIXED, 1, i as u64), Plan::Exact { lease: Some(10) });
        }
        assert_eq!(w.plan("e", FIXED, 1, 10), Plan::Exact { lease: None }, "full of calls in flight: exact");
        assert_eq!(w.len(), 4);
        w.lease_failed("a");
        assert_eq!(w.plan("e", FIXED, 1, 11), Plan::Exact { lease: Some(10) });
        assert_eq!((w.len(), w.evictions()), (4, 1));
    }
}
