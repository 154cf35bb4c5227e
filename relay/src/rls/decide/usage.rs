//! Usage reported after the fact (a descriptor's `hits_addend`, counted in
//! full whatever the limit answers), and negative hits (given back).

use super::*;

/// The limit a usage charge is counted against, so that the module counts
/// it past the real one: a FIXED or SLIDING window stores its counts, not
/// its limit; an EXACT log holds at most its ceiling.
pub(super) fn usage_limit(mode: WindowMode, limit: u64) -> u64 {
    match mode {
        WindowMode::Exact => limit.max(DEFAULT_MAX_LOG_LIMIT),
        _ => rl_core::limits::MAX_WINDOW_LIMIT,
    }
}

impl Engine {
    /// Step 1 for usage: a limit of 0 has nothing to count; a leased window
    /// pays what it can from the tokens it holds (counted in Redis when
    /// leased), the rest goes to Redis.
    pub(super) fn usage_in_memory(&self, item: &Item, now: u64) -> Step {
        let Counter::Window { window, .. } = item.counter else { return Step::Usage(item.cost) };
        if !window.leased {
            return Step::Usage(item.cost);
        }
        let (paid, reply) = self.windows().pay_usage(&item.key, window, item.cost, now);
        if paid < item.cost {
            return Step::Usage(item.cost - paid);
        }
        self.counters.from_memory.fetch_add(1, Relaxed);
        let over = reply.remaining == 0;
        Step::Decided(LimitAnswer { over, reply, source: Source::Memory }, Took::Nothing)
    }

    /// Counts usage of `cost` in Redis, past the limit: a window against
    /// [`usage_limit`] (an EXACT log full to it takes what it has room
    /// for), a bucket with FORCE (into debt). Then a peek of one answers as
    /// the next request would be: over when nothing is left. With
    /// `stop_increment`, a limit the peek finds already over counts nothing.
    pub(super) async fn charge(&self, item: &Item, cost: u64) -> LimitAnswer {
        let key = Some(item.key.as_bytes());
        let peek = match item.counter {
            Counter::Window { mode, .. } => window_args("RL.WINDOWPEEK", &[item], 1, mode),
            Counter::Bucket(p) => bucket_args("RL.PEEK", &item.key, &p, "COST", 1),
            Counter::Slots { .. } | Counter::Closed { .. } => unreachable!("decided in memory"),
        };
        let sent = now_ms();
        if self.stop_increment {
            self.counters.redis_calls.fetch_add(1, Relaxed);
            match self.relay.send(&peek, key).await.module_reply() {
                Some(r) if r.granted == 0 => return self.charged(item, r, sent),
                Some(_) => {}
                None => return self.failed(item),
            }
        }
        let args = |cost: u64| match item.counter {
            Counter::Window { mode, window } => {
                let limit = usage_limit(mode, window.limit);
                let forced =
                    Item { counter: Counter::Window { mode, window: Window { limit, ..window } }, ..item.clone() };
                window_args("RL.WINDOW", &[&forced], cost, mode)
            }
            Counter::Bucket(p) => {
                let mut args = bucket_args("RL.TAKE", &item.key, &p, "COST", cost);
                args.push(Bytes::from_static(b"FORCE"));
                args
            }
            Counter::Slots { .. } | Counter::Closed { .. } => unreachable!("decided in memory"),
        };
        self.counters.redis_calls.fetch_add(2, Relaxed);
        self.sending(item, cost);
        let mut reply = self.relay.send(&args(cost), key).await;
        if let Some(r) = reply.module_reply().filter(|r| r.granted == 0 && r.remaining > 0) {
            self.counters.redis_calls.fetch_add(1, Relaxed);
            reply = self.relay.send(&args(r.remaining), key).await;
        }
        if reply.module_reply().is_none() {
            self.came_back(item, cost, None);
            self.relay.health.failed("usage", &format!("{reply:?}"));
            return self.failed(item);
        }
        let after = self.relay.send(&peek, key).await;
        match after.module_reply() {
            Some(r) => {
                let room = room(&r, 1);
                self.came_back(item, cost, Some((room, r.reset_after_ms)));
                self.charged(item, r, sent)
            }
            None => {
                self.came_back(item, cost, None);
                self.failed(item)
            }
        }
    }

