//! The one path of every limiter command once the core has decided: write
//! what the core asks to write (a grant's changes, or a state re-stamped
//! after the clock stepped back) and replicate it, or else keep each key
//! alive as long as its state still counts; then reply.

use std::ffi::CStr;

use redis_module::raw::{
    RedisModuleString, REDISMODULE_NOTIFY_GENERIC as NOTIFY_GENERIC, REDISMODULE_NOTIFY_MODULE as NOTIFY_MODULE,
};
use rl_core::codec::{PackedBucket, PackedWindow};
use rl_core::combine::{Outcome, Update};
use rl_core::exact_log::{Append, Log};
use rl_core::inflight::{Change, Slots};
use rl_core::window::WindowState;
use rl_core::{BucketState, Reply, INLINE};
use smallvec::SmallVec;

use super::replication::{replicate, Effect};
use crate::ffi::Ctx;
use crate::stats::{self, Counted};
use crate::store::keys::Loaded;
use crate::store::Value;

/// A stored value the core's updates apply to.
pub(crate) trait Updated: Value {
    /// What the core hands back to write: a new state, or an admission.
    type Change;
    /// Writes `change` to key `i` and says how to replicate it.
    fn write<'c>(
        loaded: &mut Loaded<Self>,
        i: usize,
        key: *mut RedisModuleString,
        change: &'c Self::Change,
        expires_at_ms: u64,
    ) -> Result<Effect<'c>, String>;
}

/// Buckets and window counters: the new state replaces the old one.
macro_rules! replaced_by_state {
    ($packed:ty, $state:ty) => {
        impl Updated for $packed {
            type Change = $state;
            fn write<'c>(
                loaded: &mut Loaded<Self>,
                i: usize,
                key: *mut RedisModuleString,
                state: &'c $state,
                at: u64,
            ) -> Result<Effect<'c>, String> {
                // Packing keeps only the bits the stored form has: check the
                // ranges first, so nothing can wrap silently.
                state.validate().map_err(|e| format!("ERR state out of its stored range ({e:?})"))?;
                let packed = <$packed>::pack(state);
                loaded.store(i, packed, at)?;
                Ok(Effect::Store { key, blob: SmallVec::from_slice(&packed.to_blob()), expires_at_ms: at })
            }
        }
    };
}

replaced_by_state!(PackedBucket, BucketState);
replaced_by_state!(PackedWindow, WindowState);

impl Updated for Log {
    type Change = Append;
    fn write<'c>(
        loaded: &mut Loaded<Self>,
        i: usize,
        key: *mut RedisModuleString,
        append: &'c Append,
        at: u64,
    ) -> Result<Effect<'c>, String> {
        loaded
            .get_or_create(i, Log::default)?
            .apply(append)
            .map_err(|e| format!("ERR the EXACT log cannot take this admission: {e}"))?;
        loaded.expire_at(i, at);
        Ok(Effect::LogAppend { key, append: *append, expires_at_ms: at })
    }
}

impl Updated for Slots {
    type Change = Change;
    fn write<'c>(
        loaded: &mut Loaded<Self>,
        i: usize,
        key: *mut RedisModuleString,
        change: &'c Change,
        at: u64,
    ) -> Result<Effect<'c>, String> {
        let healed =
            loaded.get_or_create(i, Slots::default)?.apply(change).map_err(|e| format!("ERR in-flight key: {e}"))?;
        stats::INFLIGHT_HEALED.add(healed);
        loaded.expire_at(i, at);
        Ok(Effect::Slot { key, change, expires_at_ms: at })
    }
}

/// Carries out `outcome` on the keys `names` (loaded for writing). Each
/// written key fires the keyspace event `event` (class `d`, module types),
/// a removed one `del` and an expiry moved later `expire` (class `g`).
pub(crate) fn carry_out<T: Updated>(
    ctx: Ctx,
    event: &CStr,
    names: &[*mut RedisModuleString],
    loaded: &mut Loaded<T>,
    outcome: &Outcome<T::Change>,
) -> Result<(), String> {
    if outcome.updates.is_empty() {
        keep_alive(ctx, names, loaded, &outcome.keep_until_ms);
        return Ok(());
    }
    write(ctx, event, names, loaded, outcome.updates.iter().enumerate())
}

