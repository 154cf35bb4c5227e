//! Redis could not answer: each limit's failure mode (the local fallback,
//! or refused), and the fallback's bookkeeping of the calls on their way.

use super::*;

impl Engine {
    /// Redis could not answer for `item`: its failure mode decides.
    pub fn failed(&self, item: &Item) -> LimitAnswer {
        let limit = item.counter.limit();
        if item.failure == FailureMode::Deny {
            self.counters.failure_denied.fetch_add(1, Relaxed);
            return LimitAnswer { over: true, reply: refused(limit, 1000, 0), source: Source::FailureDenied };
        }
        self.counters.fallback.fetch_add(1, Relaxed);
        let Some(kind) = fallback_kind(item.counter) else {
            if let Counter::Slots { .. } = item.counter {
                // Failing open, a request is let in without a slot (a
                // release of it later frees nothing).
                let reply = Reply { granted: 1, remaining: 0, retry_after_ms: 0, reset_after_ms: 0, limit, binding: 0 };
                return LimitAnswer { over: false, reply, source: Source::Fallback };
            }
            return LimitAnswer { over: true, reply: refused(0, 1000, 0), source: Source::Limit };
        };
        let mono = self.mono_ms();
        // A bucket's pool holds Redis's last word on it (its lease and
        // top-up calls, which this engine does not see).
        let pooled = match kind {
            fallback::Kind::Bucket(_) => {
                self.relay.pools().last_reading(&[Bytes::copy_from_slice(item.key.as_bytes())])
            }
            fallback::Kind::Window { .. } => None,
        };
        let mut fallback = lock(&self.fallback);
        let mut leasing = 0;
        if let Some(pooled) = pooled {
            let age = now_ms().saturating_sub(pooled.at_ms);
            fallback.reading(&item.key, kind, 0, pooled.room, 0, mono.saturating_sub(age));
            leasing = pooled.leasing;
        }
        let r = fallback.take(&item.key, kind, item.cost, leasing, mono);
        drop(fallback);
        if let Counter::Window { mode, window } = item.counter {
            if r.granted > 0 && item.cost > 0 && !item.shadow {
                // Owed to the window until it ends: the call that would
                // count it may never reach Redis.
                let now = now_ms();
                let until = match mode {
                    WindowMode::Fixed => now + window_end_in(window.window_ms, now),
                    _ => now + window.window_ms,
                };
                self.windows().owe(&item.key, window, item.cost, until, now);
            }
        }
        // Never announce the stand-in's scaled numbers as the limit's.
        let reply = Reply { remaining: r.remaining.min(limit), limit, ..r };
        LimitAnswer { over: r.granted == 0 && item.cost > 0, reply, source: Source::Fallback }
    }

    /// A call that may take `cost` of `item`'s limit is on its way to
    /// Redis: the fallback keeps that cost aside until it comes back.
    pub(super) fn sending(&self, item: &Item, cost: u64) {
        if let Some(kind) = fallback_kind(item.counter) {
            lock(&self.fallback).sent(&item.key, kind, cost);
        }
    }

    /// That call came back (`cost` 0: none was counted on its way), with
    /// Redis's `(room, reset_after_ms)` for `item`'s limit if it answered:
    /// the fallback's reading, under one lock.
    pub(super) fn came_back(&self, item: &Item, cost: u64, reading: Option<(u64, u64)>) {
        if cost == 0 && reading.is_none() {
            return;
        }
        if let Some(kind) = fallback_kind(item.counter) {
            lock(&self.fallback).returned(&item.key, kind, cost, reading, self.mono_ms());
        }
    }
}
