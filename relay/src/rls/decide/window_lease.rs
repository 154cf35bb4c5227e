//! A leased FIXED window's own calls to Redis: a request memory cannot
//! pay, with the lease it claims (one call counts both) or alone, after a
//! lease on its way came back, and a lease taken in the background.

use super::*;

impl Engine {
    /// A request of a leased window memory cannot pay, with the lease it
    /// claimed (`want`): one call counts both, so that its answer is exact
    /// for a lone caller (a lease sent beside it could land before or
    /// after it). When the window has less room than both, the request's
    /// own cost is asked alone, and the room remembered for the next lease.
    pub(super) async fn with_lease(&self, item: &Item, want: u64) -> (LimitAnswer, Took) {
        let Counter::Window { window, .. } = item.counter else { unreachable!("a window") };
        self.counters.window_leases.fetch_add(1, Relaxed);
        let sent = now_ms();
        let (reply, at_ms) = self.count_window(item, item.cost + want).await;
        let done = now_ms();
        let reset = window_end_in(window.window_ms, done);
        let Some(r) = reply else {
            self.windows().lease_failed(&item.key);
            self.lease_done.notify_waiters();
            return (self.failed(item), Took::Nothing);
        };
        let r = Reply { reset_after_ms: reset, limit: window.limit, ..r };
        self.came_back(item, item.cost + want, Some((r.remaining, reset)));
        {
            let mut windows = self.windows();
            let paid = windows.leased(&item.key, want, r, sent, done);
            self.counters.fallback_repaid.fetch_add(paid, Relaxed);
            self.lease_done.notify_waiters();
            if r.granted > 0 {
                if let Some(answer) = self.repaid(&mut windows, item, r, done) {
                    return (answer, Took::Nothing);
                }
                let reply =
                    windows.known(&item.key, window, done).unwrap_or(Reply { remaining: r.remaining + want, ..r });
                return (LimitAnswer { over: false, reply, source: Source::Redis }, Took::Counted { at_ms });
            }
            if r.remaining < item.cost {
                windows.answered(&item.key, item.cost, r, sent, done);
                return (LimitAnswer { over: true, reply: r, source: Source::Redis }, Took::Nothing);
            }
        }
        self.alone(item).await
    }

    /// A request of a window memory cannot pay, after a lease call on its
    /// way was answered (or a second, at most): paid from what it brought,
    /// else asked of Redis as it would have been.
    pub(super) async fn after_lease(self: &Arc<Self>, item: &Item) -> (LimitAnswer, Took) {
        let Counter::Window { window, .. } = item.counter else { unreachable!("a window") };
        let answered = self.lease_done.notified();
        tokio::pin!(answered);
        answered.as_mut().enable();
        if self.windows().leasing(&item.key) {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), answered).await;
        }
        let plan = self.windows().plan(&item.key, window, item.cost, now_ms());
        match plan {
            WindowPlan::Paid { reply, lease } => {
                if let Some(want) = lease {
                    self.spawn_lease(item.key.clone(), window, want);
                }
                self.counters.from_memory.fetch_add(1, Relaxed);
                (LimitAnswer { over: false, reply, source: Source::Memory }, Took::WindowMemory)
            }
            WindowPlan::Refused { reply } => {
                self.counters.from_deny_cache.fetch_add(1, Relaxed);
                (LimitAnswer { over: true, reply, source: Source::DenyCache }, Took::Nothing)
            }
            WindowPlan::Exact { lease: Some(want) } => Box::pin(self.with_lease(item, want)).await,
            WindowPlan::Exact { lease: None } | WindowPlan::Wait => self.alone(item).await,
        }
    }

    /// A window's request asked of Redis alone (its own call): exact, the
    /// room it shows never above the lowest Redis said, with what is held.
    pub(super) async fn alone(&self, item: &Item) -> (LimitAnswer, Took) {
        let Counter::Window { window, .. } = item.counter else { unreachable!("a window") };
        let sent = now_ms();
        let (reply, at_ms) = self.count_window(item, item.cost).await;
        let done = now_ms();
        let Some(r) = reply else { return (self.failed(item), Took::Nothing) };
        let reset = window_end_in(window.window_ms, done);
        let r = Reply { reset_after_ms: reset, limit: window.limit, ..r };
        self.came_back(item, item.cost, Some((r.remaining, reset)));
        let mut windows = self.windows();
        windows.answered(&item.key, item.cost, r, sent, done);
        if r.granted == 0 {
            return (LimitAnswer { over: true, reply: r, source: Source::Redis }, Took::Nothing);
        }
        if let Some(answer) = self.repaid(&mut windows, item, r, done) {
            return (answer, Took::Nothing);
        }
        let room = windows.room(&item.key).map_or(r.remaining, |room| room.min(r.remaining));
        let reply = Reply { remaining: (room + windows.held(&item.key, done)).min(window.limit), ..r };
        (LimitAnswer { over: false, reply, source: Source::Redis }, Took::Counted { at_ms })
    }

    /// `RL.WINDOW` of `cost` on `item`'s window alone, with TIME while the
    /// module takes it: its reply and the server's reading, if it answered
    /// (a failure is logged for the probe).
    pub(super) async fn count_window(&self, item: &Item, cost: u64) -> (Option<Reply>, Option<u64>) {
        let Counter::Window { mode, .. } = item.counter else { unreachable!("a window") };
        let key = Some(item.key.as_bytes());
        let mut args = window_args("RL.WINDOW", &[item], cost, mode);
        let (time, seen) = self.window_time();
        if time {
            args.push(Bytes::from_static(b"TIME"));
        }
        self.counters.redis_calls.fetch_add(1, Relaxed);
        self.sending(item, cost);
        let mut reply = self.relay.send(&args, key).await;
        if time && self.refuses_time(&reply, seen) {
            self.counters.redis_calls.fetch_add(1, Relaxed);
            reply = self.relay.send(&args[..args.len() - 1], key).await;
        }
        let answered = reply.module_reply();
        if answered.is_none() {
            self.came_back(item, cost, None);
            self.relay.health.failed("RL.WINDOW", &format!("{reply:?}"));
        }
        (answered, reply.module_time())
    }

    /// A fixed window's batch, taken in the background.
    pub(super) fn spawn_lease(self: &Arc<Self>, key: String, window: Window, want: u64) {
        if self.relay.health.unreachable() {
            self.windows().lease_failed(&key);
            self.lease_done.notify_waiters();
            return;
        }
        let engine = self.clone();
        self.counters.window_leases.fetch_add(1, Relaxed);
        self.counters.redis_calls.fetch_add(1, Relaxed);
        self.background(async move {
            let item = Item {
                key: key.clone(),
                counter: Counter::Window { mode: WindowMode::Fixed, window },
                cost: want,
                usage: false,
                refund: false,
                slot: String::new(),
                shadow: false,
                failure: FailureMode::Allow,
            };
            let args = window_args("RL.WINDOW", &[&item], want, WindowMode::Fixed);
            let sent = now_ms();
            engine.sending(&item, want);
            let reply = engine.relay.send(&args, Some(key.as_bytes())).await;
            let answered = reply.module_reply();
            {
                let mut windows = engine.windows();
                match answered {
                    Some(r) => {
                        let paid = windows.leased(&key, want, r, sent, now_ms());
                        engine.counters.fallback_repaid.fetch_add(paid, Relaxed);
                    }
                    None => windows.lease_failed(&key),
                }
            }
            engine.lease_done.notify_waiters();
            engine.came_back(&item, want, answered.map(|r| (r.remaining, r.reset_after_ms)));
        });
    }
}
