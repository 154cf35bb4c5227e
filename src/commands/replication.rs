//! The replication format, both sides: what a primary sends for the writes
//! of a call, and the internal commands that apply it on replicas and when
//! the AOF is replayed. Values are absolute (states, times, expiries), so a
//! replica never re-runs a decision on its own clock and ends with exactly
//! the primary's keys.
//!
//! - `RL.SET key blob pxat [key blob pxat ...]`: the key now holds the
//!   state `blob` (empty: no key, a full bucket) and expires at `pxat` (0:
//!   no expiry, as AOF rewrite emits it before its PEXPIREAT).
//! - `RL.LOGADD key drop_before at count pxat [...]`: an EXACT log drops its
//!   entries older than `drop_before`, then logs `count` requests at `at`.
//! - `RL.SLOT key expired_at id deadline count pxat [...]`: an in-flight key
//!   leaves out the slots past `expired_at`, then gives `id` a slot of
//!   `count` until `deadline` (count 0: releases it).
//! - `PEXPIREAT key ms`: a refusal that keeps a key alive longer.
//! - `SET key tat PXAT ms`: CL.THROTTLE's string.
//!
//! The internal commands check their arguments like any public command and
//! write nothing unless all of them are valid.

use redis_module::raw::{
    RedisModuleString, REDISMODULE_NOTIFY_GENERIC as NOTIFY_GENERIC, REDISMODULE_NOTIFY_MODULE as NOTIFY_MODULE,
};
use rl_core::codec::{self, decimal, Decoded, PackedBucket, PackedWindow};
use rl_core::exact_log::{Append, Log};
use rl_core::inflight::{Change, Slots};
use rl_core::limits::{MAX_KEYS, MAX_LOG_LIMIT, MAX_TIME_MS};
use smallvec::SmallVec;

use super::arg_bytes;
use crate::args::{int, named_twice, shown};
use crate::clock;
use crate::ffi::{Ctx, Key};
use crate::stats::Counted;
use crate::store::keys::{load, wrongtype, DistinctKeys};
use crate::store::{self, Value};

/// A write to one key, as replicas and the AOF must see it.
pub(crate) enum Effect<'c> {
    /// The key now holds `blob` and expires at `expires_at_ms`.
    Store { key: *mut RedisModuleString, blob: SmallVec<[u8; 32]>, expires_at_ms: u64 },
    /// The key is gone (a full bucket).
    Remove { key: *mut RedisModuleString },
    /// An EXACT log took an admission.
    LogAppend { key: *mut RedisModuleString, append: Append, expires_at_ms: u64 },
    /// An in-flight key's slots changed.
    Slot { key: *mut RedisModuleString, change: &'c Change, expires_at_ms: u64 },
}

/// Replicates the writes of one call: stores and removals as one `RL.SET`,
/// log appends as one `RL.LOGADD`. (A call makes one kind of write, so one
/// command, without a MULTI/EXEC wrapper.)
pub(crate) fn replicate(ctx: Ctx, effects: &[Effect]) {
    // The hot paths: one key, replicated from buffers (no module strings).
    match effects {
        [Effect::Store { key, blob, expires_at_ms }] => {
            return ctx.replicate_key_blob_at(c"RL.SET", *key, blob, *expires_at_ms as i64);
        }
        [Effect::Remove { key }] => return ctx.replicate_key_blob_at(c"RL.SET", *key, b"", 0),
        [Effect::Slot { key, change, expires_at_ms }] => return ctx.replicate_slot(*key, change, *expires_at_ms),
        _ => {}
    }
    let mut set: SmallVec<[*mut RedisModuleString; 12]> = SmallVec::new();
    let mut logadd: SmallVec<[*mut RedisModuleString; 12]> = SmallVec::new();
    let mut slot: SmallVec<[*mut RedisModuleString; 12]> = SmallVec::new();
    let mut created: SmallVec<[*mut RedisModuleString; 16]> = SmallVec::new();
    let mut new_string = |bytes: &[u8]| {
        let s = ctx.create_string(bytes);
        created.push(s);
        s
    };
    let mut digits = [0u8; 20];
    for e in effects {
        match e {
            Effect::Store { key, blob, expires_at_ms } => {
                set.extend([*key, new_string(blob), new_string(decimal(*expires_at_ms, &mut digits))]);
            }
            Effect::Remove { key } => set.extend([*key, new_string(b""), new_string(b"0")]),
            Effect::LogAppend { key, append, expires_at_ms } => {
                logadd.push(*key);
                for n in [append.drop_before_ms, append.at_ms, append.count, *expires_at_ms] {
                    logadd.push(new_string(decimal(n, &mut digits)));
                }
            }
            Effect::Slot { key, change, expires_at_ms } => {
                slot.extend([*key, new_string(decimal(change.expired_at_ms, &mut digits)), new_string(&change.id)]);
                for n in [change.deadline_ms, change.count, *expires_at_ms] {
                    slot.push(new_string(decimal(n, &mut digits)));
                }
            }
        }
    }
    if !set.is_empty() {
        ctx.replicate(c"RL.SET", &set);
    }
    if !logadd.is_empty() {
        ctx.replicate(c"RL.LOGADD", &logadd);
    }
    if !slot.is_empty() {
        ctx.replicate(c"RL.SLOT", &slot);
    }
    created.into_iter().for_each(|s| ctx.free_string(s));
}

