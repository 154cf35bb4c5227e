//! One balancer round, pure: from each region's usage and current table to
//! the two writes of each region (lower, then raise).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::transition::Plan;
use rl_gateway::global::SplitParams;
use rl_gateway::global::{RuleShares, Share, ShareTable};

/// A global rule as the balancer sees it.
#[derive(Clone, Debug)]
pub struct GlobalRule {
    /// The rule id.
    pub id: String,
    /// Its split: floor and fixed weights over the balancer's regions.
    pub split: SplitParams,
    /// The longest a raised share's capacity takes to ramp up: the largest
    /// capacity / refill x period of the rule's limits (see `ramp`). A
    /// ramp carries on across rounds until then.
    pub ramp: Duration,
}

/// The two tables to write to each region, in the regions' order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundTables {
    /// Phase one: every share at min(current, target).
    pub lower: Vec<ShareTable>,
    /// Phase two, once phase one is in effect everywhere: the targets,
    /// each raised share carrying the phase-one share it ramps from.
    pub raise: Vec<ShareTable>,
}

/// `usage[r]`: region r's (rule, subject, admitted) since the last round;
/// `current[r]`: the table region r holds, last changed `since_change[r]`
/// ago (a ramp in it has run that much longer); `live[r]`: reachable; `budget`:
/// the whole less what unreachable regions may hold. The `busiest`
/// subjects of each rule by worldwide usage get shares of their own; every
/// other subject the default split. Deterministic: ties go by subject.
pub fn plan_round(
    rules: &[GlobalRule],
    usage: &[Vec<(String, String, u64)>],
    current: &[ShareTable],
    since_change: &[Duration],
    live: &[bool],
    budget: u32,
    busiest: usize,
) -> RoundTables {
    let n = live.len();
    let mut target = vec![ShareTable::default(); n];
    for rule in rules {
        let mut per_subject: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (r, rows) in usage.iter().enumerate() {
            for (_, subject, count) in rows.iter().filter(|row| row.0 == rule.id) {
                per_subject.entry(subject).or_insert_with(|| vec![0; n])[r] += count;
            }
        }
        let mut ranked: Vec<(&str, &Vec<u64>)> = per_subject.iter().map(|(s, u)| (*s, u)).collect();
        ranked.sort_by(|a, b| b.1.iter().sum::<u64>().cmp(&a.1.iter().sum::<u64>()).then(a.0.cmp(b.0)));
        let default = rule.split.follow_traffic(&vec![0; n], live, budget);
        for (r, table) in target.iter_mut().enumerate() {
            table.rules.insert(rule.id.clone(), RuleShares { default: default[r], ..Default::default() });
        }
        for (subject, counts) in ranked.into_iter().take(busiest) {
            let shares = rule.split.follow_traffic(counts, live, budget);
            for (r, table) in target.iter_mut().enumerate() {
                let s = Share::steady(shares[r]);
                table.rules.get_mut(&rule.id).expect("inserted above").subjects.insert(subject.to_string(), s);
            }
        }
    }
    // Per (rule, subject), across regions: lower first, then raise.
    let mut lower = target.clone();
    let mut raise = target;
    for rule in rules {
        let mut subjects: BTreeSet<String> = BTreeSet::new();
        for t in current.iter().chain(raise.iter()) {
            subjects.extend(t.rules.get(&rule.id).into_iter().flat_map(|r| r.subjects.keys().cloned()));
        }
        let share_of = |t: &ShareTable, subject: Option<&str>| match subject {
            Some(s) => t.lookup(&rule.id, s),
            None => t.rules.get(&rule.id).map(|r| r.default_share()),
        };
        for subject in subjects.iter().map(|s| Some(s.as_str())).chain([None]) {
            // A region that never had the rule holds nothing of it yet.
            let now: Vec<Share> = current.iter().map(|t| share_of(t, subject).unwrap_or(Share::steady(0))).collect();
            let next: Vec<u32> = raise.iter().map(|t| share_of(t, subject).map_or(0, |s| s.share)).collect();
            let plan = Plan::new(&now.iter().map(|s| s.share).collect::<Vec<_>>(), &next);
            for r in 0..n {
                let (low, high) = (plan.lower[r], plan.raise[r]);
                let set = |t: &mut ShareTable, share: Share| {
                    let rs = t.rules.get_mut(&rule.id).expect("every target has every rule");
                    match subject {
                        Some(s) => {
                            rs.subjects.insert(s.to_string(), share);
                        }
                        None => rs.set_default(share),
                    }
                };
                let kept = carried(now[r], low, since_change.get(r).copied().unwrap_or_default(), rule.ramp);
                set(&mut lower[r], kept);
                // A raise ramps from the lowered share, or from where a ramp
                // still running started (its capacity may fall back to
                // there: under the limit, never over).
                let raised = if high > low { Share { share: high, from: kept.from, ramped_ms: 0 } } else { kept };
                set(&mut raise[r], raised);
            }
        }
    }
    // A subject back at the default with nothing to ramp needs no entry.
    for table in &mut raise {
        for rs in table.rules.values_mut() {
            let default = rs.default;
            rs.subjects.retain(|_, s| s.share != default || s.ramping());
        }
    }
    RoundTables { lower, raise }
}

