//! redis-rl: exact, atomic rate limiting inside Redis.
//!
//! This file only declares the module: its native types, its init (commands
//! and INFO) and the allocator. The algorithms live in the `rl-core` crate;
//! the glue in `commands/`, `store/`, `args.rs`, `clock.rs` and `ffi.rs`.

use redis_module::{redis_module, Context, RedisString, Status};

mod args;
mod clock;
mod commands;
mod ffi;
mod info;
mod stats;
mod store;

use store::bucket_type::BUCKET_TYPE;

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
    data_types: [BUCKET_TYPE],
    init: init,
}
