//! Window counters: the two-counter sliding window and the fixed window.
//!
//! Windows are aligned to the Unix epoch: window k covers [k*W, (k+1)*W).
//! One state serves both modes: the start of the current window, the count
//! of the previous window and the count of the current one (FIXED keeps the
//! previous count at 0).
//!
//! SLIDING estimates the requests of the last W ms as
//! `previous * (1 - e/W) + current`, e being the time into the current
//! window. Multiplied by W everything is an integer, so the comparison with
//! the limit is exact arithmetic on the estimate.

use smallvec::SmallVec;

use crate::combine::{Check, Outcome, Update, INLINE, NEVER};
use crate::limits::{
    in_range, latest_reading_ms, ParamError, MAX_LOG_LIMIT, MAX_PERIOD_MS, MAX_TIME_MS, MAX_WAIT_MS, MAX_WINDOW_LIMIT,
};

/// How a window counts: the one definition the module's parser, the
/// client's calls and the rules all use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WindowMode {
    /// Two counters, the previous one weighted by how much of it still
    /// overlaps the window: an estimate, 16 bytes a key.
    #[default]
    Sliding,
    /// A log of admitted requests (`exact_log.rs`): exact, 8 bytes per entry.
    Exact,
    /// One counter per epoch-aligned window: quotas.
    Fixed,
}

impl WindowMode {
    pub const ALL: [WindowMode; 3] = [WindowMode::Sliding, WindowMode::Exact, WindowMode::Fixed];

    /// The mode's name in a command (`SLIDING`, `EXACT`, `FIXED`).
    pub fn name(self) -> &'static str {
        match self {
            WindowMode::Sliding => "SLIDING",
            WindowMode::Exact => "EXACT",
            WindowMode::Fixed => "FIXED",
        }
    }

    /// The mode named `name`, in any case.
    pub fn parse(name: &[u8]) -> Option<WindowMode> {
        Self::ALL.into_iter().find(|m| name.eq_ignore_ascii_case(m.name().as_bytes()))
    }

    /// The largest limit (and cost) of a window of this mode. An EXACT
    /// log's is the server's `max-log-limit` (itself at most MAX_LOG_LIMIT).
    pub fn max_limit(self, max_log_limit: u64) -> u64 {
        match self {
            WindowMode::Exact => max_log_limit.min(MAX_LOG_LIMIT),
            _ => MAX_WINDOW_LIMIT,
        }
    }
}

/// A validated window: at most `limit` requests per `window_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowParams {
    limit: u64,
    window_ms: u64,
}

impl WindowParams {
    /// `max_limit` is the mode's ceiling (MAX_WINDOW_LIMIT, or the log maximum).
    pub fn new(limit: u64, window_ms: u64, max_limit: u64) -> Result<Self, ParamError> {
        Ok(Self {
            limit: in_range("limit", limit, 1, max_limit.min(MAX_WINDOW_LIMIT))?,
            window_ms: in_range("window_ms", window_ms, 1, MAX_PERIOD_MS)?,
        })
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// Start of the epoch-aligned window holding `t`.
    fn start_of(&self, t: u64) -> u64 {
        t - t % self.window_ms
    }
}

/// What a window key stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WindowState {
    pub start_ms: u64,
    pub previous: u64,
    pub current: u64,
}

/// Why a stored window was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowStateError {
    Count,
    Time,
    /// A start more than a day ahead of the reading server's clock.
    Ahead,
}

impl WindowState {
    pub fn validate(&self) -> Result<(), WindowStateError> {
        if self.previous > MAX_WINDOW_LIMIT || self.current > MAX_WINDOW_LIMIT {
            return Err(WindowStateError::Count);
        }
        if self.start_ms > MAX_TIME_MS {
            return Err(WindowStateError::Time);
        }
        Ok(())
    }

    /// Whether a server whose clock reads `now_ms` could hold this window:
    /// its start is a clock reading (a window stamped years ahead would
    /// never roll, counting its requests until then).
    pub fn fits_clock(&self, now_ms: u64) -> Result<(), WindowStateError> {
        if self.start_ms > latest_reading_ms(now_ms) {
            return Err(WindowStateError::Ahead);
        }
        Ok(())
    }
}

