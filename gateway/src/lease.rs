//! Tokens this gateway leased from Redis for busy subjects: each subject's
//! lease under its own lock, the one RL.LEASE call under way for it, and
//! the tokens a request reserved while it waits for Redis. The limiter's
//! path through them (spend, lease when short, top up in the background)
//! is `limiter/leased.rs`.
//!
//! The decisions are rl-core's (`rl_core::lease`: batch sizing, pacing and
//! one subject's lease state, with why they are safe: never over, only
//! under); the relay and the scale model run the same code. Here: the
//! locks, and the standing a request served from memory reports.
//!
//! At most one RL.LEASE per subject is under way (the first request on a
//! short lease, or the background top-up at half empty): requests that find
//! the lease short meanwhile ask Redis for their own cost only, so one
//! gateway never holds more than about a batch, however many requests
//! arrive at once. In a fleet a contended bucket is paced (until this
//! gateway's share of the rate has refilled what the last call granted, a
//! request the lease cannot pay is refused from memory); a gateway alone
//! is never paced: a request the lease cannot pay asks Redis (rl-core's
//! `Lease::spend_or_ask`).
//!
//! Memory is bounded: at most `entries` subjects hold a lease (quick_cache,
//! CLOCK-Pro eviction).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quick_cache::sync::Cache;
use rl_client::internal::lock;
use rl_client::{Clock, Decision, Source};
use rl_core::lease::Spend as CoreSpend;

use crate::subject::{Subject, SubjectKey};

/// One subject's lease: rl-core's state, and the buckets' standing at the
/// last grant (for the headers) and when.
#[derive(Debug, Default)]
pub(crate) struct Lease {
    state: rl_core::lease::Lease,
    last: Option<(Decision, u64)>,
    /// Redis's last refusal of this subject here, and when: what a paced
    /// refusal answers from.
    refusal: Option<(Decision, u64)>,
}

/// What spending from a lease found.
#[derive(Debug)]
pub(crate) enum Spend {
    /// Paid from the lease; `refill`, when given, asks the caller to top it
    /// up in the background (it reached half of a batch).
    Hit { decision: Decision, refill: Option<LeaseCall> },
    /// Not enough tokens: `reserved` (fewer than the cost) were taken out
    /// for this request, which needs the rest from Redis. With `lease`, it
    /// is the one lease call under way and asks for a batch; without, it
    /// asks for the rest only.
    Short { reserved: u64, lease: Option<LeaseCall> },
    /// In a fleet, the bucket is contended and this gateway has had its
    /// share for now: refused from memory (nothing reserved).
    Paced,
}

/// The one RL.LEASE call under way for a subject (not an in-flight limit:
/// those are [`Inflight`](crate::Inflight)). Dropping it (the call
/// answered, failed, or was abandoned: a cancelled request, a task that
/// never ran) lets the next one go, so the flag can never stick. The flag
/// is cleared once: [`LeaseCall::done`] takes the entry out, so its drop
/// cannot clear the flag of a newer call that was claimed in between.
#[derive(Debug)]
pub(crate) struct LeaseCall(Option<Arc<Mutex<Lease>>>);

impl LeaseCall {
    /// The call answered: `update` runs on the lease, and the next call may
    /// go, under one lock.
    pub(crate) fn done<R>(mut self, update: impl FnOnce(&mut Lease) -> R) -> Option<R> {
        let entry = self.0.take()?;
        let mut l = lock(&entry);
        l.state.call_done();
        Some(update(&mut l))
    }
}

impl Drop for LeaseCall {
    fn drop(&mut self) {
        if let Some(entry) = self.0.take() {
            lock(&entry).state.call_done();
        }
    }
}

/// Tokens a short request took out of its lease before waiting for Redis:
/// put back if the request is dropped meanwhile (a cancelled future), so a
/// cancelled request loses nothing; [`Reserved::spent`] once they are.
pub(crate) struct Reserved<'a> {
    entry: &'a Arc<Mutex<Lease>>,
    tokens: u64,
    clock: &'a Clock,
}

