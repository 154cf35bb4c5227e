//! The share table one region's gateways enforce: for each global rule, the
//! region's default share and the shares of the busy subjects the balancer
//! follows. Stored as JSON in the region's Redis (see `store`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::global::ramp::ramped_capacity;
use crate::global::stale::share_in_force;

/// One region's shares of every global rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareTable {
    /// By global rule id.
    pub rules: BTreeMap<String, RuleShares>,
}

/// One global rule's shares in this region.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleShares {
    /// The share (ppm) of subjects the balancer does not follow.
    pub default: u32,
    /// Busy subjects' shares.
    #[serde(default)]
    pub subjects: BTreeMap<String, Share>,
    /// The default share's ramp after a raise (its `from` and `ramped_ms`),
    /// for the subjects that have no share of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_ramp: Option<(u32, u64)>,
}

impl RuleShares {
    /// The default share with its ramp.
    pub fn default_share(&self) -> Share {
        match self.default_ramp {
            Some((from, ramped_ms)) => Share { share: self.default, from, ramped_ms },
            None => Share::steady(self.default),
        }
    }

    /// Sets the default share and its ramp.
    pub fn set_default(&mut self, share: Share) {
        self.default = share.share;
        self.default_ramp = share.ramping().then_some((share.from, share.ramped_ms));
    }
}

/// A subject's share, and the share it was raised from by the last change
/// (equal when it was not raised): the capacity ramps from the old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Share {
    /// The share in force, ppm.
    pub share: u32,
    /// The share before the last raise, ppm (the ramp's start).
    pub from: u32,
    /// How long the ramp from `from` had run when the table last changed
    /// (a ramp longer than a balancer round carries on across rounds; the
    /// gateway adds the time since the change).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ramped_ms: u64,
}

fn is_zero(ms: &u64) -> bool {
    *ms == 0
}

impl Share {
    /// A share that is not ramping.
    pub fn steady(share: u32) -> Share {
        Share { share, from: share, ramped_ms: 0 }
    }

    /// Whether its capacity may still be ramping up from `from`.
    pub fn ramping(&self) -> bool {
        self.from < self.share
    }
}

/// A global limit's parameters, as the rule states them for the whole world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalBucket {
    /// Tokens the bucket holds at most, worldwide.
    pub capacity: u64,
    /// Tokens added every `period_ms`, worldwide.
    pub refill: u64,
    /// The refill period in ms.
    pub period_ms: u64,
}

/// What a region enforces of a [`GlobalBucket`]: capacity and refill,
/// rounded down. `None`: the share is worth less than one token of capacity
/// or refill, and the region refuses (under, never over).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionalBucket {
    /// Capacity in this region now (ramping after a raise).
    pub capacity: u64,
    /// Refill in this region every `period_ms`.
    pub refill: u64,
}

impl GlobalBucket {
    /// This region's part at `share` ppm, raised from `from` ppm
    /// `since_change` ago (see [`ramped_capacity`]). A share or a start
    /// above the whole is no share: refused, never enforced above the limit.
    pub fn regional(&self, share: u32, from: u32, since_change: Duration) -> Option<RegionalBucket> {
        if share > crate::global::WHOLE || from > crate::global::WHOLE {
            return None;
        }
        let part = |total: u64, ppm: u32| (total as u128 * ppm as u128 / crate::global::WHOLE as u128) as u64;
        let refill = part(self.refill, share);
        let to = part(self.capacity, share);
        let capacity =
            ramped_capacity(part(self.capacity, from), to, refill, self.period_ms, since_change.as_millis() as u64);
        (capacity >= 1 && refill >= 1).then_some(RegionalBucket { capacity, refill })
    }
}

impl ShareTable {
    /// Every share within the whole: a table holding one above it was not
    /// written by a balancer, and enforcing it would admit more than the
    /// whole limit in one region. `Err` names the rule, the share and by
    /// how much.
    pub fn check(&self) -> Result<(), String> {
        let above = |rule: &str, what: &str, ppm: u32| {
            format!(
                "has rule {rule}'s {what} of {ppm} ppm, above the whole ({} ppm): enforced, it would admit {} times the limit in this region alone",
                crate::global::WHOLE,
                ppm / crate::global::WHOLE
            )
        };
        for (id, r) in &self.rules {
            let default = r.default_share();
            for (what, ppm) in [("default share", default.share), ("default share's ramp start", default.from)] {
                if ppm > crate::global::WHOLE {
                    return Err(above(id, what, ppm));
                }
            }
            for (subject, s) in &r.subjects {
                for (what, ppm) in [("share", s.share), ("ramp start", s.from)] {
                    if ppm > crate::global::WHOLE {
                        return Err(above(id, &format!("{what} for subject {subject:?}"), ppm));
                    }
                }
            }
        }
        Ok(())
    }