/// A window's counters rolled forward to the window holding `now_ms`.
///
/// A reading earlier than the saved window keeps the saved counters (a
/// backward clock step never forgets requests). If window_ms changed, a saved
/// window that started less than one new window ago counts as the previous
/// one, once; one that started inside the current window (window_ms made
/// longer) is part of it, so the current window keeps its epoch-aligned
/// start and end, and counts the saved window's requests and its previous
/// one's (those may have come a little earlier: counting them errs toward
/// refusing, never over).
fn rolled(p: &WindowParams, mode: WindowMode, state: Option<&WindowState>, now_ms: u64) -> WindowState {
    let start = p.start_of(now_ms);
    let Some(s) = state else {
        return WindowState { start_ms: start, ..WindowState::default() };
    };
    if start < s.start_ms && s.start_ms < start + p.window_ms {
        let current = s.current.saturating_add(s.previous).min(MAX_WINDOW_LIMIT);
        return WindowState { start_ms: start, previous: 0, current };
    }
    if start <= s.start_ms {
        // FIXED counts the current window only (the key may have been
        // written by SLIDING).
        let previous = if mode == WindowMode::Fixed { 0 } else { s.previous };
        return WindowState { previous, ..*s };
    }
    let sliding = mode != WindowMode::Fixed;
    let previous = if sliding && s.start_ms + p.window_ms >= start { s.current } else { 0 };
    WindowState { start_ms: start, previous, current: 0 }
}

/// A window call's view: the check and the state to store if admitted.
pub struct WindowCheck {
    pub check: Check,
    pub after: WindowState,
    pub expires_at_ms: u64,
}

/// Several windows decided together at `now_ms`: all admit `cost`, or none
/// counts it.
pub fn decide(
    windows: &[WindowParams],
    mode: WindowMode,
    states: &[Option<WindowState>],
    cost: u64,
    now_ms: u64,
) -> Outcome<WindowState> {
    let views: SmallVec<[WindowCheck; INLINE]> =
        windows.iter().zip(states).map(|(p, s)| check(p, mode, s.as_ref(), cost, now_ms)).collect();
    let checks: SmallVec<[Check; INLINE]> = views.iter().map(|v| v.check).collect();
    Outcome::of(&checks, cost, now_ms, |i| Update::Store {
        state: views[i].after,
        expires_at_ms: views[i].expires_at_ms,
    })
}

/// Checks `cost` against one window at `now_ms`. FIXED counts the current
/// window only; SLIDING (and EXACT, which is counted by `exact_log.rs` and never
/// comes here) also weighs the previous one.
pub fn check(p: &WindowParams, mode: WindowMode, state: Option<&WindowState>, cost: u64, now_ms: u64) -> WindowCheck {
    let s = rolled(p, mode, state, now_ms);
    let w = p.window_ms as u128;
    // Time into the current window; 0 if the clock reads before it.
    let into = now_ms.saturating_sub(s.start_ms).min(p.window_ms - 1) as u128;
    let at = now_ms.max(s.start_ms);
    let end = s.start_ms + p.window_ms;
    let weighted = |current: u64| s.previous as u128 * (w - into) + current as u128 * w;
    let room = |current: u64| (p.limit as u128 * w).saturating_sub(weighted(current)) / w;
    let after = WindowState { current: s.current + cost, ..s };
    let admits = weighted(after.current) <= p.limit as u128 * w;
    let wait_until = if cost > p.limit {
        None
    } else {
        Some(if mode == WindowMode::Fixed { end } else { sliding_admits_at(p, &s, cost, at) })
    };
    // Fully reset once both counters have left the window.
    let sliding = mode != WindowMode::Fixed;
    let reset_at = |st: &WindowState| {
        if st.current > 0 {
            end + if sliding { p.window_ms } else { 0 }
        } else if sliding && st.previous > 0 {
            end
        } else {
            now_ms
        }
    };
    let wait = |until: u64| (until.saturating_sub(now_ms)).min(MAX_WAIT_MS);
    let stored = WindowState { previous: if mode == WindowMode::Fixed { 0 } else { after.previous }, ..after };
    WindowCheck {
        check: Check {
            admits,
            limit: p.limit,
            remaining_now: room(s.current) as u64,
            remaining_after: room(after.current) as u64,
            wait_ms: match wait_until {
                None => NEVER,
                Some(_) if admits => 0,
                Some(t) => wait(t) as i64,
            },
            reset_now_ms: wait(reset_at(&s)),
            reset_after_ms: wait(reset_at(&after)),
        },
        after: stored,
        expires_at_ms: reset_at(&after),
    }
}