impl<'a> Reserved<'a> {
    pub(crate) fn new(entry: &'a Arc<Mutex<Lease>>, tokens: u64, clock: &'a Clock) -> Reserved<'a> {
        Reserved { entry, tokens, clock }
    }

    /// Gives the tokens back now, with `extra` more (granted but not spent).
    pub(crate) fn put_back(mut self, extra: u64, now_ms: u64) {
        let tokens = std::mem::take(&mut self.tokens) + extra;
        if tokens > 0 {
            lock(self.entry).put_back(tokens, now_ms);
        }
    }

    /// How many tokens it holds.
    pub(crate) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The request was paid: the tokens are spent.
    pub(crate) fn spent(mut self) {
        self.tokens = 0;
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if self.tokens > 0 {
            lock(self.entry).put_back(self.tokens, self.clock.now_ms());
        }
    }
}

/// Spends `cost` tokens of `entry` at `now_ms` if it holds them (expired
/// ones are dropped first); `batch` is the size of a top-up; in a fleet.
#[cfg(test)]
pub(crate) fn spend(entry: &Arc<Mutex<Lease>>, cost: u64, batch: u64, now_ms: u64) -> Spend {
    spend_with(entry, cost, batch, now_ms, true, || true)
}

/// [`spend`], where `may_call` says whether a lease call could go to Redis
/// now, asked only when one is wanted: if not (the shard's breaker refuses
/// it), no lease call is claimed: no top-up is asked for, and a short
/// request asks for its own cost. `in_fleet`: other gateways take from the
/// bucket too, and a contended lease is paced (rl-core's `Lease::spend`);
/// alone, a request the lease cannot pay asks Redis (`Lease::spend_or_ask`:
/// nobody else takes the refill, so pacing could only refuse what Redis
/// holds).
pub(crate) fn spend_with(
    entry: &Arc<Mutex<Lease>>,
    cost: u64,
    batch: u64,
    now_ms: u64,
    in_fleet: bool,
    may_call: impl FnOnce() -> bool,
) -> Spend {
    let mut l = lock(entry);
    let call = |lead: bool| lead.then(|| LeaseCall(Some(entry.clone())));
    let spent = if in_fleet {
        l.state.spend(cost, batch, now_ms, may_call)
    } else {
        l.state.spend_or_ask(cost, batch, now_ms, may_call)
    };
    match spent {
        CoreSpend::Hit { top_up } => Spend::Hit { decision: l.estimate(now_ms), refill: call(top_up) },
        CoreSpend::Short { reserved, lead } => Spend::Short { reserved, lease: call(lead) },
        CoreSpend::Paced { .. } => Spend::Paced,
    }
}

impl Lease {
    /// Adds granted tokens (expired ones are dropped, never revived).
    pub(crate) fn add(&mut self, tokens: u64, standing: &Decision, now_ms: u64, ttl_ms: u64) {
        self.state.add(tokens, now_ms, ttl_ms);
        self.last = Some((*standing, now_ms));
    }

    /// A lease call asked for `wanted` and got `granted`: fewer means the
    /// bucket is contended, and the next call waits `pace_ms`.
    pub(crate) fn answered(&mut self, wanted: u64, granted: u64, pace_ms: u64, now_ms: u64) {
        self.state.answered(wanted, granted, pace_ms, now_ms);
    }

    /// What a lease call asks for: a batch, two while contended.
    pub(crate) fn want(&self, batch: u64) -> u64 {
        self.state.want(batch)
    }

    /// Redis refused a call for this subject at `now_ms` (`refused`, mapped
    /// to the policy's rules): what a paced refusal names.
    pub(crate) fn refused(&mut self, refused: &Decision, now_ms: u64) {
        self.refusal = Some((*refused, now_ms));
    }

    /// A refusal from memory while paced: Redis's last refusal, its times
    /// counted down (the module's retry time, never the pace: that is this
    /// gateway's share of the fleet, and another gateway may admit the
    /// subject sooner; past it, 1 ms), no quota left.
    pub(crate) fn paced_refusal(&self, now_ms: u64) -> Decision {
        let (refused, at_ms) = self.refusal.unwrap_or((self.estimate(now_ms), now_ms));
        let past = Duration::from_millis(now_ms.saturating_sub(at_ms));
        let retry = refused.retry_after.unwrap_or_default().saturating_sub(past).max(Duration::from_millis(1));
        Decision {
            allowed: false,
            remaining: 0,
            retry_after: Some(retry),
            reset_after: refused.reset_after.saturating_sub(past).max(retry),
            source: Source::Pacing,
            shadow_refused: None,
            ..refused
        }
    }