/// `RL.SET key blob pxat [...]`.
pub fn set(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    let bytes = arg_bytes(argv);
    if bytes.len() < 4 || (bytes.len() - 1) % 3 != 0 {
        return Err("ERR wrong number of arguments for 'rl.set' command: expected key blob pxat triples".into());
    }
    at_most_max_keys("RL.SET", "key blob pxat triples", (bytes.len() - 1) / 3)?;
    let now = clock::now_ms()?;
    let mut writes: SmallVec<[(usize, Option<Decoded>, u64); 4]> = SmallVec::new();
    for (i, t) in bytes[1..].chunks_exact(3).enumerate() {
        let state = match t[1] {
            [] => None,
            blob => Some(codec::decode_at(blob, now).map_err(|e| format!("ERR RL.SET key '{}': {e}", shown(t[0])))?),
        };
        writes.push((1 + 3 * i, state, pxat(ctx, t[2], !t[1].is_empty())?));
    }
    let names: SmallVec<[*mut RedisModuleString; 4]> = writes.iter().map(|&(pos, ..)| argv[pos]).collect();
    let keys = DistinctKeys::new(&names).map_err(named_twice)?;
    let ours = [
        store::handle::<PackedBucket>(),
        store::handle::<PackedWindow>(),
        store::handle::<Log>(),
        store::handle::<Slots>(),
    ];
    let keys = keys.open(ctx, true);
    for key in &keys {
        match key.module_type() {
            Ok(None) => {}
            Ok(Some(t)) if ours.contains(&t) => {}
            _ => return Err(wrongtype()),
        }
    }
    for (key, (pos, state, at)) in keys.iter().zip(writes) {
        let stored = match state {
            None => {
                key.delete();
                ctx.notify(NOTIFY_GENERIC, c"del", argv[pos]);
                continue;
            }
            Some(Decoded::Bucket(v)) => replace(key, v),
            Some(Decoded::Window(v)) => replace(key, v),
            Some(Decoded::Log(v)) => replace(key, v),
            Some(Decoded::Inflight(v)) => replace(key, v),
        };
        if !stored {
            return Err("ERR could not store the state".into());
        }
        key.set_expire_at(if at == 0 { -1 } else { at as i64 });
        ctx.notify(NOTIFY_MODULE, c"rl.set", argv[pos]);
    }
    ctx.replicate_verbatim();
    ctx.reply_ok();
    Ok(Counted::Done)
}

/// Replaces whatever the key holds with `v` (this clears the TTL).
fn replace<T: Value>(key: &Key, v: T) -> bool {
    key.set_value(store::handle::<T>(), Box::new(v))
}

/// `RL.LOGADD key drop_before at count pxat [...]`.
pub fn logadd(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    let bytes = arg_bytes(argv);
    if bytes.len() < 6 || (bytes.len() - 1) % 5 != 0 {
        return Err(
            "ERR wrong number of arguments for 'rl.logadd' command: expected key drop_before at count pxat groups"
                .into(),
        );
    }
    at_most_max_keys("RL.LOGADD", "key drop_before at count pxat groups", (bytes.len() - 1) / 5)?;
    let now = clock::now_ms()?;
    let mut appends: SmallVec<[(Append, u64); 4]> = SmallVec::new();
    for g in bytes[1..].chunks_exact(5) {
        let time = |raw: &[u8], what: &str| {
            int(raw).filter(|&t| t <= MAX_TIME_MS).ok_or_else(|| {
                format!("ERR RL.LOGADD {what} must be a time in ms up to {MAX_TIME_MS}, got '{}'", shown(raw))
            })
        };
        let append = Append {
            drop_before_ms: time(g[1], "drop_before")?,
            at_ms: time(g[2], "at")?,
            count: int(g[3]).filter(|c| (1..=MAX_LOG_LIMIT).contains(c)).ok_or_else(|| {
                format!("ERR RL.LOGADD count must be an integer from 1 to {MAX_LOG_LIMIT}, got '{}'", shown(g[3]))
            })?,
        };
        appends.push((append, pxat(ctx, g[4], true)?));
    }
    let names: SmallVec<[*mut RedisModuleString; 4]> = (0..appends.len()).map(|i| argv[1 + 5 * i]).collect();
    let mut loaded = load::<Log>(ctx, DistinctKeys::new(&names).map_err(named_twice)?, true)?;
    for (i, (a, _)) in appends.iter().enumerate() {
        let empty = Log::default();
        let key = shown(bytes[1 + 5 * i]);
        let log = loaded.get(i).unwrap_or(&empty);
        log.accepts(a).and_then(|()| a.fits_clock(now)).map_err(|e| format!("ERR RL.LOGADD key '{key}': {e}"))?;
    }
    for (i, (a, at)) in appends.iter().enumerate() {
        // Accepted above: this cannot fail.
        loaded.get_or_create(i, Log::default)?.apply(a).map_err(|e| format!("ERR RL.LOGADD: {e}"))?;
        // 0 = no expiry, as for RL.SET.
        loaded.expire_at(i, if *at == 0 { u64::MAX } else { *at });
        ctx.notify(NOTIFY_MODULE, c"rl.logadd", names[i]);
    }
    ctx.replicate_verbatim();
    ctx.reply_ok();
    Ok(Counted::Done)
}