    /// A negative hit: `cost` given back to the window in progress (never
    /// more than it counts: `RL.WINDOW ... REFUND`, at now; an EXACT log
    /// its oldest entries) or to the bucket (`RL.REFUND`, never above its
    /// capacity). Always OK, with what is left after; memory forgets a
    /// refusal it held for the limit. Redis down: nothing is given back
    /// (counted in `rl_relay_rls_refund_errors_total`: under, never over).
    pub(super) async fn give_hits_back(&self, item: &Item) -> LimitAnswer {
        let now = now_ms();
        let mut cost = item.cost;
        if let Counter::Window { mode: WindowMode::Exact, window } = item.counter {
            // A log gives nothing back when asked more than it holds: asked
            // at most what a peek against its ceiling finds.
            let limit = usage_limit(WindowMode::Exact, window.limit);
            let ceiling = Item {
                counter: Counter::Window { mode: WindowMode::Exact, window: Window { limit, ..window } },
                ..item.clone()
            };
            self.counters.redis_calls.fetch_add(1, Relaxed);
            let peek = window_args("RL.WINDOWPEEK", &[&ceiling], 1, WindowMode::Exact);
            if let Some(r) = self.relay.send(&peek, Some(item.key.as_bytes())).await.module_reply() {
                cost = cost.min(limit.saturating_sub(room(&r, 1)));
            }
        }
        if cost == 0 {
            let reply = Reply {
                granted: 1,
                remaining: item.counter.limit(),
                retry_after_ms: 0,
                reset_after_ms: 0,
                limit: item.counter.limit(),
                binding: 0,
            };
            return LimitAnswer { over: false, reply, source: Source::Redis };
        }
        let (what, args) = match item.counter {
            Counter::Window { mode, window } => {
                // An EXACT log gives back its oldest entries from `at` on,
                // while `at` is in its window: a margin (half the window, at
                // most a minute) keeps it there on the server's clock.
                let at = match mode {
                    WindowMode::Exact => now.saturating_sub(window.window_ms - (window.window_ms / 2).min(60_000)),
                    _ => now,
                };
                let mut args = window_args("RL.WINDOW", &[item], cost, mode);
                args.push(Bytes::from_static(b"REFUND"));
                args.push(at.to_string().into());
                self.counters.window_refunds.fetch_add(1, Relaxed);
                ("RL.WINDOW REFUND", args)
            }
            Counter::Bucket(p) => {
                self.counters.refunds.fetch_add(1, Relaxed);
                ("RL.REFUND", bucket_args("RL.REFUND", &item.key, &p, "TOKENS", item.cost))
            }
            Counter::Slots { .. } => ("RL.RELEASE", slots::release_args(&item.key, &item.slot)),
            Counter::Closed { .. } => {
                let reply = refused(0, 0, 0);
                return LimitAnswer { over: false, reply: Reply { granted: 1, ..reply }, source: Source::Limit };
            }
        };
        if let Counter::Slots { .. } = item.counter {
            // A release answers how many keys it freed: no room to show.
            self.counters.redis_calls.fetch_add(1, Relaxed);
            let reply = self.relay.send(&args, Some(item.key.as_bytes())).await;
            self.released(&reply);
            let limit = item.counter.limit();
            let reply = Reply { granted: 1, remaining: 0, retry_after_ms: 0, reset_after_ms: 0, limit, binding: 0 };
            return LimitAnswer { over: false, reply, source: Source::Redis };
        }
        self.counters.redis_calls.fetch_add(1, Relaxed);
        let reply = self.relay.send(&args, Some(item.key.as_bytes())).await;
        self.refunded(what, &reply);
        let limit = item.counter.limit();
        let Some(r) = reply.module_reply() else {
            let reply = Reply { granted: 1, remaining: 0, retry_after_ms: 0, reset_after_ms: 0, limit, binding: 0 };
            return LimitAnswer { over: false, reply, source: Source::Unanswered };
        };
        if let Counter::Window { .. } = item.counter {
            self.windows().refunded(&item.key, r.remaining);
        }
        LimitAnswer { over: false, reply: Reply { granted: 1, limit, ..r }, source: Source::Redis }
    }

    /// The answer to usage from a peek of one after it (`sent_ms`: when the
    /// first call went): a window remembers a refusal.
    pub(super) fn charged(&self, item: &Item, peek: Reply, sent_ms: u64) -> LimitAnswer {
        let room = room(&peek, 1);
        let reply = Reply { granted: u64::from(room > 0), remaining: room, ..peek };
        if let Counter::Window { .. } = item.counter {
            self.windows().answered(&item.key, 1, Reply { granted: peek.granted, ..reply }, sent_ms, now_ms());
        }
        LimitAnswer { over: room == 0, reply, source: Source::Redis }
    }
}
