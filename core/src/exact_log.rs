//! The exact sliding log: the times of admitted requests over the last
//! window, exact at any alignment, with an exact retry time.
//!
//! Only admitted requests are logged, so a refused caller never grows
//! memory. Requests admitted in the same millisecond share one entry: a log
//! holds at most `limit` entries of 8 bytes.

use std::collections::VecDeque;

use smallvec::SmallVec;

use crate::combine::{Check, Outcome, Update, INLINE, NEVER};
use crate::limits::{latest_reading_ms, MAX_LOG_LIMIT, MAX_TIME_MS, MAX_WAIT_MS};
use crate::window::WindowParams;

const TIME_BITS: u32 = 44;
const COUNT_BITS: u32 = 20;
const _: () = assert!(TIME_BITS + COUNT_BITS == 64 && MAX_LOG_LIMIT < 1 << COUNT_BITS);

/// One entry: `count` requests admitted at `at_ms`, packed in a u64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry(u64);

impl Entry {
    /// Panics on a time or count its bits cannot hold: callers check first
    /// (`Log::accepts`), so this only stops a bug from wrapping silently.
    pub fn new(at_ms: u64, count: u64) -> Entry {
        assert!(at_ms < 1 << TIME_BITS && count < 1 << COUNT_BITS, "log entry ({at_ms} ms, {count}) out of range");
        Entry(at_ms | count << TIME_BITS)
    }
    pub fn at_ms(self) -> u64 {
        self.0 & ((1 << TIME_BITS) - 1)
    }
    pub fn count(self) -> u64 {
        self.0 >> TIME_BITS
    }
    pub fn raw(self) -> u64 {
        self.0
    }
    pub fn from_raw(raw: u64) -> Entry {
        Entry(raw)
    }
}

/// What an EXACT key stores: entries in time order, and the sum of their
/// counts (so a call reads the live count without walking the log).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Log {
    entries: VecDeque<Entry>,
    total: u64,
}

/// Why a stored or replicated log was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogError {
    /// More entries than any log may hold.
    Length,
    /// An entry with no requests, too many, or a time out of range.
    Entry,
    /// Entries out of time order.
    Order,
    /// No entry at all: an EXACT key always holds one, so the module never
    /// writes an empty log.
    Empty,
    /// A time more than a day ahead of the reading server's clock.
    Ahead,
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogError::Order => "at is older than the log's newest entry",
            LogError::Length => "the log would exceed its largest size",
            LogError::Entry => "count or at out of range",
            LogError::Empty => "the log has no entry",
            LogError::Ahead => "at or drop_before more than a day ahead of this server's clock",
        })
    }
}

/// The effect of one admission on a log, deterministic given the log it is
/// applied to: drop entries older than `drop_before_ms`, then add `count`
/// at `at_ms`. This is what replicas and the AOF receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Append {
    pub drop_before_ms: u64,
    pub at_ms: u64,
    pub count: u64,
}

impl Append {
    /// Whether a server whose clock reads `now_ms` could have made this
    /// admission: both times are clock readings.
    pub fn fits_clock(&self, now_ms: u64) -> Result<(), LogError> {
        if self.at_ms.max(self.drop_before_ms) > latest_reading_ms(now_ms) {
            return Err(LogError::Ahead);
        }
        Ok(())
    }
}

impl Log {
    pub fn from_entries(entries: impl IntoIterator<Item = Entry>) -> Result<Log, LogError> {
        // Never collect more than a log may hold, whatever the input.
        let entries: VecDeque<Entry> = entries.into_iter().take(MAX_LOG_LIMIT as usize + 1).collect();
        if entries.len() as u64 > MAX_LOG_LIMIT {
            return Err(LogError::Length);
        }
        if entries.iter().any(|e| e.count() == 0 || e.count() > MAX_LOG_LIMIT || e.at_ms() > MAX_TIME_MS) {
            return Err(LogError::Entry);
        }
        if entries.iter().zip(entries.iter().skip(1)).any(|(a, b)| a.at_ms() > b.at_ms()) {
            return Err(LogError::Order);
        }
        let total = entries.iter().map(|e| e.count()).sum();
        Ok(Log { entries, total })
    }

