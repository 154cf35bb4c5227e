//! What a gateway admitted, counted in memory and written in batches: the
//! usage the quota balancer follows, and the same batching for a daily
//! quota fed from gateway counts ("add gateway counts to it in batches
//! every few seconds"). Never a Redis call per request.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::RedisResult;

/// Admitted counts per (rule, subject) since the last take. Adding is a
/// lookup in two maps under a lock held for nanoseconds; no allocation for
/// a pair already counted.
#[derive(Debug, Default)]
pub struct UsageCounts {
    counts: Mutex<HashMap<String, HashMap<String, u64>>>,
}

impl UsageCounts {
    /// Counts `n` admitted for `subject` under `rule`.
    pub fn add(&self, rule: &str, subject: &str, n: u64) {
        let mut counts = self.lock();
        let by_subject = match counts.get_mut(rule) {
            Some(m) => m,
            None => counts.entry(rule.to_owned()).or_default(),
        };
        match by_subject.get_mut(subject) {
            Some(c) => *c = c.saturating_add(n),
            None => {
                by_subject.insert(subject.to_owned(), n);
            }
        }
    }

    /// Takes every count: the `busiest` subjects of each rule, most first
    /// (ties by subject, so the same counts give the same batch), as
    /// (rule, subject, admitted); the quieter ones are dropped (the
    /// balancer gives them the default split anyway). `usize::MAX` takes
    /// them all (a quota's batch, where every count matters).
    pub fn take_busiest(&self, busiest: usize) -> Vec<(String, String, u64)> {
        let taken = std::mem::take(&mut *self.lock());
        let mut out = Vec::new();
        let mut rules: Vec<_> = taken.into_iter().collect();
        rules.sort_by(|a, b| a.0.cmp(&b.0));
        for (rule, subjects) in rules {
            let mut ranked: Vec<(String, u64)> = subjects.into_iter().collect();
            ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            out.extend(ranked.into_iter().take(busiest).map(|(s, n)| (rule.clone(), s, n)));
        }
        out
    }

    /// Counts taken but not written (the write failed): added back, so a
    /// quota loses nothing to an outage.
    pub fn put_back(&self, rows: &[(String, String, u64)]) {
        for (rule, subject, n) in rows {
            self.add(rule, subject, *n);
        }
    }

    /// Pairs counted since the last take.
    pub fn len(&self) -> usize {
        self.lock().values().map(HashMap::len).sum()
    }

    /// Whether nothing was counted since the last take.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Plain counts stay consistent even if a holder panicked.
    fn lock(&self) -> MutexGuard<'_, HashMap<String, HashMap<String, u64>>> {
        self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One subject's daily (or any FIXED-window) quota after a batch was added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaState {
    /// Whether the batch was counted. RL.WINDOW is all or nothing: a batch
    /// that would pass the limit is not counted, and the quota is spent.
    pub counted: bool,
    /// What is left in the window.
    pub remaining: u64,
    /// When the window ends (UTC midnight for a day).
    pub reset_after: Duration,
}

impl QuotaState {
    /// Whether the gateway should refuse the subject until `reset_after`.
    pub fn spent(&self) -> bool {
        !self.counted || self.remaining == 0
    }
}

/// Adds each `(key, admitted)` batch to its FIXED-window quota of `limit`
/// per `window_ms` (RL.WINDOW ... COST n FIXED: the module's epoch-aligned
/// window, a day resets at UTC midnight), all in one round trip. Answers
/// each key's state, in order. A daily quota fed from gateway counts:
///
/// ```no_run
/// use rl_gateway::global::{feed_fixed_windows, UsageCounts};
///
/// # async fn run(mut con: redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
/// let counts = UsageCounts::default();
/// counts.add("daily", "acme", 1); // per admitted request, in memory
/// // Every few seconds, every count (each one matters):
/// let rows = counts.take_busiest(usize::MAX);
/// let batch: Vec<(String, u64)> = rows.iter().map(|(_, s, n)| (format!("rl:daily:{{{s}}}:day"), *n)).collect();
/// let states = feed_fixed_windows(&mut con, 10_000, 86_400_000, &batch).await?;
/// for ((_, subject, _), state) in rows.iter().zip(&states) {
///     if state.spent() {
///         // refuse `subject` locally until state.reset_after (UTC midnight)
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn feed_fixed_windows(
    con: &mut impl ConnectionLike,
    limit: u64,
    window_ms: u64,
    batches: &[(String, u64)],
) -> RedisResult<Vec<QuotaState>> {
    if batches.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for (key, n) in batches {
        pipe.cmd("RL.WINDOW").arg(1).arg(key).arg(limit).arg(window_ms).arg("COST").arg((*n).max(1)).arg("FIXED");
    }
    let replies: Vec<Vec<i64>> = pipe.query_async(con).await?;
    replies
        .into_iter()
        .map(|r| match r.as_slice() {
            &[allowed, remaining, _, reset_ms, ..] => Ok(QuotaState {
                counted: allowed == 1,
                remaining: remaining.max(0) as u64,
                reset_after: Duration::from_millis(reset_ms.max(0) as u64),
            }),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "RL.WINDOW did not answer six integers",
                format!("{r:?}"),
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_of_each_rule_are_taken_and_the_rest_dropped() {
        let u = UsageCounts::default();
        for (rule, subject, n) in
            [("api", "a", 5), ("api", "b", 50), ("api", "c", 1), ("login", "z", 2), ("api", "a", 5)]
        {
            u.add(rule, subject, n);
        }
        assert_eq!(u.len(), 4);
        let rows = u.take_busiest(2);
        let expected = [("api", "b", 50), ("api", "a", 10), ("login", "z", 2)];
        assert_eq!(rows, expected.map(|(r, s, n)| (r.to_string(), s.to_string(), n)));
        assert!(u.is_empty(), "taken: counting starts again");
        u.put_back(&rows);
        assert_eq!(u.take_busiest(usize::MAX).len(), 3);
    }

    #[test]
    fn ties_go_by_subject() {
        let u = UsageCounts::default();
        for s in ["d", "b", "c", "a"] {
            u.add("api", s, 7);
        }
        let names: Vec<String> = u.take_busiest(3).into_iter().map(|r| r.1).collect();
        assert_eq!(names, ["a", "b", "c"]);
    }
}