/// `RL.SLOT key expired_at id deadline count pxat [...]`: in-flight keys
/// leave out their slots with a deadline at or before `expired_at`, then
/// give `id` a slot of `count` until `deadline` (count 0: release it).
pub fn slot(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    let bytes = arg_bytes(argv);
    if bytes.len() < 7 || (bytes.len() - 1) % 6 != 0 {
        return Err(
            "ERR wrong number of arguments for 'rl.slot' command: expected key expired_at id deadline count pxat groups"
                .into(),
        );
    }
    at_most_max_keys("RL.SLOT", "key expired_at id deadline count pxat groups", (bytes.len() - 1) / 6)?;
    let now = clock::now_ms()?;
    let mut changes: SmallVec<[(Change, u64); 4]> = SmallVec::new();
    for g in bytes[1..].chunks_exact(6) {
        let number = |raw: &[u8], what: &str| {
            int(raw).ok_or_else(|| format!("ERR RL.SLOT {what} must be a non-negative integer, got '{}'", shown(raw)))
        };
        let change = Change {
            expired_at_ms: number(g[1], "expired_at")?,
            id: SmallVec::from_slice(g[2]),
            deadline_ms: number(g[3], "deadline")?,
            count: number(g[4], "count")?,
        };
        let at = pxat(ctx, g[5], true)?;
        changes.push((change, at));
    }
    let names: SmallVec<[*mut RedisModuleString; 4]> = (0..changes.len()).map(|i| argv[1 + 6 * i]).collect();
    let mut loaded = load::<Slots>(ctx, DistinctKeys::new(&names).map_err(named_twice)?, true)?;
    for (i, (c, _)) in changes.iter().enumerate() {
        let key = shown(bytes[1 + 6 * i]);
        let empty = Slots::default();
        let set = loaded.get(i).unwrap_or(&empty);
        set.accepts(c).and_then(|()| c.fits_clock(now)).map_err(|e| format!("ERR RL.SLOT key '{key}': {e}"))?;
    }
    for (i, (c, at)) in changes.iter().enumerate() {
        let slots = loaded.get_or_create(i, Slots::default)?;
        slots.apply(c).map_err(|e| format!("ERR RL.SLOT: {e}"))?;
        if slots.is_empty() {
            loaded.remove(i);
            ctx.notify(NOTIFY_GENERIC, c"del", names[i]);
            continue;
        }
        loaded.expire_at(i, if *at == 0 { u64::MAX } else { *at });
        ctx.notify(NOTIFY_MODULE, c"rl.slot", names[i]);
    }
    ctx.replicate_verbatim();
    ctx.reply_ok();
    Ok(Counted::Done)
}

/// The module never sends more groups than a call has keys: a longer
/// command is refused before any work that grows with it.
fn at_most_max_keys(cmd: &str, what: &str, groups: usize) -> Result<(), String> {
    if groups > MAX_KEYS {
        return Err(format!("ERR {cmd} takes at most {MAX_KEYS} {what}, got {groups}"));
    }
    Ok(())
}

/// An absolute expiry in ms since the Unix epoch. 0 is "none": AOF rewrite
/// emits it before the key's own PEXPIREAT, so it is taken while the server
/// loads its AOF, and refused otherwise for a key that is `stored`: a key
/// without a TTL could never expire nor be evicted by volatile-ttl.
fn pxat(ctx: Ctx, raw: &[u8], stored: bool) -> Result<u64, String> {
    let at = int(raw)
        .filter(|&v| v <= i64::MAX as u64)
        .ok_or_else(|| format!("ERR pxat must be a non-negative integer, got '{}'", shown(raw)))?;
    if at == 0 && stored && !ctx.is_loading() {
        return Err("ERR pxat 0 (no expiry) is only accepted while loading the AOF: every limiter key has a TTL".into());
    }
    Ok(at)
}
