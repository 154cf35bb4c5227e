//! What a refused request's limits took, given back where it can be: to
//! memory, to the relay's pools, to Redis (`RL.REFUND`, `RL.WINDOW ...
//! REFUND at`, `RL.RELEASE`), the calls to Redis in the background; a
//! refund Redis did not take is logged and counted.

use super::*;

impl Engine {
    /// Gives back what a limit of a refused request took, where it can.
    pub(super) fn undo(self: &Arc<Self>, item: &Item, took: Took, now: u64) {
        let keys = || vec![Bytes::copy_from_slice(item.key.as_bytes())];
        match took {
            Took::Nothing => {}
            Took::WindowMemory => {
                self.counters.given_back.fetch_add(1, Relaxed);
                self.windows().give_back(&item.key, item.cost, now);
            }
            Took::Pool => {
                self.counters.given_back.fetch_add(1, Relaxed);
                self.relay.give_back(&keys(), item.cost);
            }
            Took::Redis => {
                let Counter::Bucket(params) = item.counter else { return };
                self.counters.refunds.fetch_add(1, Relaxed);
                self.counters.redis_calls.fetch_add(1, Relaxed);
                let args = bucket_args("RL.REFUND", &item.key, &params, "TOKENS", item.cost);
                let engine = self.clone();
                let key = item.key.clone();
                self.background(async move {
                    let reply = engine.relay.send(&args, Some(key.as_bytes())).await;
                    engine.refunded("RL.REFUND", &reply);
                });
            }
            Took::Counted { .. } => {
                self.counters.window_counts_kept.fetch_add(1, Relaxed);
            }
            Took::Slot => {
                self.counters.refunds.fetch_add(1, Relaxed);
                self.counters.redis_calls.fetch_add(1, Relaxed);
                let args = slots::release_args(&item.key, &item.slot);
                let engine = self.clone();
                let key = item.key.clone();
                self.background(async move {
                    let reply = engine.relay.send(&args, Some(key.as_bytes())).await;
                    engine.released(&reply);
                });
            }
        }
    }

    /// Gives back the window counts of a refused request, in the background:
    /// one `RL.WINDOW ... REFUND at` per call that counted them (the same
    /// mode, cost and reading; one key per call in a cluster).
    pub(super) fn refund_windows(self: &Arc<Self>, counted: &[(&Item, u64)]) {
        let members = counted.iter().filter_map(|&(item, at)| match item.counter {
            Counter::Window { mode, .. } => Some(((mode, item.cost, at), item)),
            _ => None,
        });
        for ((mode, cost, at), group) in self.window_calls(members, |&item| item.key.as_str()) {
            let mut args = window_args("RL.WINDOW", &group, cost, mode);
            args.push(Bytes::from_static(b"REFUND"));
            args.push(at.to_string().into());
            // The room memory holds only falls but by a refund: this one.
            let mut windows = self.windows();
            for item in &group {
                windows.raise_room(&item.key, cost);
            }
            drop(windows);
            self.counters.window_refunds.fetch_add(group.len() as u64, Relaxed);
            self.counters.redis_calls.fetch_add(1, Relaxed);
            let engine = self.clone();
            let key = group[0].key.clone();
            self.background(async move {
                let reply = engine.relay.send(&args, Some(key.as_bytes())).await;
                engine.refunded("RL.WINDOW REFUND", &reply);
            });
        }
    }

    /// A release's reply (the keys it freed): an error is logged and
    /// counted; the slot then heals at its deadline.
    pub(super) fn released(&self, reply: &crate::reply::Reply) {
        if !matches!(reply, crate::reply::Reply::Int(_)) {
            self.counters.refund_errors.fetch_add(1, Relaxed);
            self.relay.health.failed("RL.RELEASE", &format!("{reply:?}"));
        }
    }

    /// A refund's reply: one Redis did not take is logged and counted.
    pub(super) fn refunded(&self, what: &str, reply: &crate::reply::Reply) {
        if reply.module_reply().is_none() {
            self.counters.refund_errors.fetch_add(1, Relaxed);
            self.relay.health.failed(what, &format!("{reply:?}"));
        }
    }
}