    /// The share of `subject` under `rule`, with the one it was raised
    /// from: the subject's own, else the rule's default, else `None` (the
    /// table does not know the rule: use the fixed split).
    pub fn lookup(&self, rule: &str, subject: &str) -> Option<Share> {
        let r = self.rules.get(rule)?;
        Some(r.subjects.get(subject).copied().unwrap_or_else(|| r.default_share()))
    }

    /// The share to enforce with the table `age` old and its last change
    /// `since_change` ago (see [`share_in_force`]); `fixed` is this
    /// region's fixed split. Answers the share and how long its ramp has
    /// run (what it had run at the last change, and since): a fallback that
    /// raises ramps from the smaller share, from the moment it applies.
    pub fn in_force(
        &self,
        rule: &str,
        subject: &str,
        fixed: u32,
        (age, since_change): (Duration, Duration),
        stale_after: Duration,
        settle: Duration,
    ) -> (Share, Duration) {
        let last = self.lookup(rule, subject).unwrap_or(Share::steady(fixed));
        let share = share_in_force(last.share, fixed, age, stale_after, settle);
        if share == last.share {
            (last, since_change + Duration::from_millis(last.ramped_ms))
        } else {
            let from = last.share.min(fixed);
            (Share { share, from, ramped_ms: 0 }, age.saturating_sub(stale_after + settle))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_enforces_its_part_ramping_after_a_raise() {
        let g = GlobalBucket { capacity: 1000, refill: 1000, period_ms: 1000 };
        assert_eq!(g.regional(700_000, 700_000, Duration::ZERO), Some(RegionalBucket { capacity: 700, refill: 700 }));
        assert_eq!(g.regional(700_000, 100_000, Duration::ZERO), Some(RegionalBucket { capacity: 100, refill: 700 }));
        assert_eq!(
            g.regional(700_000, 100_000, Duration::from_millis(500)),
            Some(RegionalBucket { capacity: 450, refill: 700 })
        );
        assert_eq!(g.regional(500, 500, Duration::ZERO), None, "half a token: refused, never rounded up");
        assert_eq!(g.regional(crate::global::WHOLE + 1, 0, Duration::from_secs(9)), None, "above the whole: no share");
    }

    #[test]
    fn a_share_above_the_whole_is_named() {
        let t: ShareTable = serde_json::from_str(r#"{"rules":{"api":{"default":99999999}}}"#).unwrap();
        let e = t.check().unwrap_err();
        assert!(e.contains("api's default share of 99999999 ppm") && e.contains("99 times"), "{e}");
        let t: ShareTable = serde_json::from_str(
            r#"{"rules":{"api":{"default":1000,"subjects":{"acme":{"share":5,"from":1000001}}}}}"#,
        )
        .unwrap();
        assert!(t.check().unwrap_err().contains("ramp start for subject \"acme\" of 1000001 ppm"));
        let whole: ShareTable = serde_json::from_str(r#"{"rules":{"api":{"default":1000000}}}"#).unwrap();
        assert_eq!(whole.check(), Ok(()));
    }

    #[test]
    fn lookup_falls_back_to_the_rule_default_then_none() {
        let json = r#"{"rules":{"api":{"default":333333,"subjects":{"acme":{"share":700000,"from":100000}}}}}"#;
        let t: ShareTable = serde_json::from_str(json).unwrap();
        assert_eq!(t.lookup("api", "acme"), Some(Share { share: 700_000, from: 100_000, ramped_ms: 0 }));
        assert_eq!(t.lookup("api", "other"), Some(Share::steady(333_333)));
        assert_eq!(t.lookup("login", "acme"), None);
        let (s, settle) = (Duration::from_secs(300), Duration::from_secs(10));
        let aged = |secs| (Duration::from_secs(secs), Duration::from_secs(secs));
        assert_eq!(t.in_force("api", "acme", 333_333, aged(301), s, settle).0.share, 333_333);
        assert_eq!(t.in_force("api", "x", 500_000, aged(301), s, settle).0.share, 333_333);
        assert_eq!(
            t.in_force("api", "x", 500_000, aged(312), s, settle),
            (Share { share: 500_000, from: 333_333, ramped_ms: 0 }, Duration::from_secs(2))
        );
        assert_eq!(
            t.in_force("api", "acme", 333_333, aged(5), s, settle),
            (t.lookup("api", "acme").unwrap(), aged(5).1)
        );
        assert!(serde_json::from_str::<ShareTable>(r#"{"rules":{},"extra":1}"#).is_err());
        // A ramp carried across rounds has run what it had, and since.
        let json = r#"{"rules":{"api":{"default":500000,"default_ramp":[100000,4000],"subjects":{}}}}"#;
        let t: ShareTable = serde_json::from_str(json).unwrap();
        let ramping = Share { share: 500_000, from: 100_000, ramped_ms: 4000 };
        assert_eq!(t.lookup("api", "x"), Some(ramping));
        assert_eq!(t.in_force("api", "x", 333_333, aged(2), s, settle), (ramping, Duration::from_secs(6)));
    }
}
