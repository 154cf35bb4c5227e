//! CL.THROTTLE, compatible with redis-cell: same arguments, same reply, same
//! GCRA, same key (a string holding the TAT in nanoseconds), so keys written
//! by redis-cell keep working. Unlike redis-cell it reads the server's clock
//! and replicates the effect (`SET key tat PXAT ms`), so replicas never drift.

use redis_module::raw::{RedisModuleString, REDISMODULE_NOTIFY_GENERIC, REDISMODULE_NOTIFY_STRING};
use rl_core::gcra::{self, GcraError};

use super::arg_bytes;
use crate::args::{self, shown};
use crate::clock;
use crate::ffi::{Ctx, Key};
use crate::stats::Counted;
use crate::store::keys::wrongtype;
use rl_core::codec::decimal;

pub fn throttle(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    let bytes = arg_bytes(argv);
    let a = args::parse_throttle(&bytes).map_err(|e| e.0)?;
    let now = clock::now_ns()?;
    let key = Key::open(ctx, argv[1], true);
    let tat = match key.string() {
        Err(()) => return Err(wrongtype()),
        Ok(None) => None,
        Ok(Some(raw)) => Some(parse_tat(raw).map_err(|past_2262| {
            let what =
                if past_2262 { "a time after the year 2262" } else { "a string that is not a CL.THROTTLE timestamp" };
            format!("ERR key '{}' holds {what}", shown(bytes[1]))
        })?),
    };
    let r = gcra::throttle(&a.quota, tat, now, a.quantity).map_err(|e| match e {
        GcraError::Overflow => {
            "ERR max_burst is too large for this period: the key would expire after the year 2262".to_string()
        }
        _ => "ERR quantity must be a non-negative integer".to_string(),
    })?;
    if let Some(new_tat) = r.new_tat_ns {
        let mut digits = [0u8; 20];
        let value = decimal(new_tat.max(0) as u64, &mut digits);
        let at = gcra::expires_at_ms(new_tat);
        if !key.set_string(value) {
            return Err("ERR could not write the key".into());
        }
        key.set_expire_at(at);
        ctx.replicate_set_pxat(argv[1], value, at.max(0));
        ctx.notify(REDISMODULE_NOTIFY_STRING, c"set", argv[1]);
        ctx.notify(REDISMODULE_NOTIFY_GENERIC, c"expire", argv[1]);
    }
    ctx.reply_array(5);
    ctx.reply_integer(r.limited as i64);
    ctx.reply_integer(r.limit);
    ctx.reply_integer(r.remaining);
    ctx.reply_integer(gcra::cell_seconds(r.retry_after_ns));
    ctx.reply_integer(gcra::cell_seconds(r.reset_after_ns));
    Ok(if r.limited { Counted::Denied } else { Counted::Allowed })
}

/// A TAT as redis-cell writes it: decimal nanoseconds. Err(true) for one
/// past i64 (redis-cell writes a u64; its calls that reach so far are
/// refused here), Err(false) for anything else.
fn parse_tat(raw: &[u8]) -> Result<i64, bool> {
    let text = std::str::from_utf8(raw).map_err(|_| false)?;
    text.parse().map_err(|_| text.parse::<u64>().is_ok())
}