/// Writes `updates` (key index, update) to the loaded keys, replicates them
/// as one command and fires their keyspace events.
pub(crate) fn write<'a, T: Updated>(
    ctx: Ctx,
    event: &CStr,
    names: &[*mut RedisModuleString],
    loaded: &mut Loaded<T>,
    updates: impl Iterator<Item = (usize, &'a Update<T::Change>)>,
) -> Result<(), String>
where
    T::Change: 'a,
{
    let mut effects: SmallVec<[Effect; INLINE]> = SmallVec::new();
    let mut failed = Ok(());
    for (i, update) in updates {
        match update {
            Update::Store { state, expires_at_ms } => match T::write(loaded, i, names[i], state, *expires_at_ms) {
                Ok(effect) => effects.push(effect),
                // Cannot happen on a key opened for writing; still
                // replicate what was written so far.
                Err(e) => {
                    failed = Err(e);
                    break;
                }
            },
            // Nothing stored: no key. Nothing to do if there was none.
            Update::Remove if loaded.get(i).is_none() => {}
            Update::Remove => {
                loaded.remove(i);
                effects.push(Effect::Remove { key: names[i] });
            }
        }
    }
    publish(ctx, event, &effects);
    failed
}

/// Replicates the writes of a call as one command and fires their
/// keyspace events (`event` for a written key, `del` for a removed one).
pub(crate) fn publish(ctx: Ctx, event: &CStr, effects: &[Effect]) {
    replicate(ctx, effects);
    for effect in effects {
        match *effect {
            Effect::Remove { key } => ctx.notify(NOTIFY_GENERIC, c"del", key),
            Effect::Store { key, .. } | Effect::LogAppend { key, .. } | Effect::Slot { key, .. } => {
                ctx.notify(NOTIFY_MODULE, event, key)
            }
        }
    }
}

/// After a refusal: keeps every existing key until its state is worth
/// nothing under the parameters of this call (`keep_until[i]`, ms).
///
/// A key's TTL was set for the parameters of its last write. If they
/// changed since (a limit lowered live, a longer window), the key could
/// expire while it still holds debits, and come back full. So a refusal
/// moves such an expiry later, and replicates that; with unchanged
/// parameters it never has to, and writes nothing.
fn keep_alive<T: Value>(ctx: Ctx, names: &[*mut RedisModuleString], loaded: &Loaded<T>, keep_until: &[u64]) {
    for (i, &until) in keep_until.iter().enumerate() {
        if loaded.expires_at(i).is_some_and(|at| at < until) {
            loaded.expire_at(i, until);
            ctx.replicate_pexpireat(names[i], until as i64);
            ctx.notify(NOTIFY_GENERIC, c"expire", names[i]);
        }
    }
}

/// The six-integer reply: `[first, remaining, retry_after_ms, reset_after_ms,
/// limit, binding]`, `first` being allowed (0/1) or the tokens granted.
pub(crate) fn reply(ctx: Ctx, d: &Reply, first: i64) -> Counted {
    reply_with_time(ctx, d, first, None)
}

/// The six-integer reply, and `time` (the server's reading, ms) as a
/// seventh when asked for.
pub(crate) fn reply_with_time(ctx: Ctx, d: &Reply, first: i64, time: Option<u64>) -> Counted {
    ctx.reply_array(6 + usize::from(time.is_some()));
    ctx.reply_integer(first);
    ctx.reply_integer(d.remaining as i64);
    ctx.reply_integer(d.retry_after_ms);
    ctx.reply_integer(d.reset_after_ms as i64);
    ctx.reply_integer(d.limit as i64);
    ctx.reply_integer(d.binding as i64);
    if let Some(t) = time {
        ctx.reply_integer(t as i64);
    }
    if d.allowed() {
        Counted::Allowed
    } else {
        Counted::Denied
    }
}
