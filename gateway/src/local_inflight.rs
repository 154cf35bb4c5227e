//! The outage fallback of in-flight limits: slots held in this process
//! only, at this gateway's share of each limit.
//!
//! While Redis cannot answer, a fail-open in-flight rule of limit L admits
//! at most `share = max(1, floor(L x slack / gateways))` requests of a
//! subject at once on each gateway. Fleet-wide that is at most `gateways x
//! share <= max(slack x L, gateways)` in flight, plus the permits Redis
//! granted before the outage until they are released or reach their
//! deadline. A local slot has the same deadline as a Redis one (the
//! policy's shortest timeout), so a permit kept past it is gone here too.

use std::collections::HashMap;
use std::sync::Mutex;

use rl_client::internal::lock;

/// One subject's local slots, each (token, deadline on the limiter's clock, count).
type Slots = Vec<(u64, u64, u64)>;

/// Local in-flight slots of one policy, by subject. Only subjects holding a
/// slot have an entry: the map is bounded by the requests in flight.
#[derive(Debug, Default)]
pub(crate) struct LocalInflight {
    held: Mutex<(HashMap<Box<str>, Slots>, u64)>,
}

/// Why a local acquire was refused: the binding rule, what is in flight
/// locally, and the ms until enough local slots reach their deadline (None:
/// the cost is above the rule's share and never fits here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalRefusal {
    pub(crate) rule: usize,
    pub(crate) in_flight: u64,
    pub(crate) retry_ms: Option<u64>,
}

/// This gateway's share of `limit`: `limit x slack / gateways`, rounded
/// down, one at least.
pub(crate) fn local_share(limit: u64, slack: f64, gateways: u32) -> u64 {
    ((limit as f64 * slack / gateways.max(1) as f64).floor() as u64).max(1)
}

impl LocalInflight {
    /// Takes `cost` local slots of `subject` until `now + timeout_ms` if
    /// every share (one per rule) has room: the slot's token, what is in
    /// flight after it and the binding rule (the smallest share).
    pub(crate) fn acquire(
        &self,
        subject: &str,
        shares: &[u64],
        timeout_ms: u64,
        cost: u64,
        now: u64,
    ) -> Result<(u64, u64, usize), LocalRefusal> {
        let rule = (0..shares.len()).min_by_key(|&i| shares[i]).unwrap_or(0);
        let share = shares.get(rule).copied().unwrap_or(1);
        let mut guard = lock(&self.held);
        let (map, next) = &mut *guard;
        let slots = map.entry(subject.into()).or_default();
        slots.retain(|&(_, deadline, _)| deadline > now);
        let in_flight: u64 = slots.iter().map(|s| s.2).sum();
        if in_flight + cost > share {
            let retry_ms = (cost <= share).then(|| {
                slots.sort_unstable_by_key(|s| s.1);
                let (excess, mut freed) = (in_flight + cost - share, 0);
                let until = slots.iter().find(|s| {
                    freed += s.2;
                    freed >= excess
                });
                until.map_or(0, |s| s.1 - now)
            });
            if slots.is_empty() {
                map.remove(subject);
            }
            // The true count: a share lowered below what is held (a policy
            // reloaded, the fleet grown) shows what is held.
            return Err(LocalRefusal { rule, in_flight, retry_ms });
        }
        *next += 1;
        slots.push((*next, now + timeout_ms, cost));
        Ok((*next, in_flight + cost, rule))
    }

    /// Gives back the slot `token` of `subject`: whether it was still held.
    pub(crate) fn release(&self, subject: &str, token: u64, now: u64) -> bool {
        let mut guard = lock(&self.held);
        let map = &mut guard.0;
        let Some(slots) = map.get_mut(subject) else { return false };
        let held = slots.iter().any(|&(t, deadline, _)| t == token && deadline > now);
        slots.retain(|&(t, deadline, _)| t != token && deadline > now);
        if slots.is_empty() {
            map.remove(subject);
        }
        held
    }

    /// Subjects with an entry (for tests: the map does not grow).
    #[cfg(test)]
    fn subjects(&self) -> usize {
        lock(&self.held).0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_rounded_down_and_one_at_least() {
        assert_eq!(local_share(20, 2.0, 4), 10);
        assert_eq!(local_share(20, 2.0, 3), 13);
        assert_eq!(local_share(5, 2.0, 300), 1);
        assert_eq!(local_share(20, 1.0, 0), 20, "no fleet counts as one gateway");
    }

    #[test]
    fn at_most_the_smallest_share_and_releases_make_room() {
        let local = LocalInflight::default();
        let shares = [5, 2];
        let (a, n, rule) = local.acquire("u", &shares, 1000, 1, 0).unwrap();
        assert_eq!((n, rule), (1, 1));
        let (b, n, _) = local.acquire("u", &shares, 1000, 1, 10).unwrap();
        assert_eq!(n, 2);
        let refused = local.acquire("u", &shares, 1000, 1, 20).unwrap_err();
        assert_eq!(refused, LocalRefusal { rule: 1, in_flight: 2, retry_ms: Some(980) });
        assert!(local.acquire("other", &shares, 1000, 1, 20).is_ok(), "subjects are apart");
        assert!(local.release("u", a, 30));
        assert!(!local.release("u", a, 30), "released once");
        assert!(local.acquire("u", &shares, 1000, 1, 40).is_ok());
        assert_eq!(local.acquire("u", &shares, 1000, 3, 40).unwrap_err().retry_ms, None, "above the share");
        assert!(local.release("u", b, 50));
    }

    #[test]
    fn slots_past_their_deadline_are_gone() {
        let local = LocalInflight::default();
        let (a, _, _) = local.acquire("u", &[1], 100, 1, 0).unwrap();
        assert!(local.acquire("u", &[1], 100, 1, 99).is_err());
        assert!(local.acquire("u", &[1], 100, 1, 100).is_ok(), "the first slot's deadline passed");
        assert!(!local.release("u", a, 101), "an expired slot gives nothing back");
        let (_, _, _) = local.acquire("v", &[1], 100, 1, 0).unwrap();
        assert!(local.acquire("w", &[1], 100, 2, 0).is_err());
        assert_eq!(local.subjects(), 2, "a refused subject leaves no entry");
    }

    #[test]
    fn a_refusal_reports_the_true_count_above_a_lowered_share() {
        let local = LocalInflight::default();
        for now in 0..4 {
            local.acquire("u", &[4], 1000, 1, now).unwrap();
        }
        // The share fell to 2 (a lowered limit, a grown fleet) with 4 held.
        let refused = local.acquire("u", &[2], 1000, 1, 10).unwrap_err();
        assert_eq!(refused, LocalRefusal { rule: 0, in_flight: 4, retry_ms: Some(992) });
    }
}