    /// Gives back tokens reserved by a request that did not get the rest,
    /// unless the lease expired meanwhile (then they are dropped).
    pub(crate) fn put_back(&mut self, tokens: u64, now_ms: u64) {
        self.state.put_back(tokens, now_ms);
    }

    /// The standing a request served from memory reports at `now_ms`: the
    /// buckets' remaining at the last grant plus what this gateway still
    /// holds, and the time until full counted down from that grant.
    pub(crate) fn estimate(&self, now_ms: u64) -> Decision {
        let (last, at_ms) = self.last.unwrap_or((
            Decision {
                allowed: true,
                remaining: 0,
                retry_after: Some(Duration::ZERO),
                reset_after: Duration::ZERO,
                limit: 0,
                rule: 0,
                source: Source::Lease,
                shadow_refused: None,
            },
            now_ms,
        ));
        Decision {
            allowed: true,
            remaining: last.remaining.saturating_add(self.state.tokens()),
            retry_after: Some(Duration::ZERO),
            reset_after: last.reset_after.saturating_sub(Duration::from_millis(now_ms.saturating_sub(at_ms))),
            source: Source::Lease,
            shadow_refused: None,
            ..last
        }
    }
}

/// Every busy subject's lease.
pub(crate) struct Leases {
    map: Cache<SubjectKey, Arc<Mutex<Lease>>>,
}

impl Leases {
    pub(crate) fn new(entries: usize) -> Leases {
        Leases { map: Cache::new(entries) }
    }

    /// The subject's lease, created empty if it has none.
    pub(crate) fn entry(&self, key: &impl Subject) -> Arc<Mutex<Lease>> {
        if let Some(lease) = self.map.get(key) {
            return lease;
        }
        match self.map.get_or_insert_with(&key.owned(), || Ok::<_, std::convert::Infallible>(Arc::default())) {
            Ok(lease) => lease,
            Err(never) => match never {},
        }
    }

