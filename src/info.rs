//! `INFO rl` and the load-time check of the server's module API.

use std::ffi::{c_int, CString};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleInfoCtx};

use crate::ffi::api;
use crate::stats;

/// Refuses to load on a server that lacks a function the commands call
/// (older than Redis 7.0), instead of failing later in a command.
pub fn missing_api() -> Result<(), String> {
    let present = unsafe {
        [
            ("SetAbsExpire", raw::RedisModule_SetAbsExpire.is_some_and(|_| true)),
            ("GetAbsExpire", raw::RedisModule_GetAbsExpire.is_some_and(|_| true)),
            ("SignalModifiedKey", raw::RedisModule_SignalModifiedKey.is_some_and(|_| true)),
            ("SetModuleOptions", raw::RedisModule_SetModuleOptions.is_some_and(|_| true)),
            ("ReplicateVerbatim", raw::RedisModule_ReplicateVerbatim.is_some_and(|_| true)),
            ("Replicate", raw::RedisModule_Replicate.is_some_and(|_| true)),
            ("KeyAtPos", raw::RedisModule_KeyAtPos.is_some_and(|_| true)),
            ("Milliseconds", raw::RedisModule_Milliseconds.is_some_and(|_| true)),
            ("NotifyKeyspaceEvent", raw::RedisModule_NotifyKeyspaceEvent.is_some_and(|_| true)),
            ("GetContextFlags", raw::RedisModule_GetContextFlags.is_some_and(|_| true)),
            ("GetRandomHexChars", raw::RedisModule_GetRandomHexChars.is_some_and(|_| true)),
            ("ReplyWithStringBuffer", raw::RedisModule_ReplyWithStringBuffer.is_some_and(|_| true)),
            // The type callbacks and the INFO callback run outside the
            // panic boundary: what they call must be there.
            ("EmitAOF", raw::RedisModule_EmitAOF.is_some_and(|_| true)),
            ("DigestAddStringBuffer", raw::RedisModule_DigestAddStringBuffer.is_some_and(|_| true)),
            ("DigestEndSequence", raw::RedisModule_DigestEndSequence.is_some_and(|_| true)),
            ("SaveStringBuffer", raw::RedisModule_SaveStringBuffer.is_some_and(|_| true)),
            ("LoadStringBuffer", raw::RedisModule_LoadStringBuffer.is_some_and(|_| true)),
            ("RegisterInfoFunc", raw::RedisModule_RegisterInfoFunc.is_some_and(|_| true)),
            ("InfoAddSection", raw::RedisModule_InfoAddSection.is_some_and(|_| true)),
            ("InfoAddFieldCString", raw::RedisModule_InfoAddFieldCString.is_some_and(|_| true)),
            ("InfoAddFieldULongLong", raw::RedisModule_InfoAddFieldULongLong.is_some_and(|_| true)),
        ]
    };
    match present.iter().find(|(_, ok)| !ok) {
        Some((name, _)) => Err(format!("the server lacks RedisModule_{name}; Redis 7.0 or newer is required")),
        None => Ok(()),
    }
}

/// Replaces the crate's default INFO callback with ours.
pub fn register(ctx: *mut RedisModuleCtx) -> Result<(), String> {
    let status = unsafe { api!(RedisModule_RegisterInfoFunc)(ctx, Some(info)) };
    if status != raw::REDISMODULE_OK as c_int {
        return Err("could not register the INFO section".into());
    }
    Ok(())
}

/// The release, as `MODULE LIST` gives it in numbers (`ver`).
const VERSION: &std::ffi::CStr =
    match std::ffi::CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the crate version holds a NUL"),
    };

/// Section `rl`: `rl_version` and `rl_encoding_version` (what it writes),
/// `rl_<command>_<calls|allowed|denied|errors>` per command, then
/// `rl_release_unknown` and `rl_inflight_healed`.
unsafe extern "C" fn info(ctx: *mut RedisModuleInfoCtx, _for_crash_report: c_int) {
    api!(RedisModule_InfoAddSection)(ctx, c"".as_ptr().cast_mut());
    api!(RedisModule_InfoAddFieldCString)(ctx, c"rl_version".as_ptr().cast_mut(), VERSION.as_ptr().cast_mut());
    api!(RedisModule_InfoAddFieldULongLong)(
        ctx,
        c"rl_encoding_version".as_ptr().cast_mut(),
        crate::store::ENCODING_VERSION as u64,
    );
    for s in stats::ALL {
        for (what, value) in s.fields() {
            let Ok(name) = CString::new(format!("{}_{what}", s.name)) else { continue };
            api!(RedisModule_InfoAddFieldULongLong)(ctx, name.as_ptr().cast_mut(), value);
        }
    }
    for c in stats::COUNTERS {
        let Ok(name) = CString::new(c.name) else { continue };
        api!(RedisModule_InfoAddFieldULongLong)(ctx, name.as_ptr().cast_mut(), c.get());
    }
}