/// A window's state once `n` requests counted by a call decided at
/// `at_ms` (the server's reading it answered with) are given back, where
/// they still count; None: nothing of them counts any more.
///
/// They are in the window holding `at_ms`: its current count while it is
/// the stored window, the previous count (SLIDING) once the next window
/// began, nothing after that or for FIXED. A stored window that does not
/// line up (the clock stepped back, the window changed length) gives
/// nothing back: under, never over.
pub fn refund(p: &WindowParams, mode: WindowMode, state: &WindowState, n: u64, at_ms: u64) -> Option<WindowState> {
    let start = p.start_of(at_ms);
    let mut after = *state;
    if state.start_ms == start && state.current > 0 {
        after.current -= n.min(state.current);
    } else if mode != WindowMode::Fixed && state.start_ms == start + p.window_ms && state.previous > 0 {
        after.previous -= n.min(state.previous);
    } else {
        return None;
    }
    Some(after)
}

/// The earliest time from `at` on when a SLIDING window would admit `cost`
/// (cost <= limit), with no other arrivals: the previous window's weight
/// decays by `previous` units a ms; at the next window the current count
/// becomes the previous one; two windows on, everything has left.
fn sliding_admits_at(p: &WindowParams, s: &WindowState, cost: u64, at: u64) -> u64 {
    let w = p.window_ms as u128;
    let limit = p.limit as u128 * w;
    let into = (at - s.start_ms) as u128;
    let end = s.start_ms + p.window_ms;
    // In this window: previous * (w - t) + (current + cost) * w <= limit.
    let fixed = (s.current + cost) as u128 * w;
    if fixed <= limit {
        let excess = (s.previous as u128 * (w - into) + fixed).saturating_sub(limit);
        if excess == 0 {
            return at;
        }
        let ms = excess.div_ceil(s.previous as u128); // previous > 0 here
        if into + ms < w {
            return at + ms as u64;
        }
    }
    // Next window: current * (w - t) + cost * w <= limit.
    let excess = (s.current as u128 * w + cost as u128 * w).saturating_sub(limit);
    if excess == 0 {
        return end;
    }
    let ms = excess.div_ceil(s.current as u128); // current > 0 here
    if ms < w {
        end + ms as u64
    } else {
        end + p.window_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WindowMode::*;

    fn w(limit: u64, ms: u64) -> WindowParams {
        WindowParams::new(limit, ms, MAX_WINDOW_LIMIT).unwrap()
    }

    /// Runs calls of cost 1 at the given times; returns the decisions.
    fn run(p: &WindowParams, mode: WindowMode, times: &[u64]) -> (Vec<bool>, Option<WindowState>) {
        let mut s = None;
        let out = times
            .iter()
            .map(|&t| {
                let c = check(p, mode, s.as_ref(), 1, t);
                if c.check.admits {
                    s = Some(c.after);
                }
                c.check.admits
            })
            .collect();
        (out, s)
    }

    #[test]
    fn params() {
        let field = |r: Result<WindowParams, ParamError>| r.unwrap_err().field;
        assert_eq!(field(WindowParams::new(0, 1, 10)), "limit");
        assert_eq!(WindowParams::new(11, 1, 10).unwrap_err().max, 10);
        assert_eq!(field(WindowParams::new(1, 0, 10)), "window_ms");
        assert_eq!(field(WindowParams::new(1, MAX_PERIOD_MS + 1, 10)), "window_ms");
    }

    #[test]
    fn fixed_window_resets_at_the_epoch_aligned_boundary() {
        let p = w(2, 1000);
        let (d, _) = run(&p, Fixed, &[5_100, 5_200, 5_300, 5_999, 6_000, 6_001, 6_002]);
        assert_eq!(d, [true, true, false, false, true, true, false]);
        let s = WindowState { start_ms: 5_000, previous: 0, current: 2 };
        let c = check(&p, Fixed, Some(&s), 1, 5_300);
        assert_eq!((c.check.wait_ms, c.check.reset_now_ms, c.check.remaining_now), (700, 700, 0));
        let c = check(&p, Fixed, Some(&s), 3, 5_300);
        assert_eq!(c.check.wait_ms, NEVER);
        let c = check(&p, Fixed, None, 1, 5_300);
        assert_eq!((c.check.remaining_after, c.check.reset_after_ms, c.expires_at_ms), (1, 700, 6_000));
    }

    #[test]
    fn sliding_weighs_the_previous_window() {
        let p = w(10, 1000);
        // 10 in the previous window; at 25% into the next, 7.5 still count.
        let s = WindowState { start_ms: 0, previous: 0, current: 10 };
        let c = check(&p, Sliding, Some(&s), 1, 1_250);
        assert!(c.check.admits);
        assert_eq!(c.after, WindowState { start_ms: 1_000, previous: 10, current: 1 });
        assert_eq!(c.check.remaining_now, 2); // floor(10 - 7.5)
        assert_eq!(c.check.remaining_after, 1); // floor(10 - 8.5)
                                                // Two windows on, nothing is left.
        assert_eq!(check(&p, Sliding, Some(&s), 10, 2_000).check.remaining_now, 10);
    }

    #[test]
    fn sliding_retry_is_exact() {
        let p = w(10, 1000);
        // previous 10, current 3 at 500 ms in: estimate 5 + 3 = 8; cost 4
        // needs the estimate at 6: previous must weigh 3, at 700 ms in.
        let s = WindowState { start_ms: 1_000, previous: 10, current: 3 };
        let c = check(&p, Sliding, Some(&s), 4, 1_500);
        assert!(!c.check.admits);
        assert_eq!(c.check.wait_ms, 200);
        assert!(!check(&p, Sliding, Some(&s), 4, 1_699).check.admits);
        assert!(check(&p, Sliding, Some(&s), 4, 1_700).check.admits);
        // Full current window: wait into the next one, where current decays.
        let s = WindowState { start_ms: 1_000, previous: 0, current: 10 };
        let c = check(&p, Sliding, Some(&s), 5, 1_500);
        assert_eq!(c.check.wait_ms, 500 + 500); // at 2_500 the old 10 weigh 5
        assert!(check(&p, Sliding, Some(&s), 5, 2_500).check.admits);
        assert!(!check(&p, Sliding, Some(&s), 5, 2_499).check.admits);
        // Cost equal to the limit: only once everything has left.
        let c = check(&p, Sliding, Some(&s), 10, 1_500);
        assert_eq!(c.check.wait_ms, 1_500);
        assert_eq!(check(&p, Sliding, Some(&s), 11, 1_500).check.wait_ms, NEVER);
    }

    #[test]
    fn sliding_reset_and_expiry() {
        let p = w(10, 1000);
        let c = check(&p, Sliding, None, 1, 1_300);
        assert_eq!((c.check.reset_after_ms, c.expires_at_ms), (1_700, 3_000));
        let s = WindowState { start_ms: 1_000, previous: 4, current: 0 };
        assert_eq!(check(&p, Sliding, Some(&s), 1, 1_300).check.reset_now_ms, 700);
    }

    #[test]
    fn fixed_ignores_a_previous_count_left_by_sliding() {
        let p = w(2, 1000);
        let s = WindowState { start_ms: 5_000, previous: 9, current: 1 };
        let c = check(&p, Fixed, Some(&s), 1, 5_500);
        assert!(c.check.admits);
        assert_eq!(c.after, WindowState { start_ms: 5_000, previous: 0, current: 2 });
    }

    #[test]
    fn a_window_made_longer_keeps_its_counts_in_the_aligned_window() {
        // Written as a 1 s window at 5_000; now a 10 s window: the count is
        // in the window [0, 10_000), which ends at 10_000, not 15_000.
        // Its previous second's 3 requests are inside the new window too.
        let s = WindowState { start_ms: 5_000, previous: 3, current: 2 };
        for mode in [Sliding, Fixed] {
            let c = check(&w(10, 10_000), mode, Some(&s), 1, 5_500);
            assert_eq!(c.after, WindowState { start_ms: 0, previous: 0, current: 6 }, "{mode:?}");
        }
        let c = check(&w(2, 10_000), Fixed, Some(&s), 1, 5_500);
        assert!(!c.check.admits);
        assert_eq!(c.check.wait_ms, 4_500);
    }

    #[test]
    fn backward_clock_keeps_the_saved_window() {
        let p = w(2, 1000);
        let s = WindowState { start_ms: 5_000, previous: 0, current: 2 };
        for mode in [Sliding, Fixed] {
            let c = check(&p, mode, Some(&s), 1, 4_500);
            assert!(!c.check.admits, "{mode:?}");
            assert_eq!(c.check.wait_ms, if mode == Fixed { 1_500 } else { 2_000 });
        }
    }

    #[test]
    fn a_refund_gives_back_to_the_window_that_counted_it() {
        let p = w(10, 1000);
        let s = WindowState { start_ms: 5_000, previous: 4, current: 3 };
        // Counted at 5_300 in [5_000, 6_000): the current count.
        assert_eq!(refund(&p, Fixed, &s, 2, 5_300), Some(WindowState { current: 1, ..s }));
        assert_eq!(refund(&p, Sliding, &s, 5, 5_999), Some(WindowState { current: 0, ..s }), "never below 0");
        // Counted in [4_000, 5_000): SLIDING still weighs it as the
        // previous count, FIXED no longer counts it.
        assert_eq!(refund(&p, Sliding, &s, 1, 4_500), Some(WindowState { previous: 3, ..s }));
        assert_eq!(refund(&p, Fixed, &s, 1, 4_500), None);
        // Two windows ago, or a window the stored one is not (the clock
        // stepped back): nothing is given back.
        assert_eq!(refund(&p, Sliding, &s, 1, 3_500), None);
        assert_eq!(refund(&p, Sliding, &s, 1, 6_100), None);
        let empty = WindowState { start_ms: 5_000, previous: 0, current: 0 };
        assert_eq!(refund(&p, Sliding, &empty, 1, 5_100), None);
    }

    #[test]
    fn a_refunded_call_leaves_the_window_as_if_never_counted() {
        let p = w(3, 1000);
        for mode in [Sliding, Fixed] {
            let (_, s) = run(&p, mode, &[5_100, 5_200]);
            let taken = check(&p, mode, s.as_ref(), 1, 5_300);
            assert!(taken.check.admits);
            let back = refund(&p, mode, &taken.after, 1, 5_300).unwrap();
            assert_eq!(Some(back), s, "{mode:?}");
        }
    }

    #[test]
    fn sliding_never_admits_more_than_twice_the_limit_in_any_window() {
        // The worst case of the estimator is 2L in a window straddling a
        // boundary; check that bound holds on a dense trace.
        let p = w(50, 1000);
        let times: Vec<u64> = (0..20_000).map(|i| i * 3 / 2).collect();
        let (d, _) = run(&p, Sliding, &times);
        let admitted: Vec<u64> = times.iter().zip(&d).filter(|(_, &ok)| ok).map(|(&t, _)| t).collect();
        for (i, &t) in admitted.iter().enumerate() {
            let in_window = admitted[i..].iter().take_while(|&&u| u < t + 1000).count();
            assert!(in_window <= 100, "{in_window} in [{t}, {})", t + 1000);
        }
    }
}
