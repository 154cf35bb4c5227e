//! RL.WINDOW and RL.WINDOWPEEK: several windows checked and counted in one
//! step on the server's clock, SLIDING and FIXED on 16-byte counters, EXACT
//! on a log of admitted requests.

use redis_module::raw::RedisModuleString;
use rl_core::acquire::INLINE;
use rl_core::codec::PackedWindow;
use rl_core::combine::{decide, Check, Reply};
use rl_core::log::{self, Log};
use rl_core::window::{self, WindowMode};
use smallvec::SmallVec;

use super::{arg_bytes, load, replicate, reply_decision, Effect};
use crate::args::{self, WindowArgs, FIRST_KEY};
use crate::ffi::Ctx;
use crate::stats::Verdict;
use crate::{clock, config};

pub fn window(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    run(ctx, argv, true)
}

pub fn peek(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    run(ctx, argv, false)
}

fn run(ctx: Ctx, argv: &[*mut RedisModuleString], write: bool) -> Result<Verdict, String> {
    let a = args::parse_window(&arg_bytes(argv), config::max_log_limit()).map_err(|e| e.0)?;
    let now = clock::now_ms()?;
    let names = &argv[FIRST_KEY..FIRST_KEY + a.numkeys];
    let d = match a.mode {
        WindowMode::Exact => exact(ctx, names, &a, write, now)?,
        mode => counters(ctx, names, &a, mode, write, now)?,
    };
    reply_decision(ctx, &d, d.allowed() as i64);
    Ok(if d.allowed() { Verdict::Allowed } else { Verdict::Denied })
}

fn counters(
    ctx: Ctx,
    names: &[*mut RedisModuleString],
    a: &WindowArgs,
    mode: WindowMode,
    write: bool,
    now: u64,
) -> Result<Reply, String> {
    let mut loaded = load::<PackedWindow>(ctx, names, write)?;
    let views: SmallVec<[window::WindowCheck; INLINE]> = a
        .windows
        .iter()
        .enumerate()
        .map(|(i, p)| window::check(p, mode, loaded.get(i).map(PackedWindow::unpack).as_ref(), a.cost, now))
        .collect();
    let checks: SmallVec<[Check; INLINE]> = views.iter().map(|v| v.check).collect();
    let d = decide(&checks, a.cost);
    if write && d.allowed() {
        let mut effects: SmallVec<[Effect; INLINE]> = SmallVec::new();
        for (i, v) in views.iter().enumerate() {
            let packed = PackedWindow::pack(&v.after);
            loaded.store(i, packed, v.expires_at_ms)?;
            effects.push(Effect::Store {
                key: names[i],
                blob: SmallVec::from_slice(&packed.to_blob()),
                expires_at_ms: v.expires_at_ms,
            });
        }
        replicate(ctx, &effects);
    } else if write {
        loaded.keep_until(ctx, names, checks.iter().map(|c| now + c.reset_now_ms));
    }
    Ok(d)
}

fn exact(ctx: Ctx, names: &[*mut RedisModuleString], a: &WindowArgs, write: bool, now: u64) -> Result<Reply, String> {
    let mut loaded = load::<Log>(ctx, names, write)?;
    let views: SmallVec<[log::LogCheck; INLINE]> =
        a.windows.iter().enumerate().map(|(i, p)| log::check(p, loaded.get(i), a.cost, now)).collect();
    let checks: SmallVec<[Check; INLINE]> = views.iter().map(|v| v.check).collect();
    let d = decide(&checks, a.cost);
    if write && d.allowed() {
        let mut effects: SmallVec<[Effect; INLINE]> = SmallVec::new();
        for (i, v) in views.iter().enumerate() {
            loaded.get_or_create(i, Log::default)?.apply(&v.append);
            loaded.expire_at(i, v.expires_at_ms);
            effects.push(Effect::LogAppend { key: names[i], append: v.append, expires_at_ms: v.expires_at_ms });
        }
        replicate(ctx, &effects);
    } else if write {
        loaded.keep_until(ctx, names, checks.iter().map(|c| now + c.reset_now_ms));
    }
    Ok(d)
}
