//! Command registration and the boundary every command runs behind.

use std::ffi::{c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use smallvec::SmallVec;

use crate::args::{self, FIRST_KEY};
use crate::ffi::{self, api, Ctx};
use crate::stats::{CommandStats, Verdict};

mod set;
mod take;

/// A command's body: replies on success, or returns the error to reply.
type Body = fn(Ctx, &[*mut RedisModuleString]) -> Result<Verdict, String>;

/// Runs a command body with panics caught: a panic that reached the server
/// would abort it, so it becomes an error reply instead. Counts the call.
fn run(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int, stats: &CommandStats, body: Body) -> c_int {
    let ctx = Ctx(ctx);
    let args = ffi::args(argv, argc);
    if ctx.is_keys_position_request() {
        // Only numkeys commands have `getkeys-api`, all laid out as
        // `CMD numkeys key...`; a bad numkeys declares no keys.
        if let Ok(n) = args::numkeys(&arg_bytes(args)) {
            (FIRST_KEY..FIRST_KEY + n).for_each(|pos| ctx.key_at_pos(pos));
        }
        return ffi::OK;
    }
    let outcome = match catch_unwind(AssertUnwindSafe(|| body(ctx, args))) {
        Ok(outcome) => outcome,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!("ERR internal error in {}: {what}", stats.name))
        }
    };
    if let Err(msg) = &outcome {
        ctx.reply_error(msg);
    }
    stats.record(outcome.map_err(|_| ()));
    ffi::OK
}

/// Defines the extern "C" entry point of a command.
macro_rules! entry {
    ($fn_name:ident, $stats:path, $body:path) => {
        extern "C" fn $fn_name(
            ctx: *mut RedisModuleCtx,
            argv: *mut *mut RedisModuleString,
            argc: c_int,
        ) -> c_int {
            run(ctx, argv, argc, &$stats, $body)
        }
    };
}

entry!(rl_take, crate::stats::TAKE, take::take);
entry!(rl_peek, crate::stats::PEEK, take::peek);
entry!(rl_set, crate::stats::SET, set::set);

/// The arguments as byte slices (inline for calls of up to three keys).
pub(crate) fn arg_bytes<'a>(argv: &[*mut RedisModuleString]) -> SmallVec<[&'a [u8]; 16]> {
    argv.iter().map(|&a| ffi::bytes(a)).collect()
}

pub(crate) fn wrongtype() -> String {
    "WRONGTYPE Operation against a key holding the wrong kind of value".into()
}

/// The six-integer reply: `[first, remaining, retry_after_ms, reset_after_ms,
/// limit, binding]`, `first` being allowed (0/1) or the tokens granted.
pub(crate) fn reply_decision(ctx: Ctx, d: &rl_core::Decision, first: i64) {
    ctx.reply_array(6);
    ctx.reply_integer(first);
    ctx.reply_integer(d.remaining as i64);
    ctx.reply_integer(d.retry_after_ms);
    ctx.reply_integer(d.reset_after_ms as i64);
    ctx.reply_integer(d.limit as i64);
    ctx.reply_integer(d.binding as i64);
}

/// A write to one key, as replicas and the AOF must see it.
pub(crate) enum Effect {
    /// The key now holds `blob` and expires at `expires_at_ms`.
    Store { key: *mut RedisModuleString, blob: SmallVec<[u8; 32]>, expires_at_ms: u64 },
    /// The key is gone (a full bucket).
    Remove { key: *mut RedisModuleString },
}

/// Replicates writes as one `RL.SET key blob pxat [key blob pxat ...]`: the
/// absolute state and expiry, so replicas never re-run the decision on their
/// own clock. One command, so no MULTI/EXEC wrapper is needed.
pub(crate) fn replicate_set(ctx: Ctx, effects: &[Effect]) {
    let mut args: SmallVec<[*mut RedisModuleString; 12]> = SmallVec::new();
    let mut created: SmallVec<[*mut RedisModuleString; 8]> = SmallVec::new();
    let mut digits = [0u8; 20];
    for e in effects {
        let (key, blob, at): (_, &[u8], u64) = match e {
            Effect::Store { key, blob, expires_at_ms } => (*key, blob, *expires_at_ms),
            Effect::Remove { key } => (*key, b"", 0),
        };
        let blob = ctx.create_string(blob);
        let at = ctx.create_string(decimal(at, &mut digits));
        args.extend([key, blob, at]);
        created.extend([blob, at]);
    }
    ctx.replicate(c"RL.SET", &args);
    created.into_iter().for_each(|s| ctx.free_string(s));
}

/// `v` in decimal, written into `buf`.
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

struct Command {
    name: &'static CStr,
    handler: extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int,
    flags: &'static CStr,
    /// Legacy key positions; (0, 0, 0) with `getkeys-api` for numkeys commands.
    keys: (c_int, c_int, c_int),
}

/// `numkeys` commands declare their keys through `getkeys-api`: the only way
/// Redis Cluster checks their slots (a key spec alone is ignored for routing).
const COMMANDS: &[Command] = &[
    Command { name: c"rl.take", handler: rl_take, flags: c"write deny-oom fast getkeys-api", keys: (0, 0, 0) },
    Command { name: c"rl.peek", handler: rl_peek, flags: c"readonly fast getkeys-api", keys: (0, 0, 0) },
    // Internal: the effect of a write, replicated and in the AOF.
    Command { name: c"rl.set", handler: rl_set, flags: c"write deny-oom fast", keys: (1, -1, 3) },
];

pub fn register(ctx: *mut RedisModuleCtx) -> Result<(), String> {
    for c in COMMANDS {
        let status = unsafe {
            api!(RedisModule_CreateCommand)(
                ctx,
                c.name.as_ptr(),
                Some(c.handler),
                c.flags.as_ptr(),
                c.keys.0,
                c.keys.1,
                c.keys.2,
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!("could not register {}", c.name.to_string_lossy()));
        }
    }
    Ok(())
}