    pub fn entries(&self) -> impl ExactSizeIterator<Item = Entry> + '_ {
        self.entries.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes held on the heap, for MEMORY USAGE.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
    }

    /// How many entries are older than `drop_before_ms` (a binary search).
    fn dead(&self, drop_before_ms: u64) -> usize {
        self.entries.partition_point(|e| e.at_ms() < drop_before_ms)
    }

    /// The live entries as of `drop_before_ms`, oldest first.
    fn live(&self, drop_before_ms: u64) -> impl Iterator<Item = &Entry> {
        self.entries.range(self.dead(drop_before_ms)..)
    }

    /// Requests logged at or after `drop_before_ms`.
    fn live_count(&self, drop_before_ms: u64) -> u64 {
        let dead: u64 = self.entries.range(..self.dead(drop_before_ms)).map(|e| e.count()).sum();
        self.total - dead
    }

    /// Whether a server whose clock reads `now_ms` could hold this log: not
    /// empty, and no entry more than a day ahead of its clock.
    pub fn fits_clock(&self, now_ms: u64) -> Result<(), LogError> {
        match self.entries.back() {
            None => Err(LogError::Empty),
            Some(e) if e.at_ms() > latest_reading_ms(now_ms) => Err(LogError::Ahead),
            Some(_) => Ok(()),
        }
    }

    /// The newest live entry's time, if any.
    pub fn newest_live_ms(&self, drop_before_ms: u64) -> Option<u64> {
        self.entries.back().map(|e| e.at_ms()).filter(|&t| t >= drop_before_ms)
    }

    /// Whether `a` can be applied: in time order, and leaving no more
    /// entries than a log may hold (what the RDB loader accepts).
    pub fn accepts(&self, a: &Append) -> Result<(), LogError> {
        if a.count == 0 || a.count > MAX_LOG_LIMIT || a.at_ms > MAX_TIME_MS {
            return Err(LogError::Entry);
        }
        if self.newest_live_ms(a.drop_before_ms).is_some_and(|t| t > a.at_ms) {
            return Err(LogError::Order);
        }
        let merges = self.entries.back().is_some_and(|e| e.at_ms() == a.at_ms && e.count() + a.count <= MAX_LOG_LIMIT);
        let len = self.entries.len() - self.dead(a.drop_before_ms) + usize::from(!merges);
        if len as u64 > MAX_LOG_LIMIT {
            return Err(LogError::Length);
        }
        Ok(())
    }

    /// Applies an admission (or its replicated effect) if `accepts` says
    /// yes; otherwise changes nothing.
    pub fn apply(&mut self, a: &Append) -> Result<(), LogError> {
        self.accepts(a)?;
        for _ in 0..self.dead(a.drop_before_ms) {
            if let Some(e) = self.entries.pop_front() {
                self.total -= e.count();
            }
        }
        // Keep memory bounded by what the log holds now.
        if self.entries.capacity() > 16 && self.entries.len() < self.entries.capacity() / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
        }
        self.total += a.count;
        match self.entries.back_mut() {
            Some(last) if last.at_ms() == a.at_ms && last.count() + a.count <= MAX_LOG_LIMIT => {
                *last = Entry::new(a.at_ms, last.count() + a.count);
            }
            _ => self.entries.push_back(Entry::new(a.at_ms, a.count)),
        }
        Ok(())
    }
}

impl Log {
    /// Where a refund of a call decided at `at_ms` would start taking
    /// entries, if it would give anything back (see `refund`).
    pub fn refundable_from(&self, at_ms: u64, window_ms: u64, now_ms: u64) -> Option<usize> {
        if at_ms < (now_ms + 1).saturating_sub(window_ms) {
            return None;
        }
        Some(self.entries.partition_point(|e| e.at_ms() < at_ms)).filter(|&i| i < self.entries.len())
    }