/// `now` (a share held `since_change` after the table last changed) kept
/// at `low` (at most its share): a ramp still running carries on with what
/// it has run (a lower share ramps no faster), one that has run `ramp`
/// is over.
fn carried(now: Share, low: u32, since_change: Duration, ramp: Duration) -> Share {
    let ran = now.ramped_ms.saturating_add(since_change.as_millis().try_into().unwrap_or(u64::MAX));
    if !now.ramping() || ran >= ramp.as_millis().try_into().unwrap_or(u64::MAX) || now.from >= low {
        return Share::steady(low);
    }
    Share { share: low, from: now.from, ramped_ms: ran }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rl_gateway::global::WHOLE;

    fn rule() -> GlobalRule {
        GlobalRule {
            id: "api".into(),
            split: SplitParams::new(50_000, vec![1, 1, 1]).unwrap(),
            ramp: Duration::from_secs(60),
        }
    }

    const SECOND: [Duration; 3] = [Duration::from_secs(1); 3];
    const MINUTE: [Duration; 3] = [Duration::from_secs(60); 3];

    fn usage(rows: &[(&str, u64)]) -> Vec<(String, String, u64)> {
        rows.iter().map(|(s, n)| ("api".to_string(), s.to_string(), *n)).collect()
    }

    fn shares_of(tables: &[ShareTable], subject: &str) -> Vec<(u32, u32)> {
        tables.iter().map(|t| t.lookup("api", subject).map(|s| (s.share, s.from)).unwrap()).collect()
    }

    #[test]
    fn a_move_is_lowered_first_and_raised_from_the_lowered_share() {
        let live = [true; 3];
        let first = plan_round(
            &[rule()],
            &[usage(&[("acme", 700)]), usage(&[("acme", 200)]), usage(&[("acme", 100)])],
            &vec![ShareTable::default(); 3],
            &SECOND,
            &live,
            WHOLE,
            10,
        );
        // From nothing: phase one holds 0 everywhere, phase two the split.
        assert_eq!(shares_of(&first.lower, "acme"), vec![(0, 0); 3]);
        assert_eq!(shares_of(&first.raise, "acme"), vec![(645_000, 0), (220_000, 0), (135_000, 0)]);
        // The traffic moves to region 2.
        let moved = plan_round(
            &[rule()],
            &[usage(&[("acme", 0)]), usage(&[("acme", 0)]), usage(&[("acme", 1000)])],
            &first.raise,
            &MINUTE,
            &live,
            WHOLE,
            10,
        );
        assert_eq!(shares_of(&moved.lower, "acme"), vec![(50_000, 50_000), (50_000, 50_000), (135_000, 135_000)]);
        assert_eq!(shares_of(&moved.raise, "acme"), vec![(50_000, 50_000), (50_000, 50_000), (900_000, 135_000)]);
    }

    #[test]
    fn only_the_busiest_get_their_own_share() {
        let live = [true; 3];
        let u = vec![usage(&[("a", 50), ("b", 500), ("c", 5)]), vec![], vec![]];
        let t = plan_round(&[rule()], &u, &vec![ShareTable::default(); 3], &SECOND, &live, WHOLE, 1);
        assert!(t.raise[0].rules["api"].subjects.contains_key("b"));
        assert_eq!(t.raise[0].rules["api"].subjects.len(), 1);
        assert_eq!(t.raise.iter().map(|t| t.rules["api"].default).collect::<Vec<_>>(), vec![333_333; 3]);
        // b goes quiet: its entry ramps back to the default once, then goes.
        let quiet = vec![vec![], vec![], vec![]];
        let next = plan_round(&[rule()], &quiet, &t.raise, &MINUTE, &live, WHOLE, 1);
        let last = plan_round(&[rule()], &quiet, &next.raise, &MINUTE, &live, WHOLE, 1);
        assert!(last.raise.iter().all(|t| t.rules["api"].subjects.is_empty()), "{last:?}");
    }

    #[test]
    fn every_stage_sums_to_at_most_the_whole() {
        let live = [true, true, false];
        let u = vec![usage(&[("a", 9), ("b", 1)]), usage(&[("a", 1), ("b", 9)]), vec![]];
        let current = plan_round(&[rule()], &u, &vec![ShareTable::default(); 3], &SECOND, &[true; 3], WHOLE, 5).raise;
        let t = plan_round(&[rule()], &u, &current, &SECOND, &live, 600_000, 5);
        for subject in ["a", "b", "unknown"] {
            for stage in [&current, &t.lower, &t.raise] {
                let sum: u32 = shares_of(stage, subject).iter().map(|s| s.0).sum();
                assert!(sum <= WHOLE, "{subject}: {sum}");
            }
            let sum: u32 = shares_of(&t.raise, subject).iter().map(|s| s.0).sum();
            assert!(sum <= 600_000, "{subject}: the budget holds: {sum}");
        }
    }

    #[test]
    fn a_ramp_longer_than_a_round_carries_on_until_it_has_run() {
        let live = [true; 3];
        let busy = [usage(&[("acme", 700)]), usage(&[("acme", 200)]), usage(&[("acme", 100)])];
        let first = plan_round(&[rule()], &busy, &vec![ShareTable::default(); 3], &SECOND, &live, WHOLE, 10);
        // 10 s later, the same traffic: region 0 is still 10 s into its
        // ramp from 0 (the rule's ramp takes 60 s), not at its full share.
        let ten = [Duration::from_secs(10); 3];
        let next = plan_round(&[rule()], &busy, &first.raise, &ten, &live, WHOLE, 10);
        let acme = next.raise[0].lookup("api", "acme").unwrap();
        assert_eq!(acme, Share { share: 645_000, from: 0, ramped_ms: 10_000 });
        assert_eq!(next.lower[0].lookup("api", "acme").unwrap(), acme, "phase one keeps the ramp too");
        // A later round adds what has run since; past 60 s it is over.
        let later = plan_round(&[rule()], &busy, &next.raise, &[Duration::from_secs(45); 3], &live, WHOLE, 10);
        assert_eq!(later.raise[0].lookup("api", "acme").unwrap().ramped_ms, 55_000);
        let done = plan_round(&[rule()], &busy, &later.raise, &[Duration::from_secs(5); 3], &live, WHOLE, 10);
        assert_eq!(done.raise[0].lookup("api", "acme").unwrap(), Share::steady(645_000));
        // Raised again mid-ramp: it ramps afresh from where the ramp began.
        let more = [usage(&[("acme", 900)]), usage(&[("acme", 50)]), usage(&[("acme", 50)])];
        let raised = plan_round(&[rule()], &more, &next.raise, &ten, &live, WHOLE, 10);
        assert_eq!(raised.raise[0].lookup("api", "acme").unwrap(), Share { share: 815_000, from: 0, ramped_ms: 0 });
    }

    #[test]
    fn a_raised_default_share_ramps_like_a_subjects() {
        // Region 2 unreachable: the budget it cannot hold goes to 0 and 1,
        // whose default share rises: it ramps from the old default.
        let steady = plan_round(
            &[rule()],
            &[vec![], vec![], vec![]],
            &vec![ShareTable::default(); 3],
            &SECOND,
            &[true; 3],
            WHOLE,
            1,
        );
        let grown =
            plan_round(&[rule()], &[vec![], vec![], vec![]], &steady.raise, &MINUTE, &[true, true, false], WHOLE, 1);
        let d = grown.raise[0].rules["api"].default_share();
        assert!(d.share > 333_333 && d.from == 333_333 && d.ramped_ms == 0, "{d:?}");
        assert_eq!(grown.raise[0].lookup("api", "anyone").unwrap(), d);
        let json = serde_json::to_string(&grown.raise[0]).unwrap();
        assert!(json.contains("default_ramp"), "{json}");
    }
}
