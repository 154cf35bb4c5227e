//! One balancer round, pure: from each region's usage and current table to
//! the two writes of each region (lower, then raise).

use std::collections::{BTreeMap, BTreeSet};

use crate::split::SplitParams;
use crate::table::{RuleShares, Share, ShareTable};
use crate::transition::Plan;

/// A global rule as the balancer sees it.
#[derive(Clone, Debug)]
pub struct GlobalRule {
    /// The rule id.
    pub id: String,
    /// Its split: floor and fixed weights over the balancer's regions.
    pub split: SplitParams,
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
/// `current[r]`: the table region r holds; `live[r]`: reachable; `budget`:
/// the whole less what unreachable regions may hold. The `busiest`
/// subjects of each rule by worldwide usage get shares of their own; every
/// other subject the default split. Deterministic: ties go by subject.
pub fn plan_round(
    rules: &[GlobalRule],
    usage: &[Vec<(String, String, u64)>],
    current: &[ShareTable],
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
            table.rules.insert(rule.id.clone(), RuleShares { default: default[r], subjects: BTreeMap::new() });
        }
        for (subject, counts) in ranked.into_iter().take(busiest) {
            let shares = rule.split.follow_traffic(counts, live, budget);
            for (r, table) in target.iter_mut().enumerate() {
                let s = Share { share: shares[r], from: shares[r] };
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
            Some(s) => t.lookup(&rule.id, s).map(|x| x.share),
            None => t.rules.get(&rule.id).map(|r| r.default),
        };
        for subject in subjects.iter().map(|s| Some(s.as_str())).chain([None]) {
            // A region that never had the rule holds nothing of it yet.
            let now: Vec<u32> = current.iter().map(|t| share_of(t, subject).unwrap_or(0)).collect();
            let next: Vec<u32> = raise.iter().map(|t| share_of(t, subject).unwrap_or(0)).collect();
            let plan = Plan::new(&now, &next);
            for r in 0..n {
                let (low, high) = (plan.lower[r], plan.raise[r]);
                let set = |t: &mut ShareTable, share: Share| {
                    let rs = t.rules.get_mut(&rule.id).expect("every target has every rule");
                    match subject {
                        Some(s) => {
                            rs.subjects.insert(s.to_string(), share);
                        }
                        None => rs.default = share.share,
                    }
                };
                set(&mut lower[r], Share { share: low, from: low });
                set(&mut raise[r], Share { share: high, from: low });
            }
        }
    }
    // A subject back at the default with nothing to ramp needs no entry.
    for table in &mut raise {
        for rs in table.rules.values_mut() {
            let default = rs.default;
            rs.subjects.retain(|_, s| !(s.share == default && s.from == s.share));
        }
    }
    RoundTables { lower, raise }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WHOLE;

    fn rule() -> GlobalRule {
        GlobalRule { id: "api".into(), split: SplitParams::new(50_000, vec![1, 1, 1]).unwrap() }
    }

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
        let t = plan_round(&[rule()], &u, &vec![ShareTable::default(); 3], &live, WHOLE, 1);
        assert!(t.raise[0].rules["api"].subjects.contains_key("b"));
        assert_eq!(t.raise[0].rules["api"].subjects.len(), 1);
        assert_eq!(t.raise.iter().map(|t| t.rules["api"].default).collect::<Vec<_>>(), vec![333_333; 3]);
        // b goes quiet: its entry ramps back to the default once, then goes.
        let quiet = vec![vec![], vec![], vec![]];
        let next = plan_round(&[rule()], &quiet, &t.raise, &live, WHOLE, 1);
        let last = plan_round(&[rule()], &quiet, &next.raise, &live, WHOLE, 1);
        assert!(last.raise.iter().all(|t| t.rules["api"].subjects.is_empty()), "{last:?}");
    }

    #[test]
    fn every_stage_sums_to_at_most_the_whole() {
        let live = [true, true, false];
        let u = vec![usage(&[("a", 9), ("b", 1)]), usage(&[("a", 1), ("b", 9)]), vec![]];
        let current = plan_round(&[rule()], &u, &vec![ShareTable::default(); 3], &[true; 3], WHOLE, 5).raise;
        let t = plan_round(&[rule()], &u, &current, &live, 600_000, 5);
        for subject in ["a", "b", "unknown"] {
            for stage in [&current, &t.lower, &t.raise] {
                let sum: u32 = shares_of(stage, subject).iter().map(|s| s.0).sum();
                assert!(sum <= WHOLE, "{subject}: {sum}");
            }
            let sum: u32 = shares_of(&t.raise, subject).iter().map(|s| s.0).sum();
            assert!(sum <= 600_000, "{subject}: the budget holds: {sum}");
        }
    }
}
