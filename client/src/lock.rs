//! The locks of the client and of the limiter built on it (a primary's
//! connection, a breaker's state, a lease, a fallback entry, an in-flight
//! slot): taken through [`lock`], which counts the waits, striped by thread.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// Stripes of per-thread counters (these lock waits, and the limiter's
/// event totals); threads beyond it share.
pub const STRIPES: usize = 8;

/// This thread's stripe: threads take stripes in turn as they first count.
pub fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    MINE.with(|i| *i)
}

/// Times, process-wide, a thread found one of the client's locks held (a
/// lease, a fallback entry, a breaker's state, an in-flight slot) and
/// waited for it, since the process started: contention that CPU time
/// alone does not show. quick_cache's own shard locks are not counted.
pub fn lock_waits() -> u64 {
    LOCK_WAITS.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
}

/// Striped like the limiter's counters: a wait is counted on the waiting
/// thread's stripe, so the threads that contend do not also share this line.
static LOCK_WAITS: [Padded; STRIPES] = [const { Padded(AtomicU64::new(0)) }; STRIPES];

#[repr(align(128))]
struct Padded(AtomicU64);

fn lock_waited() {
    LOCK_WAITS[stripe()].0.fetch_add(1, Ordering::Relaxed);
}

/// Locks a mutex; a poisoned one (a panic elsewhere while held) still
/// holds consistent plain data here, so it is used as is. Tried first
/// without blocking: a lock found held is counted ([`lock_waits`]).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => {
            lock_waited();
            m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_found_held_is_counted_as_a_wait() {
        let m = Mutex::new(0);
        let before = lock_waits();
        let held = lock(&m);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| *lock(&m) += 1);
            // The waiter counts before it blocks; bounded in time.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while lock_waits() == before {
                assert!(std::time::Instant::now() < deadline, "a wait on a held lock was not counted");
                std::thread::yield_now();
            }
            drop(held);
            waiter.join().unwrap();
        });
        assert_eq!(*lock(&m), 1);
    }
}