    /// Drops the leases of `subject` in every group (their tokens are lost,
    /// never handed back: under, never over): how many.
    pub(crate) fn forget(&self, subject: &str) -> usize {
        crate::subject::forget_subject(&self.map, subject)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn standing(remaining: u64) -> Decision {
        Decision {
            allowed: true,
            remaining,
            retry_after: Some(Duration::ZERO),
            reset_after: Duration::from_millis(40),
            limit: 1000,
            rule: 1,
            source: Source::Redis,
            shadow_refused: None,
        }
    }

    fn new_lease() -> Arc<Mutex<Lease>> {
        Arc::default()
    }

    fn add(l: &Arc<Mutex<Lease>>, tokens: u64, remaining: u64, now_ms: u64) {
        lock(l).add(tokens, &standing(remaining), now_ms, 1000);
    }

    /// (reserved, whether it is the lease call under way) of a short spend.
    fn short(s: Spend) -> (u64, bool) {
        match s {
            Spend::Short { reserved, lease } => (reserved, lease.is_some()),
            hit => panic!("{hit:?}"),
        }
    }

    #[test]
    fn spends_from_memory_and_refills_at_half_empty_once() {
        let l = new_lease();
        add(&l, 9, 500, 0);
        let mut refills: Vec<Option<LeaseCall>> = (0..5)
            .map(|_| match spend(&l, 1, 10, 0) {
                Spend::Hit { refill, .. } => refill,
                short => panic!("{short:?}"),
            })
            .collect();
        // 8, 7, 6 left: no refill; 5 is half of 10: refill once, not again.
        assert_eq!(refills.iter().map(Option::is_some).collect::<Vec<_>>(), [false, false, false, true, false]);
        drop(refills.remove(3));
        let Spend::Hit { decision, refill } = spend(&l, 1, 10, 30) else { panic!() };
        assert!(refill.is_some(), "a finished refill lets the next one go");
        assert_eq!((decision.remaining, decision.limit, decision.rule, decision.source), (503, 1000, 1, Source::Lease));
        assert_eq!(decision.reset_after, Duration::from_millis(10), "40 ms to full at the grant, 30 ms ago");
    }

    #[test]
    fn one_lease_call_at_a_time() {
        let l = new_lease();
        let Spend::Short { reserved: 0, lease: Some(call) } = spend(&l, 3, 10, 0) else {
            panic!("the first short request leases a batch")
        };
        assert_eq!(short(spend(&l, 1, 10, 0)), (0, false), "the others ask for their own cost meanwhile");
        // The call answers: its tokens are in, and the next call may go.
        call.done(|l| l.add(4, &standing(0), 0, 1000));
        let Spend::Hit { refill: Some(refill), .. } = spend(&l, 4, 10, 0) else { panic!("empty: a top-up at once") };
        assert_eq!(short(spend(&l, 1, 10, 0)), (0, false), "not beside the top-up");
        // A call dropped without an answer (a cancelled request, a task that
        // never ran) does not leave the flag set.
        drop(refill);
        assert_eq!(short(spend(&l, 1, 10, 0)), (0, true));
    }

    #[test]
    fn a_finished_call_never_clears_a_newer_calls_flag() {
        // Threads lead calls and finish them at once. At most one call may be
        // in flight: `done` clears the flag once, so the drop of a finished
        // call cannot clear the flag of the next one.
        let l = new_lease();
        let in_flight = std::sync::atomic::AtomicU32::new(0);
        let most = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        if let Spend::Short { lease: Some(call), .. } = spend(&l, 1, 10, 0) {
                            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            in_flight.fetch_sub(1, Ordering::SeqCst);
                            call.done(|_| ());
                        }
                    }
                });
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 1, "two RL.LEASE in flight for one subject");
    }

    #[test]
    fn reserved_tokens_come_back_when_the_request_is_dropped() {
        let l = new_lease();
        let clock = rl_client::Clock::Manual(rl_client::ManualClock::new());
        let now = clock.now_ms();
        add(&l, 2, 0, now);
        let reserved = short(spend(&l, 3, 10, now)).0;
        assert_eq!(reserved, 2);
        // The request waiting for Redis is dropped: its guard gives them back.
        drop(Reserved::new(&l, reserved, &clock));
        assert!(matches!(spend(&l, 2, 10, now), Spend::Hit { .. }));
        // Spent: nothing comes back.
        add(&l, 2, 0, now);
        let reserved = short(spend(&l, 3, 10, now)).0;
        Reserved::new(&l, reserved, &clock).spent();
        assert_eq!(short(spend(&l, 1, 10, now)).0, 0);
    }

    #[test]
    fn a_contended_lease_is_paced_in_a_fleet_never_alone() {
        let l = new_lease();
        let Spend::Short { lease: Some(call), .. } = spend(&l, 1, 10, 0) else { panic!("leads") };
        // Asked for 10, got 4: contended, paced for 50 ms.
        call.done(|l| {
            l.answered(10, 4, 50, 0);
            l.add(3, &standing(0), 0, 1000);
        });
        assert_eq!(lock(&l).want(10), 20);
        for _ in 0..3 {
            assert!(matches!(spend(&l, 1, 10, 10), Spend::Hit { refill: None, .. }), "no top-up while paced");
        }
        // In a fleet: refused from memory until the pace ends, no quota left.
        assert!(matches!(spend(&l, 1, 10, 10), Spend::Paced), "refused from memory");
        let d = lock(&l).paced_refusal(10);
        assert_eq!((d.allowed, d.remaining, d.source, d.limit, d.rule), (false, 0, Source::Pacing, 1000, 1));
        // Once Redis refused, a paced refusal names its retry time counted
        // down, never the pace (1 ms once past it).
        let refusal = Decision { allowed: false, retry_after: Some(Duration::from_millis(4)), ..standing(3) };
        lock(&l).refused(&refusal, 10);
        assert_eq!(lock(&l).paced_refusal(12).retry_after, Some(Duration::from_millis(2)));
        assert_eq!(lock(&l).paced_refusal(30).retry_after, Some(Duration::from_millis(1)), "past Redis's time");
        assert!(matches!(spend(&l, 1, 10, 49), Spend::Paced), "until the pace ends");
        // Alone, the same lease asks Redis: it may hold refill nobody took.
        let alone = spend_with(&l, 1, 10, 49, false, || true);
        let Spend::Short { lease: Some(call), .. } = alone else { panic!("asks Redis alone: {alone:?}") };
        drop(call);
        // The pace ends: one call leads.
        let Spend::Short { lease: Some(call), .. } = spend(&l, 1, 10, 50) else { panic!("leads") };
        // It got all it asked for: no longer contended.
        call.done(|l| {
            l.answered(20, 20, 50, 50);
            l.add(19, &standing(0), 50, 1000);
        });
        assert_eq!(lock(&l).want(10), 10);
        assert!(matches!(spend(&l, 15, 10, 51), Spend::Hit { .. }));
    }
}
