//! The internal commands that carry the effects of writes to replicas and
//! the AOF. They are deterministic: states, times and expiries are absolute,
//! so a replica or an AOF replay ends with exactly the primary's keys. Each
//! checks its arguments like any public command and writes nothing unless
//! all of them are valid.
//!
//! - `RL.SET key blob pxat [key blob pxat ...]`: the key now holds the
//!   state `blob` (an empty blob: no key, a full bucket) and expires at
//!   `pxat` (0: no expiry, as AOF rewrite emits it before its PEXPIREAT).
//! - `RL.LOGADD key drop_before at count pxat [...]`: an EXACT log drops its
//!   entries older than `drop_before`, then logs `count` requests at `at`.

use redis_module::raw::RedisModuleString;
use rl_core::codec::{self, Decoded};
use rl_core::limits::{MAX_LOG_LIMIT, MAX_TIME_MS};
use rl_core::log::{Append, Log, LogError};
use smallvec::SmallVec;

use super::{arg_bytes, load, wrongtype};
use crate::args::{int, shown};
use crate::ffi::{Ctx, Key};
use crate::stats::Verdict;
use crate::store::{self, Value};

pub fn set(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    let bytes = arg_bytes(argv);
    if bytes.len() < 4 || (bytes.len() - 1) % 3 != 0 {
        return Err("ERR wrong number of arguments for 'rl.set' command: expected key blob pxat triples".into());
    }
    let mut writes: SmallVec<[(usize, Option<Decoded>, u64); 4]> = SmallVec::new();
    for (i, t) in bytes[1..].chunks_exact(3).enumerate() {
        let state = match t[1] {
            [] => None,
            blob => Some(codec::decode(blob).map_err(|e| format!("ERR RL.SET key '{}': {e}", shown(t[0])))?),
        };
        writes.push((1 + 3 * i, state, pxat(t[2])?));
    }
    no_repeated_key(bytes[1..].iter().step_by(3))?;
    let ours = [store::handle::<rl_core::codec::PackedBucket>(), store::handle::<rl_core::codec::PackedWindow>(), store::handle::<Log>()];
    let keys: SmallVec<[Key; 4]> = writes.iter().map(|&(pos, ..)| Key::open(ctx, argv[pos], true)).collect();
    for key in &keys {
        match key.module_type() {
            Ok(None) => {}
            Ok(Some(t)) if ours.contains(&t) => {}
            _ => return Err(wrongtype()),
        }
    }
    for (key, (_, state, at)) in keys.iter().zip(writes) {
        let stored = match state {
            None => {
                key.delete();
                continue;
            }
            Some(Decoded::Bucket(v)) => replace(key, v),
            Some(Decoded::Window(v)) => replace(key, v),
            Some(Decoded::Log(v)) => replace(key, v),
        };
        if !stored {
            return Err("ERR could not store the state".into());
        }
        key.set_expire_at(if at == 0 { -1 } else { at as i64 });
    }
    ctx.replicate_verbatim();
    ctx.reply_ok();
    Ok(Verdict::Done)
}

/// Replaces whatever the key holds with `v` (this clears the TTL).
fn replace<T: Value>(key: &Key, v: T) -> bool {
    key.set_value(store::handle::<T>(), Box::new(v))
}

pub fn logadd(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    let bytes = arg_bytes(argv);
    if bytes.len() < 6 || (bytes.len() - 1) % 5 != 0 {
        return Err(
            "ERR wrong number of arguments for 'rl.logadd' command: expected key drop_before at count pxat groups"
                .into(),
        );
    }
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
        appends.push((append, pxat(g[4])?));
    }
    no_repeated_key(bytes[1..].iter().step_by(5))?;
    let names: SmallVec<[*mut RedisModuleString; 4]> = (0..appends.len()).map(|i| argv[1 + 5 * i]).collect();
    let mut loaded = load::<Log>(ctx, &names, true)?;
    for (i, (a, _)) in appends.iter().enumerate() {
        let empty = Log::default();
        loaded.get(i).unwrap_or(&empty).accepts(a).map_err(|e| {
            let why = match e {
                LogError::Order => "at is older than the log's newest entry",
                LogError::Length => "the log would exceed its largest size",
                LogError::Entry => "count or at out of range",
            };
            format!("ERR RL.LOGADD key '{}': {why}", shown(bytes[1 + 5 * i]))
        })?;
    }
    for (i, (a, at)) in appends.iter().enumerate() {
        loaded.get_or_create(i, Log::default)?.apply(a);
        // 0 = no expiry, as for RL.SET.
        loaded.expire_at(i, if *at == 0 { u64::MAX } else { *at });
    }
    ctx.replicate_verbatim();
    ctx.reply_ok();
    Ok(Verdict::Done)
}

/// The internal commands name each key once: two handles on one key would
/// free the value the other still points to.
fn no_repeated_key<'a>(keys: impl Iterator<Item = &'a &'a [u8]> + Clone) -> Result<(), String> {
    for (i, k) in keys.clone().enumerate() {
        if keys.clone().take(i).any(|other| other == k) {
            return Err(format!("ERR key '{}' is named more than once", shown(k)));
        }
    }
    Ok(())
}

/// An absolute expiry in ms since the Unix epoch (0: none).
fn pxat(raw: &[u8]) -> Result<u64, String> {
    int(raw)
        .filter(|&v| v <= i64::MAX as u64)
        .ok_or_else(|| format!("ERR pxat must be a non-negative integer, got '{}'", shown(raw)))
}