    /// Gives back `n` requests logged by a call decided at `at_ms` (the
    /// server's reading it answered with), if they still count at `now_ms`
    /// in a window of `window_ms`; answers how many were given back.
    ///
    /// The call logged them at `at_ms` or later (at the newest entry's time
    /// if the clock read earlier), so they are taken from the oldest entries
    /// from `at_ms` on: entries logged before them, if any, go first, which
    /// errs toward refusing. Once `at_ms` has left the window, nothing is
    /// given back: its entry may be gone, and newer ones are not its.
    pub fn refund(&mut self, n: u64, at_ms: u64, window_ms: u64, now_ms: u64) -> u64 {
        let Some(mut i) = self.refundable_from(at_ms, window_ms, now_ms) else { return 0 };
        let mut left = n;
        while left > 0 && i < self.entries.len() {
            let e = self.entries[i];
            let taken = e.count().min(left);
            left -= taken;
            if taken == e.count() {
                self.entries.remove(i);
            } else {
                self.entries[i] = Entry::new(e.at_ms(), e.count() - taken);
                i += 1;
            }
        }
        self.total -= n - left;
        n - left
    }
}

/// An EXACT call's view: the check and, if admitted, the append to apply.
pub struct LogCheck {
    pub check: Check,
    pub append: Append,
    pub expires_at_ms: u64,
}

/// Several EXACT windows decided together at `now_ms`: all admit `cost`,
/// or none logs it. A grant's updates are the appends to apply.
pub fn decide(windows: &[WindowParams], logs: &[Option<&Log>], cost: u64, now_ms: u64) -> Outcome<Append> {
    let views: SmallVec<[LogCheck; INLINE]> =
        windows.iter().zip(logs).map(|(p, log)| check(p, *log, cost, now_ms)).collect();
    let checks: SmallVec<[Check; INLINE]> = views.iter().map(|v| v.check).collect();
    Outcome::of(&checks, cost, now_ms, |i| Update::Store {
        state: views[i].append,
        expires_at_ms: views[i].expires_at_ms,
    })
}

