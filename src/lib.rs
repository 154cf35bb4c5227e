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

use rl_core::limits::{DEFAULT_LOG_LIMIT, MAX_LOG_LIMIT};
use store::{BUCKET_TYPE, LOG_TYPE, WINDOW_TYPE};

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

/// MODULE LIST version: major * 10000 + minor * 100 + patch.
const MODULE_VERSION: i32 = 100;

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    let result = info::missing_api()
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
    data_types: [BUCKET_TYPE, WINDOW_TYPE, LOG_TYPE],
    init: init,
    configurations: [
        i64: [
            ["max-log-limit", &config::MAX_LOG_LIMIT, DEFAULT_LOG_LIMIT as i64, 1, MAX_LOG_LIMIT as i64, ConfigurationFlags::DEFAULT, None],
        ],
        // The macro needs every kind listed to read options from module args.
        string: [],
        bool: [],
        enum: [],
        module_args_as_configuration: true,
    ]
}
