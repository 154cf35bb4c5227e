//! What a call decided, read from the module's six-integer reply.

use std::time::Duration;

use crate::error::{Error, Result};

/// Where a [`Decision`] came from. Each path has its own error direction
/// (see the crate README's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// Redis answered this call: exact.
    Redis,
    /// Spent from tokens this gateway leased earlier: never over, only under.
    Lease,
    /// Refused from memory: Redis refused this subject moments ago (at most
    /// rl-gateway's `LimiterConfig::deny_hold_max`) and said when
    /// to come back: `retry_after` is that time, counted down. Never over.
    DenyCache,
    /// Refused from memory without a refusal from Redis: the subject's
    /// bucket is contended (a lease call got fewer tokens than it asked
    /// for) and this gateway has had its share of the rate for now; it asks
    /// again once that share has refilled what the last call granted. Never
    /// over.
    Pacing,
    /// Redis could not answer; a local bucket at this gateway's share of the
    /// limit decided (one token at least). Approximate: about `slack` times
    /// the limit fleet-wide; a rule whose share is below one token admits up
    /// to one request per gateway at once (see the crate README).
    Fallback,
    /// Redis could not answer and a rule of the call is fail-closed, or it
    /// is a window whose fallback share is below one token: refused.
    FailClosed,
}

/// The answer to a rate-limit call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may go on.
    pub allowed: bool,
    /// Whole tokens left in the binding bucket.
    pub remaining: u64,
    /// How long to wait before the same call can succeed: zero when
    /// allowed; `None` when it never can (the cost exceeds a capacity).
    pub retry_after: Option<Duration>,
    /// How long until every bucket of the call is full again.
    pub reset_after: Duration,
    /// The capacity of the binding bucket.
    pub limit: u64,
    /// Index of the binding rule: the one that refused (or, when allowed,
    /// the one with the fewest tokens left). For an rl-gateway `Policy`
    /// call it indexes `Policy::rules`; for a raw
    /// call, the buckets or windows passed in.
    pub rule: usize,
    /// Which path decided.
    pub source: Source,
    /// Index of a shadow rule (in `Policy::rules`)
    /// that refused this request without being enforced.
    pub shadow_refused: Option<usize>,
}

impl Decision {
    /// Reads the module's reply `[allowed, remaining, retry_after_ms,
    /// reset_after_ms, limit, binding]` (RL.TAKE, RL.PEEK, RL.REFUND,
    /// RL.WINDOW; RL.LEASE puts the granted count first) for a call on
    /// `keys` buckets.
    pub(crate) fn from_reply(reply: &[i64], keys: usize) -> Result<Decision> {
        let bad = || Error::Reply(format!("{reply:?} is not six integers as the module sends"));
        let &[first, remaining, retry_ms, reset_ms, limit, binding] = reply else { return Err(bad()) };
        let binding = usize::try_from(binding).ok().filter(|&b| b < keys).ok_or_else(bad)?;
        let (Ok(remaining), Ok(reset_ms), Ok(limit)) =
            (u64::try_from(remaining), u64::try_from(reset_ms), u64::try_from(limit))
        else {
            return Err(bad());
        };
        let retry_after = match retry_ms {
            -1 => None,
            ms => Some(Duration::from_millis(u64::try_from(ms).map_err(|_| bad())?)),
        };
        if first < 0 {
            return Err(bad());
        }
        Ok(Decision {
            allowed: first > 0,
            remaining,
            retry_after,
            reset_after: Duration::from_millis(reset_ms),
            limit,
            rule: binding,
            source: Source::Redis,
            shadow_refused: None,
        })
    }

    /// An rl-core decision (the local fallback's), as a `Decision`.
    #[doc(hidden)]
    pub fn from_core(d: &rl_core::Reply, source: Source) -> Decision {
        Decision {
            allowed: d.allowed(),
            remaining: d.remaining,
            retry_after: u64::try_from(d.retry_after_ms).ok().map(Duration::from_millis),
            reset_after: Duration::from_millis(d.reset_after_ms),
            limit: d.limit,
            rule: d.binding,
            source,
            shadow_refused: None,
        }
    }