/// Checks `cost` against one log at `now_ms`: admitted when the requests
/// logged in (now - window, now] plus `cost` stay within the limit.
///
/// A clock reading earlier than the newest entry logs the new requests at
/// the newest entry's time: the log stays in order and nothing leaves the
/// window early.
pub fn check(p: &WindowParams, log: Option<&Log>, cost: u64, now_ms: u64) -> LogCheck {
    let w = p.window_ms();
    // An entry counts while now < at + w.
    let drop_before = (now_ms + 1).saturating_sub(w);
    let empty = Log::default();
    let log = log.unwrap_or(&empty);
    let used = log.live_count(drop_before);
    let admits = used + cost <= p.limit();
    let newest = log.entries.back().map(|e| e.at_ms());
    let at = newest.map_or(now_ms, |n| n.max(now_ms));
    let wait = |until: u64| until.saturating_sub(now_ms).min(MAX_WAIT_MS);
    let wait_ms = if cost > p.limit() {
        NEVER
    } else if admits {
        0
    } else {
        // The oldest entries leave first; wait until enough have left.
        let excess = used + cost - p.limit();
        let mut freed = 0;
        let until = log
            .live(drop_before)
            .find(|e| {
                freed += e.count();
                freed >= excess
            })
            .map_or(now_ms, |e| e.at_ms() + w);
        wait(until) as i64
    };
    LogCheck {
        check: Check {
            admits,
            limit: p.limit(),
            remaining_now: p.limit().saturating_sub(used),
            remaining_after: p.limit().saturating_sub(used + cost),
            wait_ms,
            reset_now_ms: log.newest_live_ms(drop_before).map_or(0, |n| wait(n + w)),
            reset_after_ms: wait(at + w),
        },
        append: Append { drop_before_ms: drop_before, at_ms: at, count: cost },
        expires_at_ms: at + w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(limit: u64, ms: u64) -> WindowParams {
        WindowParams::new(limit, ms, MAX_LOG_LIMIT).unwrap()
    }

    fn call(p: &WindowParams, log: &mut Log, cost: u64, now: u64) -> Check {
        let c = check(p, Some(log), cost, now);
        if c.check.admits {
            log.apply(&c.append).unwrap();
        }
        c.check
    }

    #[test]
    fn exact_at_any_alignment() {
        let p = p(3, 1000);
        let mut log = Log::default();
        for t in [100, 400, 900] {
            assert!(call(&p, &mut log, 1, t).admits);
        }
        let c = call(&p, &mut log, 1, 1_099);
        assert!(!c.admits);
        assert_eq!(c.wait_ms, 1); // the request of 100 leaves at 1_100
        assert!(call(&p, &mut log, 1, 1_100).admits);
        assert_eq!(log.len(), 3);
    }

    #[test]
    fn refusals_never_grow_the_log() {
        let p = p(2, 1000);
        let mut log = Log::default();
        call(&p, &mut log, 2, 0);
        for t in 1..500 {
            assert!(!call(&p, &mut log, 1, t).admits);
        }
        assert_eq!(log.len(), 1);
    }

    #[test]
    fn retry_accounts_for_cost() {
        let p = p(5, 1000);
        let mut log = Log::default();
        for t in [0, 10, 20, 30, 40] {
            call(&p, &mut log, 1, t);
        }
        let c = check(&p, Some(&log), 3, 500).check;
        assert_eq!((c.admits, c.wait_ms, c.remaining_now), (false, 520, 0)); // 0, 10, 20 must leave
        assert_eq!(check(&p, Some(&log), 6, 500).check.wait_ms, NEVER);
        assert_eq!(c.reset_now_ms, 540);
    }

    #[test]
    fn same_millisecond_shares_an_entry() {
        let p = p(100, 1000);
        let mut log = Log::default();
        for _ in 0..10 {
            call(&p, &mut log, 1, 7);
        }
        assert_eq!(log.entries().collect::<Vec<_>>(), [Entry::new(7, 10)]);
    }

    #[test]
    fn backward_clock_logs_at_the_newest_time() {
        let p = p(10, 1000);
        let mut log = Log::default();
        call(&p, &mut log, 1, 5_000);
        let c = check(&p, Some(&log), 1, 4_000);
        assert_eq!((c.append.at_ms, c.expires_at_ms), (5_000, 6_000));
    }

    #[test]
    fn total_follows_the_entries() {
        let p = p(100, 1000);
        let mut log = Log::default();
        for (t, cost) in [(0, 3), (0, 2), (400, 1), (900, 4), (1_500, 1)] {
            call(&p, &mut log, cost, t);
            assert_eq!(log.total, log.entries().map(|e| e.count()).sum::<u64>());
        }
        // At 1_500 the entries of 0 and 400 have left: 4 + 1 remain.
        assert_eq!(log.total, 5);
        assert_eq!(check(&p, Some(&log), 1, 1_500).check.remaining_now, 95);
    }

    #[test]
    fn logs_and_appends_are_bounded_by_the_reading_clock() {
        use crate::limits::MAX_CLOCK_AHEAD_MS as DAY;
        let now = 1_700_000_000_000;
        let log = |at: u64| Log::from_entries([Entry::new(now - 5, 1), Entry::new(at, 1)]).unwrap();
        assert_eq!(log(now + DAY).fits_clock(now), Ok(()));
        assert_eq!(log(now + DAY + 1).fits_clock(now), Err(LogError::Ahead));
        assert_eq!(Log::default().fits_clock(now), Err(LogError::Empty));
        let append = |drop_before_ms, at_ms| Append { drop_before_ms, at_ms, count: 1 };
        assert_eq!(append(now, now + DAY).fits_clock(now), Ok(()));
        assert_eq!(append(now, now + DAY + 1).fits_clock(now), Err(LogError::Ahead));
        assert_eq!(append(now + DAY + 1, now).fits_clock(now), Err(LogError::Ahead));
        let c = check(&p(5, 1000), Some(&log(now)), 1, now);
        assert_eq!(c.append.fits_clock(now), Ok(()));
    }

    #[test]
    fn accepts_refuses_what_the_loader_would() {
        let log = Log::from_entries([Entry::new(10, 1), Entry::new(20, 1)]).unwrap();
        let a = |drop_before_ms, at_ms, count| Append { drop_before_ms, at_ms, count };
        assert_eq!(log.accepts(&a(0, 20, 1)), Ok(()));
        assert_eq!(log.accepts(&a(0, 15, 1)), Err(LogError::Order));
        assert_eq!(log.accepts(&a(21, 15, 1)), Ok(()), "the newer entry left first");
        assert_eq!(log.accepts(&a(0, 30, 0)), Err(LogError::Entry));
        let full = Log::from_entries((0..MAX_LOG_LIMIT).map(|t| Entry::new(t, 1))).unwrap();
        assert_eq!(full.accepts(&a(0, MAX_LOG_LIMIT, 1)), Err(LogError::Length));
        assert_eq!(full.accepts(&a(0, MAX_LOG_LIMIT - 1, 1)), Ok(()), "merges into the last entry");
        assert_eq!(full.accepts(&a(1, MAX_LOG_LIMIT, 1)), Ok(()), "one entry left");
    }

    #[test]
    fn a_refund_takes_back_the_call_s_own_entries() {
        let p = p(5, 1000);
        let mut log = Log::default();
        for (t, cost) in [(100, 1), (400, 2), (600, 1)] {
            call(&p, &mut log, cost, t);
        }
        // The call at 400 is refunded: 100 and 600 stay.
        assert_eq!(log.refund(2, 400, 1000, 700), 2);
        assert_eq!(log.entries().collect::<Vec<_>>(), [Entry::new(100, 1), Entry::new(600, 1)]);
        assert_eq!(log.total, 2);
        // More than the entries from 400 on hold: what there is.
        assert_eq!(log.refund(3, 400, 1000, 700), 1);
        assert_eq!(log.entries().collect::<Vec<_>>(), [Entry::new(100, 1)]);
        // Part of a shared entry.
        let mut log = Log::from_entries([Entry::new(50, 4)]).unwrap();
        assert_eq!(log.refund(1, 50, 1000, 60), 1);
        assert_eq!(log.entries().collect::<Vec<_>>(), [Entry::new(50, 3)]);
    }

    #[test]
    fn a_refund_after_its_call_left_the_window_gives_nothing_back() {
        // The call at 100 left the window at 1_100; 1_200's entry is not its.
        let mut log = Log::from_entries([Entry::new(1_200, 1)]).unwrap();
        assert_eq!(log.refund(1, 100, 1000, 1_250), 0);
        assert_eq!(log.len(), 1);
        assert_eq!(log.refund(1, 300, 1000, 1_250), 1, "300 still counts until 1_300");
        assert!(log.is_empty());
    }

    #[test]
    fn entries_validate() {
        assert!(Log::from_entries([Entry::new(1, 1), Entry::new(2, 3)]).is_ok());
        assert_eq!(Log::from_entries([Entry::new(2, 1), Entry::new(1, 1)]), Err(LogError::Order));
        assert_eq!(Log::from_entries([Entry::new(2, 0)]), Err(LogError::Entry));
        assert_eq!(Entry::new(MAX_TIME_MS, MAX_LOG_LIMIT).count(), MAX_LOG_LIMIT);
        assert_eq!(Entry::new(MAX_TIME_MS, MAX_LOG_LIMIT).at_ms(), MAX_TIME_MS);
    }
}
