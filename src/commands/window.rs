//! RL.WINDOW and RL.WINDOWPEEK: several windows checked and counted in one
//! step on the server's clock, SLIDING and FIXED on 16-byte counters, EXACT
//! on a log of admitted requests.

use redis_module::raw::RedisModuleString;
use rl_core::codec::PackedWindow;
use rl_core::log::{self, Log};
use rl_core::window::{self, WindowState};
use rl_core::{Reply, WindowMode, INLINE};
use smallvec::SmallVec;

use super::outcome::{carry_out, reply};
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
    let d = match a.mode {
        WindowMode::Exact => exact(ctx, keys, &a, write, now)?,
        mode => counters(ctx, keys, &a, mode, write, now)?,
    };
    Ok(reply(ctx, &d, d.allowed() as i64))
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
        log::decide(&a.windows, &logs, a.cost, now)
    };
    if write {
        carry_out(ctx, c"rl.window", keys.names(), &mut loaded, &outcome)?;
    }
    Ok(outcome.decision)
}