    /// Reads CL.THROTTLE's reply `[limited, limit, remaining,
    /// retry_after_s, reset_after_s]` (-1 retry when allowed).
    pub(crate) fn from_throttle_reply(reply: &[i64]) -> Result<Decision> {
        let bad = || Error::Reply(format!("{reply:?} is not the five integers CL.THROTTLE sends"));
        let &[limited, limit, remaining, retry_s, reset_s] = reply else { return Err(bad()) };
        let (Ok(limit), Ok(remaining), Ok(reset_s)) =
            (u64::try_from(limit), u64::try_from(remaining), u64::try_from(reset_s))
        else {
            return Err(bad());
        };
        let allowed = match limited {
            0 => true,
            1 => false,
            _ => return Err(bad()),
        };
        let retry_after = match (allowed, retry_s) {
            (true, _) => Some(Duration::ZERO),
            (false, -1) => None,
            (false, s) => Some(Duration::from_secs(u64::try_from(s).map_err(|_| bad())?)),
        };
        Ok(Decision {
            allowed,
            remaining,
            retry_after,
            reset_after: Duration::from_secs(reset_s),
            limit,
            rule: 0,
            source: Source::Redis,
            shadow_refused: None,
        })
    }
}

/// The answer to RL.LEASE: how many tokens were handed over, and the
/// bucket's standing after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Tokens taken from every bucket for this caller to spend (0: refused).
    pub tokens: u64,
    /// `allowed` is `tokens > 0`; `retry_after` is for the minimum asked.
    pub decision: Decision,
}

impl Grant {
    pub(crate) fn from_reply(reply: &[i64], keys: usize) -> Result<Grant> {
        let decision = Decision::from_reply(reply, keys)?;
        // from_reply checked there are six fields and the first is >= 0.
        let tokens = reply.first().map_or(0, |&g| g as u64);
        Ok(Grant { tokens, decision })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_allowed_and_a_refused_reply() {
        let d = Decision::from_reply(&[1, 9, 0, 100, 10, 1], 2).unwrap();
        assert!(d.allowed);
        assert_eq!((d.remaining, d.retry_after, d.limit, d.rule), (9, Some(Duration::ZERO), 10, 1));
        assert_eq!(d.reset_after, Duration::from_millis(100));
        let d = Decision::from_reply(&[0, 0, 1500, 3000, 5, 0], 1).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_millis(1500)));
        let never = Decision::from_reply(&[0, 3, -1, 0, 3, 0], 1).unwrap();
        assert_eq!(never.retry_after, None);
    }

    #[test]
    fn refuses_malformed_replies() {
        for (reply, keys) in [
            (&[1, 2, 3][..], 1),
            (&[1, 2, 0, 4, 5, 1][..], 1),  // binding out of range
            (&[1, -2, 0, 4, 5, 0][..], 1), // negative remaining
            (&[1, 2, -5, 4, 5, 0][..], 1), // negative retry other than -1
            (&[-1, 2, 0, 4, 5, 0][..], 1),
        ] {
            assert!(Decision::from_reply(reply, keys).is_err(), "{reply:?}");
        }
    }

    #[test]
    fn reads_a_lease_grant() {
        let g = Grant::from_reply(&[7, 3, 0, 50, 10, 0], 1).unwrap();
        assert_eq!(g.tokens, 7);
        assert!(g.decision.allowed);
        let g = Grant::from_reply(&[0, 0, 20, 50, 10, 0], 1).unwrap();
        assert_eq!(g.tokens, 0);
        assert!(!g.decision.allowed);
    }

    #[test]
    fn reads_cl_throttle() {
        let d = Decision::from_throttle_reply(&[0, 16, 15, -1, 2]).unwrap();
        assert!(d.allowed);
        assert_eq!((d.limit, d.remaining, d.retry_after), (16, 15, Some(Duration::ZERO)));
        let d = Decision::from_throttle_reply(&[1, 16, 0, 3, 60]).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_secs(3)));
        assert_eq!(d.reset_after, Duration::from_secs(60));
        assert!(Decision::from_throttle_reply(&[2, 16, 0, 3, 60]).is_err());
    }
}
