//! The scenarios' checks: never over the allowance in any window, rates
//! over a stretch, time until back near the limit.

use crate::rules::{BURST, RATE};
use crate::traffic::{Recording, BUCKET};

/// One check: passed or failed, with what was measured.
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

impl Check {
    pub fn new(name: &str, passed: bool, detail: String) -> Check {
        Check { name: name.to_string(), passed, detail }
    }
}

/// The busy customer's admitted requests, all regions, over every window
/// of whole buckets up to 10 s, against its allowance: the burst plus the
/// rate over the window widened by the longest request (an admission at
/// the server happens somewhere between a request's send and its answer,
/// and the recording counts answers).
pub fn never_over(rec: &Recording) -> Check {
    let total = rec.busy_total();
    let slack = rec.max_latency.as_secs_f64();
    let (mut worst, mut at, mut worst_1s) = (0.0f64, (0.0, 0.0), 0u64);
    let bucket = BUCKET.as_secs_f64();
    for start in 0..total.len() {
        let mut sum = 0;
        for (len, n) in total[start..].iter().take(100).enumerate() {
            sum += n;
            let window = (len + 1) as f64 * bucket;
            let allowance = BURST as f64 + RATE as f64 * (window + slack);
            if sum as f64 / allowance > worst {
                worst = sum as f64 / allowance;
                at = (start as f64 * bucket, window);
            }
            if len + 1 == 10 {
                worst_1s = worst_1s.max(sum);
            }
        }
    }
    Check::new(
        "never over: admitted <= burst + rate x (window + longest request) over every window up to 10 s",
        worst <= 1.0,
        format!(
            "worst window: {:.1}% of its allowance ({:.1} s from {:.1} s); most in any 1 s window: {worst_1s} (allowance {:.0}); longest request {:.0} ms",
            worst * 100.0,
            at.1,
            at.0,
            BURST as f64 + RATE as f64 * (1.0 + slack),
            slack * 1000.0
        ),
    )
}

/// The busy customer's admitted per second, all regions, from `a` to `b` s.
pub fn rate_between(rec: &Recording, a: f64, b: f64) -> f64 {
    let bucket = BUCKET.as_secs_f64();
    let (i, j) = ((a / bucket).round() as usize, ((b / bucket).round() as usize).min(rec.busy_admitted.len()));
    if j <= i {
        return 0.0;
    }
    rec.busy_total()[i..j].iter().sum::<u64>() as f64 / ((j - i) as f64 * bucket)
}

/// Per region, the busy customer's admitted per second from `a` to `b` s.
pub fn region_rates(rec: &Recording, a: f64, b: f64) -> String {
    let bucket = BUCKET.as_secs_f64();
    let (i, j) = ((a / bucket).round() as usize, ((b / bucket).round() as usize).min(rec.busy_admitted.len()));
    let secs = (j.saturating_sub(i)).max(1) as f64 * bucket;
    let per = [0, 1, 2].map(|r| rec.busy_admitted[i.min(j)..j].iter().map(|x| x[r]).sum::<u64>() as f64 / secs);
    per.map(|v| format!("{v:.0}")).join(" / ")
}

/// Seconds from `from` until the end of the first whole `window` after
/// it with at least `rate` a second admitted.
pub fn time_to(rec: &Recording, from: f64, rate: f64, window: f64) -> Option<f64> {
    let bucket = BUCKET.as_secs_f64();
    let total = rec.busy_total();
    let n = (window / bucket).round() as usize;
    let first = (from / bucket).ceil() as usize;
    (first..total.len().saturating_sub(n))
        .find(|&s| total[s..s + n].iter().sum::<u64>() as f64 >= rate * window)
        .map(|s| (s + n) as f64 * bucket - from)
}

/// The shares sampled between `a` and `b` s.
pub fn shares_between(rec: &Recording, a: f64, b: f64) -> Vec<[Option<u32>; 3]> {
    rec.shares.iter().filter(|s| s.0 >= a && s.0 <= b).map(|s| s.1).collect()
}

pub fn at_least(name: &str, got: f64, want: f64) -> Check {
    Check::new(name, got >= want, format!("{got:.0} a second (at least {want:.0})"))
}
