//! RL.WINDOW and RL.WINDOWPEEK: several windows checked and counted in one
//! step on the server's clock, SLIDING and FIXED on 16-byte counters, EXACT
//! on a log of admitted requests. `REFUND at_ms` gives back what a call that
//! answered with TIME counted (a request refused elsewhere).

use redis_module::raw::RedisModuleString;
use rl_core::codec::{log_blob, PackedWindow};
use rl_core::combine::{decide, Check, Update};
use rl_core::exact_log::{self, Log};
use rl_core::limits::latest_reading_ms;
use rl_core::window::{self, WindowState};
use rl_core::{Reply, WindowMode, INLINE};
use smallvec::SmallVec;

use super::outcome::{carry_out, publish, reply_with_time, write};
use super::replication::Effect;
use super::{arg_bytes, numkeys_keys};
use crate::args::{self, WindowArgs};
use crate::ffi::Ctx;
use crate::stats::Counted;
use crate::store::keys::{load, DistinctKeys};
use crate::{clock, config};

pub fn window(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    run(ctx, argv, true)
}

pub fn peek(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    run(ctx, argv, false)
}

fn run(ctx: Ctx, argv: &[*mut RedisModuleString], write: bool) -> Result<Counted, String> {
    let bytes = arg_bytes(argv);
    let keys = numkeys_keys(argv, &bytes)?;
    let a = args::parse_window(&bytes, config::max_log_limit()).map_err(|e| e.0)?;
    let now = clock::now_ms()?;
    let d = match (a.refund_at_ms, a.mode) {
        (Some(_), _) if !write => {
            return Err("ERR RL.WINDOWPEEK counts nothing, so it has nothing to REFUND: use RL.WINDOW".into())
        }
        (Some(at), _) if at > latest_reading_ms(now) => {
            return Err(format!(
                "ERR REFUND {at} is more than a day ahead of this server's clock: give the time RL.WINDOW ... TIME answered"
            ))
        }
        (Some(at), WindowMode::Exact) => refund_exact(ctx, keys, &a, at, now)?,
        (Some(at), mode) => refund_counters(ctx, keys, &a, mode, at, now)?,
        (None, WindowMode::Exact) => exact(ctx, keys, &a, write, now)?,
        (None, mode) => counters(ctx, keys, &a, mode, write, now)?,
    };
    let counted = reply_with_time(ctx, &d, d.allowed() as i64, a.time.then_some(now));
    // A refund decides nothing: a call, neither allowed nor denied.
    Ok(if a.refund_at_ms.is_some() { Counted::Done } else { counted })
}

fn counters(
    ctx: Ctx,
    keys: DistinctKeys,
    a: &WindowArgs,
    mode: WindowMode,
    write: bool,
    now: u64,
) -> Result<Reply, String> {
    let mut loaded = load::<PackedWindow>(ctx, keys, write)?;
    let states: SmallVec<[Option<WindowState>; INLINE]> =
        (0..a.numkeys).map(|i| loaded.get(i).map(PackedWindow::unpack)).collect();
    let outcome = window::decide(&a.windows, mode, &states, a.cost, now);
    if write {
        carry_out(ctx, c"rl.window", keys.names(), &mut loaded, &outcome)?;
    }
    Ok(outcome.decision)
}

fn exact(ctx: Ctx, keys: DistinctKeys, a: &WindowArgs, write: bool, now: u64) -> Result<Reply, String> {
    let mut loaded = load::<Log>(ctx, keys, write)?;
    let outcome = {
        let logs: SmallVec<[Option<&Log>; INLINE]> = (0..a.numkeys).map(|i| loaded.get(i)).collect();
        exact_log::decide(&a.windows, &logs, a.cost, now)
    };
    if write {
        carry_out(ctx, c"rl.window", keys.names(), &mut loaded, &outcome)?;
    }
    Ok(outcome.decision)
}

/// The reply of a refund: the windows as they stand once it is done.
fn standing(checks: impl Iterator<Item = Check>, cost: u64) -> Reply {
    let now: SmallVec<[Check; INLINE]> = checks
        .map(|c| Check { admits: true, remaining_after: c.remaining_now, reset_after_ms: c.reset_now_ms, ..c })
        .collect();
    decide(&now, cost)
}

/// REFUND on SLIDING and FIXED counters: each key gives back what it still
/// counts of the call (`window::refund`); a key left with no count is
/// removed, one with counts keeps its expiry (counts only went down).
fn refund_counters(
    ctx: Ctx,
    keys: DistinctKeys,
    a: &WindowArgs,
    mode: WindowMode,
    at: u64,
    now: u64,
) -> Result<Reply, String> {
    let mut loaded = load::<PackedWindow>(ctx, keys, true)?;
    let mut updates: SmallVec<[(usize, Update<WindowState>); INLINE]> = SmallVec::new();
    let mut states: SmallVec<[Option<WindowState>; INLINE]> = SmallVec::new();
    for (i, p) in a.windows.iter().enumerate() {
        let before = loaded.get(i).map(PackedWindow::unpack);
        let after = before.and_then(|s| window::refund(p, mode, &s, a.cost, at));
        if let Some(s) = after {
            let update = if s.current == 0 && s.previous == 0 {
                Update::Remove
            } else {
                let expires_at_ms =
                    loaded.expires_at(i).unwrap_or_else(|| window::check(p, mode, Some(&s), 1, now).expires_at_ms);
                Update::Store { state: s, expires_at_ms }
            };
            updates.push((i, update));
        }
        states.push(after.or(before));
    }
    write(ctx, c"rl.window", keys.names(), &mut loaded, updates.iter().map(|(i, u)| (*i, u)))?;
    let checks = a.windows.iter().zip(&states).map(|(p, s)| window::check(p, mode, s.as_ref(), 1, now).check);
    Ok(standing(checks, a.cost))
}

/// REFUND on EXACT logs: each log gives back the call's entries if they
/// still count (`Log::refund`); replicated as the whole log (`RL.SET`), or
/// the key's removal once its log is empty.
fn refund_exact(ctx: Ctx, keys: DistinctKeys, a: &WindowArgs, at: u64, now: u64) -> Result<Reply, String> {
    let names = keys.names();
    let mut loaded = load::<Log>(ctx, keys, true)?;
    let mut effects: SmallVec<[Effect; INLINE]> = SmallVec::new();
    for (i, p) in a.windows.iter().enumerate() {
        // Nothing to give back: the key is not written (nor signalled).
        if loaded.get(i).and_then(|log| log.refundable_from(at, p.window_ms(), now)).is_none() {
            continue;
        }
        let expires_at_ms = loaded.expires_at(i);
        let log = loaded.get_or_create(i, Log::default)?;
        log.refund(a.cost, at, p.window_ms(), now);
        if log.is_empty() {
            loaded.remove(i);
            effects.push(Effect::Remove { key: names[i] });
        } else {
            let blob = SmallVec::from_vec(log_blob(log));
            let expires_at_ms = expires_at_ms.unwrap_or_else(|| exact_log::check(p, Some(log), 1, now).expires_at_ms);
            effects.push(Effect::Store { key: names[i], blob, expires_at_ms });
        }
    }
    publish(ctx, c"rl.window", &effects);
    let checks = a.windows.iter().enumerate().map(|(i, p)| exact_log::check(p, loaded.get(i), 1, now).check);
    Ok(standing(checks, a.cost))
}
