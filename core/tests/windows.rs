//! Windows and logs against brute-force models that keep every admitted
//! request: EXACT and FIXED must decide exactly as the model does, SLIDING
//! must compute the two-counter estimate exactly, and every retry time must
//! be the first moment the model admits.

use proptest::prelude::*;
use rl_core::exact_log::{self, Log};
use rl_core::limits::{MAX_LOG_LIMIT, MAX_WINDOW_LIMIT};
use rl_core::window::{self, WindowMode, WindowParams, WindowState};

/// Admitted (time, cost) pairs: the ground truth every model reads.
type History = Vec<(u64, u64)>;

fn in_range(h: &History, from: u64, to: u64) -> u64 {
    h.iter().filter(|(t, _)| (from..to).contains(t)).map(|(_, c)| c).sum()
}

/// EXACT model: admitted iff the costs in (now - w, now] plus cost fit.
fn exact_admits(h: &History, limit: u64, w: u64, cost: u64, now: u64) -> bool {
    in_range(h, (now + 1).saturating_sub(w), now + 1) + cost <= limit
}

/// FIXED model: admitted iff the costs in now's aligned window plus cost fit.
fn fixed_admits(h: &History, limit: u64, w: u64, cost: u64, now: u64) -> bool {
    let start = now - now % w;
    in_range(h, start, start + w) + cost <= limit
}

/// SLIDING model, straight from the definition, in units of 1/w.
fn sliding_admits(h: &History, limit: u64, w: u64, cost: u64, now: u64) -> bool {
    let start = now - now % w;
    let previous = if start >= w { in_range(h, start - w, start) } else { 0 };
    let current = in_range(h, start, start + w);
    let into = now - start;
    previous as u128 * (w - into) as u128 + (current + cost) as u128 * w as u128 <= limit as u128 * w as u128
}

fn first_admitting(model: impl Fn(u64) -> bool, from: u64, horizon: u64) -> Option<u64> {
    (from..from + horizon).find(|&t| model(t))
}

fn calls() -> impl Strategy<Value = Vec<(u64, u64)>> {
    proptest::collection::vec((0u64..60, 1u64..4), 1..150)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn exact_log_decides_as_the_model(limit in 1u64..12, w in 1u64..200, calls in calls()) {
        let p = WindowParams::new(limit, w, MAX_LOG_LIMIT).unwrap();
        let mut log = Log::default();
        let mut h = History::new();
        let mut now = 10_000;
        for (step, cost) in calls {
            now += step;
            let c = exact_log::check(&p, Some(&log), cost, now);
            prop_assert_eq!(c.check.admits, exact_admits(&h, limit, w, cost, now), "at {}", now);
            if c.check.admits {
                log.apply(&c.append).unwrap();
                h.push((now, cost));
                prop_assert!(log.len() as u64 <= limit);
            } else if c.check.wait_ms >= 0 {
                let first = first_admitting(|t| exact_admits(&h, limit, w, cost, t), now, 2 * w + 2);
                prop_assert_eq!(Some(now + c.check.wait_ms as u64), first);
            } else {
                prop_assert!(cost > limit);
            }
        }
    }

    #[test]
    fn fixed_window_decides_as_the_model(limit in 1u64..12, w in 1u64..200, calls in calls()) {
        let p = WindowParams::new(limit, w, MAX_WINDOW_LIMIT).unwrap();
        let mut s: Option<WindowState> = None;
        let mut h = History::new();
        let mut now = 10_000;
        for (step, cost) in calls {
            now += step;
            let c = window::check(&p, WindowMode::Fixed, s.as_ref(), cost, now);
            prop_assert_eq!(c.check.admits, fixed_admits(&h, limit, w, cost, now), "at {}", now);
            if c.check.admits {
                s = Some(c.after);
                h.push((now, cost));
            } else if c.check.wait_ms >= 0 {
                let first = first_admitting(|t| fixed_admits(&h, limit, w, cost, t), now, 2 * w + 2);
                prop_assert_eq!(Some(now + c.check.wait_ms as u64), first);
            }
        }
    }

    #[test]
    fn sliding_window_decides_as_the_model(limit in 1u64..12, w in 1u64..200, calls in calls()) {
        let p = WindowParams::new(limit, w, MAX_WINDOW_LIMIT).unwrap();
        let mut s: Option<WindowState> = None;
        let mut h = History::new();
        let mut now = 10_000;
        for (step, cost) in calls {
            now += step;
            let c = window::check(&p, WindowMode::Sliding, s.as_ref(), cost, now);
            prop_assert_eq!(c.check.admits, sliding_admits(&h, limit, w, cost, now), "at {}", now);
            if c.check.admits {
                s = Some(c.after);
                h.push((now, cost));
                // The key outlives every request that still weighs.
                prop_assert!(c.expires_at_ms >= now - now % w + 2 * w);
            } else if c.check.wait_ms >= 0 {
                let first = first_admitting(|t| sliding_admits(&h, limit, w, cost, t), now, 3 * w + 2);
                prop_assert_eq!(Some(now + c.check.wait_ms as u64), first);
            }
        }
    }
}
