//! The module's commands as the server sees them: their table (flags, keys,
//! docs, ACL categories), their registration, and the boundary every call
//! runs behind (panics caught, calls counted). The families live in their
//! own files; `outcome.rs` is the path they share once the core has
//! decided, `replication.rs` the format their writes travel in.

use std::ffi::{c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use smallvec::SmallVec;

use crate::args::{self, FIRST_KEY};
use crate::ffi::{self, api, Ctx};
use crate::stats::{self, CommandStats, Counted};
use crate::store::keys::DistinctKeys;
use docs::{Access, Doc, Keys};

mod bucket;
mod docs;
mod inflight;
mod inspect;
mod outcome;
mod replication;
mod throttle;
mod window;

/// A command's body: replies on success, or returns the error to reply.
type Body = fn(Ctx, &[*mut RedisModuleString]) -> Result<Counted, String>;

/// Runs a command body with panics caught: a panic that reached the server
/// would abort it, so it becomes an error reply instead. Counts the call.
fn run(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    stats: &CommandStats,
    body: Body,
) -> c_int {
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
        extern "C" fn $fn_name(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
            run(ctx, argv, argc, &$stats, $body)
        }
    };
}

entry!(rl_take, stats::TAKE, bucket::take);
entry!(rl_peek, stats::PEEK, bucket::peek);
entry!(rl_lease, stats::LEASE, bucket::lease);
entry!(rl_refund, stats::REFUND, bucket::refund);
entry!(rl_window, stats::WINDOW, window::window);
entry!(rl_windowpeek, stats::WINDOWPEEK, window::peek);
entry!(cl_throttle, stats::THROTTLE, throttle::throttle);
entry!(rl_acquire, stats::ACQUIRE, inflight::acquire);
entry!(rl_release, stats::RELEASE, inflight::release);
entry!(rl_inflight, stats::INFLIGHT, inflight::peek);
entry!(rl_inspect, stats::INSPECT, inspect::inspect);
entry!(rl_set, stats::SET, replication::set);
entry!(rl_slot, stats::SLOT, replication::slot);
entry!(rl_logadd, stats::LOGADD, replication::logadd);

struct Command {
    name: &'static CStr,
    handler: extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int,
    flags: &'static CStr,
    /// Legacy key positions; (0, 0, 0) with `getkeys-api` for numkeys commands.
    keys: (c_int, c_int, c_int),
    /// ACL categories, on servers that let modules set them (7.2+, Valkey):
    /// `write`/`read` and `fast` as for built-in commands; the internal
    /// commands are `dangerous` too (they write raw state). The public ones
    /// are also in `ratelimit` where modules may add a category (7.4+).
    acl: &'static str,
    public: bool,
    doc: Doc,
}

const WRITE: &CStr = c"write deny-oom fast getkeys-api";
const READ: &CStr = c"readonly fast getkeys-api";
const SINCE: &CStr = c"0.1.0";

const fn doc(summary: &'static CStr, complexity: &'static CStr, keys: Keys, access: Access) -> Doc {
    Doc { summary, since: SINCE, complexity, keys, access }
}

const PER_KEY: &CStr = c"O(N) where N is the number of keys";
const PER_KEY_SLOTS: &CStr = c"O(N*M) where N is the number of keys and M the slots a key holds";

