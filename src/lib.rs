//! redis-rl: exact, atomic rate limiting inside Redis.
//!
//! This file only declares the module: its native types, its option, its
//! init (commands and INFO) and the allocator. The algorithms live in the `rl-core` crate;
//! the glue in `commands/`, `store/`, `args.rs`, `clock.rs` and `ffi.rs`.

use redis_module::configuration::ConfigurationFlags;
use redis_module::{redis_module, Context, RedisString, Status};

mod args;
mod clock;
mod commands;
mod config;
mod ffi;
mod info;
mod stats;
mod store;

use rl_core::inflight::{DEFAULT_INFLIGHT_LIMIT, MAX_INFLIGHT_LIMIT};
use rl_core::limits::{DEFAULT_LOG_LIMIT, MAX_LOG_LIMIT};
use store::{BUCKET_TYPE, INFLIGHT_TYPE, LOG_TYPE, WINDOW_TYPE};

/// Redis's allocator in the server (so `used_memory` counts us); the system
/// allocator in unit tests, which run without a server.
#[cfg(not(test))]
macro_rules! allocator {
    () => {
        redis_module::alloc::RedisAlloc
    };
}
#[cfg(test)]
macro_rules! allocator {
    () => {
        std::alloc::System
    };
}

/// MODULE LIST version: major * 10000 + minor * 100 + patch, from the
/// crate's version (the workspace's, one for every crate).
const MODULE_VERSION: i32 = {
    const fn number(s: &str) -> i32 {
        let (bytes, mut i, mut n) = (s.as_bytes(), 0, 0);
        while i < bytes.len() {
            n = n * 10 + (bytes[i] - b'0') as i32;
            i += 1;
        }
        n
    }
    number(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + number(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + number(env!("CARGO_PKG_VERSION_PATCH"))
};

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    // Read errors in rdb_load come back as errors, not a server panic (a
    // crafted RESTORE payload must not kill the server); keys are signalled
    // as modified only when written (a refusal must not break a WATCH).
    unsafe {
        if let Some(set_options) = redis_module::raw::RedisModule_SetModuleOptions {
            set_options(
                ctx.ctx,
                (redis_module::raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
                    | redis_module::raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED) as i32,
            );
        }
    }
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let result = config::apply_load_args(&args)
        .and_then(|()| info::missing_api())
        .and_then(|()| commands::register(ctx.ctx))
        .and_then(|()| info::register(ctx.ctx));
    match result {
        Ok(()) => Status::Ok,
        Err(msg) => {
            ctx.log_warning(&format!("rl: not loaded: {msg}"));
            Status::Err
        }
    }
}

redis_module! {
    name: "rl",
    version: MODULE_VERSION,
    allocator: (allocator!(), allocator!()),
    data_types: [BUCKET_TYPE, WINDOW_TYPE, LOG_TYPE, INFLIGHT_TYPE],
    init: init,
    configurations: [
        i64: [
            ["max-log-limit", &config::MAX_LOG_LIMIT, DEFAULT_LOG_LIMIT as i64, 1, MAX_LOG_LIMIT as i64, ConfigurationFlags::DEFAULT, None],
            ["max-inflight-limit", &config::MAX_INFLIGHT_LIMIT, DEFAULT_INFLIGHT_LIMIT as i64, 1, MAX_INFLIGHT_LIMIT as i64, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [],
        enum: [],
        // Load arguments are read (and checked) by `config::apply_load_args`.
        module_args_as_configuration: false,
    ]
}
