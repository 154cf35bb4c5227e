//! Failed authentications are slowed and bounded, so that a password
//! cannot be guessed at the speed of the loopback (20,000 wrong AUTHs on
//! one connection took 0.09 s, issue 34). On a connection the first
//! [`FREE`] failures are answered at once (a client with a stale password
//! and its retries), each further one after a delay doubling from 50 ms to
//! 1 s, and the [`CLOSE_AFTER`]th closes it. Across connections, failures
//! past a burst of 100 at 100 a second wait their turn, so opening more
//! connections guesses no faster. Only failures wait: a correct password
//! is answered at once, whatever others send.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::logging::Throttled;

/// Failures a connection is answered at once.
pub const FREE: u32 = 3;
/// The failure that closes its connection.
pub const CLOSE_AFTER: u32 = 10;
const FIRST_DELAY: Duration = Duration::from_millis(50);
const MOST_DELAY: Duration = Duration::from_secs(1);
/// Across connections: one failure every `EVERY`, after a burst of `BURST`.
const EVERY: Duration = Duration::from_millis(10);
const BURST: u32 = 100;
/// The longest a failure waits its turn across connections.
const MOST_TURN: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct AuthGuard {
    /// When the failures answered so far would all have had their turn
    /// (a GCRA's theoretical arrival time).
    turns: Mutex<Option<Instant>>,
    pub log: Throttled,
}

impl Default for AuthGuard {
    fn default() -> AuthGuard {
        AuthGuard { turns: Mutex::new(None), log: Throttled::new(Duration::from_secs(10)) }
    }
}

impl AuthGuard {
    /// How long the `nth` failure of a connection, at `now`, waits before
    /// it is answered: its connection's delay or its turn across
    /// connections, the longer.
    pub fn wait(&self, nth: u32, now: Instant) -> Duration {
        own_delay(nth).max(self.turn(now))
    }

    fn turn(&self, now: Instant) -> Duration {
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        let burst = EVERY * BURST;
        let start = turns.map_or(now, |t| t.max(now));
        // Never booked further ahead than the longest wait: a flood that
        // stopped does not keep later failures waiting for its turns.
        let next = (start + EVERY).min(now + burst + MOST_TURN);
        *turns = Some(next);
        next.saturating_duration_since(now).saturating_sub(burst)
    }
}

/// The delay of a connection's `nth` failure.
fn own_delay(nth: u32) -> Duration {
    match nth.checked_sub(FREE + 1) {
        None => Duration::ZERO,
        Some(doublings) => (FIRST_DELAY * 2u32.pow(doublings.min(10))).min(MOST_DELAY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connections_failures_wait_longer_and_longer() {
        let waits: Vec<u64> = (1..=CLOSE_AFTER + 2).map(|n| own_delay(n).as_millis() as u64).collect();
        assert_eq!(waits, [0, 0, 0, 50, 100, 200, 400, 800, 1000, 1000, 1000, 1000]);
        assert_eq!(own_delay(u32::MAX), MOST_DELAY);
    }

    #[test]
    fn failures_across_connections_take_turns_after_a_burst() {
        let guard = AuthGuard::default();
        let t0 = Instant::now();
        for _ in 0..BURST {
            assert_eq!(guard.wait(1, t0), Duration::ZERO);
        }
        assert_eq!(guard.wait(1, t0), EVERY);
        assert_eq!(guard.wait(1, t0), EVERY * 2);
        // Time given back: the burst refills.
        let later = t0 + EVERY * (BURST + 2);
        assert_eq!(guard.wait(1, later), Duration::ZERO);
        // A flood books no turn past the longest wait.
        for _ in 0..100_000 {
            assert!(guard.wait(1, later) <= MOST_TURN);
        }
        assert_eq!(guard.wait(1, later), MOST_TURN);
        assert_eq!(guard.wait(1, later + MOST_TURN * 3), Duration::ZERO);
        // The longer of the two.
        assert_eq!(guard.wait(FREE + 2, later + MOST_TURN * 3), Duration::from_millis(100));
    }
}