/// `numkeys` commands declare their keys through `getkeys-api`: the only way
/// Redis Cluster checks their slots (a key spec alone is ignored for routing).
const COMMANDS: &[Command] = &[
    Command {
        name: c"rl.take",
        handler: rl_take,
        flags: WRITE,
        keys: (0, 0, 0),
        acl: "write fast",
        public: true,
        doc: doc(c"Takes tokens from several token buckets, all or none.", PER_KEY, Keys::Numkeys, Access::Update),
    },
    Command {
        name: c"rl.peek",
        handler: rl_peek,
        flags: READ,
        keys: (0, 0, 0),
        acl: "read fast",
        public: true,
        doc: doc(c"Answers as RL.TAKE would, taking nothing.", PER_KEY, Keys::Numkeys, Access::Read),
    },
    Command {
        name: c"rl.lease",
        handler: rl_lease,
        flags: WRITE,
        keys: (0, 0, 0),
        acl: "write fast",
        public: true,
        doc: doc(
            c"Takes up to n tokens from several buckets, for a gateway to spend.",
            PER_KEY,
            Keys::Numkeys,
            Access::Update,
        ),
    },
    Command {
        name: c"rl.refund",
        handler: rl_refund,
        flags: WRITE,
        keys: (0, 0, 0),
        acl: "write fast",
        public: true,
        doc: doc(c"Gives unused tokens back to several buckets.", PER_KEY, Keys::Numkeys, Access::Update),
    },
    Command {
        name: c"rl.window",
        handler: rl_window,
        flags: WRITE,
        keys: (0, 0, 0),
        acl: "write fast",
        public: true,
        doc: doc(
            c"Counts a request in several sliding, exact or fixed windows, all or none.",
            c"O(N) where N is the number of keys; EXACT: O(N log M) with M entries in a log",
            Keys::Numkeys,
            Access::Update,
        ),
    },
    Command {
        name: c"rl.windowpeek",
        handler: rl_windowpeek,
        flags: READ,
        keys: (0, 0, 0),
        acl: "read fast",
        public: true,
        doc: doc(c"Answers as RL.WINDOW would, counting nothing.", PER_KEY, Keys::Numkeys, Access::Read),
    },
    Command {
        name: c"cl.throttle",
        handler: cl_throttle,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: "write fast",
        public: true,
        doc: doc(c"redis-cell's GCRA rate limit, on the server's clock.", c"O(1)", Keys::One, Access::Update),
    },
    Command {
        name: c"rl.acquire",
        handler: rl_acquire,
        flags: WRITE,
        keys: (0, 0, 0),
        acl: "write fast",
        public: true,
        doc: doc(
            c"Takes a slot in several in-flight limits, all or none.",
            PER_KEY_SLOTS,
            Keys::Numkeys,
            Access::Update,
        ),
    },
    Command {
        name: c"rl.release",
        handler: rl_release,
        // Not deny-oom: a release frees memory, and must not wait for the
        // deadline because the server is full.
        flags: c"write fast getkeys-api",
        keys: (0, 0, 0),
        acl: "write fast",
        public: true,
        doc: doc(
            c"Gives back the slots an id holds in several in-flight limits.",
            PER_KEY_SLOTS,
            Keys::Numkeys,
            Access::Update,
        ),
    },
    Command {
        name: c"rl.inflight",
        handler: rl_inflight,
        flags: READ,
        keys: (0, 0, 0),
        acl: "read fast",
        public: true,
        doc: doc(c"Answers as RL.ACQUIRE would, taking nothing.", PER_KEY_SLOTS, Keys::Numkeys, Access::Read),
    },
    Command {
        name: c"rl.inspect",
        handler: rl_inspect,
        flags: c"readonly fast",
        keys: (1, 1, 1),
        acl: "read fast",
        public: false,
        doc: doc(
            c"Shows what a limiter key holds, decoded: for operators.",
            c"O(1); O(M) for M slots or entries",
            Keys::One,
            Access::Read,
        ),
    },
    // Internal: the effects of writes, replicated and in the AOF.
    Command {
        name: c"rl.set",
        handler: rl_set,
        flags: c"write deny-oom fast",
        keys: (1, -1, 3),
        acl: "write fast dangerous",
        public: false,
        doc: doc(
            c"Internal: sets limiter states and expiries (replication, AOF).",
            PER_KEY,
            Keys::Every(3),
            Access::Overwrite,
        ),
    },
    Command {
        name: c"rl.logadd",
        handler: rl_logadd,
        flags: c"write deny-oom fast",
        keys: (1, -1, 5),
        acl: "write fast dangerous",
        public: false,
        doc: doc(
            c"Internal: logs an admission in EXACT logs (replication, AOF).",
            PER_KEY,
            Keys::Every(5),
            Access::Update,
        ),
    },
    Command {
        name: c"rl.slot",
        handler: rl_slot,
        flags: c"write deny-oom fast",
        keys: (1, -1, 6),
        acl: "write fast dangerous",
        public: false,
        doc: doc(
            c"Internal: changes the slots of in-flight keys (replication, AOF).",
            PER_KEY,
            Keys::Every(6),
            Access::Update,
        ),
    },
];

/// The module's ACL category, on servers that let modules add one (7.4+).
const ACL_CATEGORY: &CStr = c"ratelimit";

pub fn register(ctx: *mut RedisModuleCtx) -> Result<(), String> {
    // SAFETY: function pointers the server filled before OnLoad.
    // Redis 7.0 has neither (docs/security.md gives an ACL recipe for it); 7.2
    // can set categories but not add one.
    let (add_category, set_categories) =
        unsafe { (raw::RedisModule_AddACLCategory, raw::RedisModule_SetCommandACLCategories) };
    if let Some(add) = add_category {
        if unsafe { add(ctx, ACL_CATEGORY.as_ptr()) } != raw::REDISMODULE_OK as c_int {
            return Err("could not add the ACL category ratelimit".into());
        }
    }
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
        let cmd = unsafe { api!(RedisModule_GetCommand)(ctx, c.name.as_ptr()) };
        if cmd.is_null() {
            return Err(format!("could not find {} once registered", c.name.to_string_lossy()));
        }
        if !docs::set(cmd, &c.doc) {
            raw::redis_log(ctx, &format!("rl: no COMMAND DOCS for {}", c.name.to_string_lossy()));
        }
        if let Some(set_categories) = set_categories {
            let ours = if c.public && add_category.is_some() { " ratelimit" } else { "" };
            let categories = CString::new(format!("{}{ours}", c.acl)).unwrap_or_default();
            if unsafe { set_categories(cmd, categories.as_ptr()) } != raw::REDISMODULE_OK as c_int {
                return Err(format!("could not set the ACL categories of {}", c.name.to_string_lossy()));
            }
        }
    }
    Ok(())
}

/// The arguments as byte slices (inline for calls of up to three keys).
pub(crate) fn arg_bytes<'a>(argv: &[*mut RedisModuleString]) -> SmallVec<[&'a [u8]; 16]> {
    argv.iter().map(|&a| ffi::bytes(a)).collect()
}

/// The keys of a `CMD numkeys key ...` call, refused if one is named twice:
/// checked before the arguments after the keys are read, so a repeated key
/// is the error a call gets first.
pub(crate) fn numkeys_keys<'a>(
    argv: &'a [*mut RedisModuleString],
    bytes: &[&[u8]],
) -> Result<DistinctKeys<'a>, String> {
    let n = args::numkeys(bytes).map_err(|e| e.0)?;
    DistinctKeys::new(&argv[FIRST_KEY..FIRST_KEY + n]).map_err(args::named_twice)
}
