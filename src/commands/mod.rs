//! Command registration, the boundary every command runs behind, and what
//! the command families share: loading keys, writing effects, replicating
//! them, replying.

use std::ffi::{c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use rl_core::acquire::INLINE;
use rl_core::log::Append;
use smallvec::SmallVec;

use crate::args::{self, FIRST_KEY};
use docs::{Access, Doc, Keys};
use crate::ffi::{self, api, Ctx, Held, Key};
use crate::stats::{self, CommandStats, Verdict};
use crate::store::{self, Value};

mod bucket;
mod docs;
mod effects;
mod throttle;
mod window;

/// A command's body: replies on success, or returns the error to reply.
type Body = fn(Ctx, &[*mut RedisModuleString]) -> Result<Verdict, String>;

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
entry!(rl_set, stats::SET, effects::set);
entry!(rl_logadd, stats::LOGADD, effects::logadd);

struct Command {
    name: &'static CStr,
    handler: extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int,
    flags: &'static CStr,
    /// Legacy key positions; (0, 0, 0) with `getkeys-api` for numkeys commands.
    keys: (c_int, c_int, c_int),
    /// In the `@ratelimit` ACL category (the internal commands are not: a
    /// gateway's user should not be able to write raw state).
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

/// `numkeys` commands declare their keys through `getkeys-api`: the only way
/// Redis Cluster checks their slots (a key spec alone is ignored for routing).
const COMMANDS: &[Command] = &[
    Command {
        name: c"rl.take",
        handler: rl_take,
        flags: WRITE,
        keys: (0, 0, 0),
        public: true,
        doc: doc(c"Takes tokens from several token buckets, all or none.", PER_KEY, Keys::Numkeys, Access::Update),
    },
    Command {
        name: c"rl.peek",
        handler: rl_peek,
        flags: READ,
        keys: (0, 0, 0),
        public: true,
        doc: doc(c"Answers as RL.TAKE would, taking nothing.", PER_KEY, Keys::Numkeys, Access::Read),
    },
    Command {
        name: c"rl.lease",
        handler: rl_lease,
        flags: WRITE,
        keys: (0, 0, 0),
        public: true,
        doc: doc(c"Takes up to n tokens from several buckets, for a gateway to spend.", PER_KEY, Keys::Numkeys, Access::Update),
    },
    Command {
        name: c"rl.refund",
        handler: rl_refund,
        flags: WRITE,
        keys: (0, 0, 0),
        public: true,
        doc: doc(c"Gives unused tokens back to several buckets.", PER_KEY, Keys::Numkeys, Access::Update),
    },
    Command {
        name: c"rl.window",
        handler: rl_window,
        flags: WRITE,
        keys: (0, 0, 0),
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
        public: true,
        doc: doc(c"Answers as RL.WINDOW would, counting nothing.", PER_KEY, Keys::Numkeys, Access::Read),
    },
    Command {
        name: c"cl.throttle",
        handler: cl_throttle,
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        public: true,
        doc: doc(c"redis-cell's GCRA rate limit, on the server's clock.", c"O(1)", Keys::One, Access::Update),
    },
    // Internal: the effects of writes, replicated and in the AOF.
    Command {
        name: c"rl.set",
        handler: rl_set,
        flags: c"write deny-oom fast",
        keys: (1, -1, 3),
        public: false,
        doc: doc(c"Internal: sets limiter states and expiries (replication, AOF).", PER_KEY, Keys::Every(3), Access::Overwrite),
    },
    Command {
        name: c"rl.logadd",
        handler: rl_logadd,
        flags: c"write deny-oom fast",
        keys: (1, -1, 5),
        public: false,
        doc: doc(c"Internal: logs an admission in EXACT logs (replication, AOF).", PER_KEY, Keys::Every(5), Access::Update),
    },
];

/// The module's ACL category, on servers that let modules add one (7.4+).
const ACL_CATEGORY: &CStr = c"ratelimit";

pub fn register(ctx: *mut RedisModuleCtx) -> Result<(), String> {
    // SAFETY: function pointers the server filled before OnLoad.
    let acl = unsafe { raw::RedisModule_AddACLCategory.zip(raw::RedisModule_SetCommandACLCategories) };
    if let Some((add, _)) = acl {
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
        if let (Some((_, set_categories)), true) = (acl, c.public) {
            if unsafe { set_categories(cmd, ACL_CATEGORY.as_ptr()) } != raw::REDISMODULE_OK as c_int {
                return Err(format!("could not set the ACL category of {}", c.name.to_string_lossy()));
            }
        }
    }
    Ok(())
}

/// The arguments as byte slices (inline for calls of up to three keys).
pub(crate) fn arg_bytes<'a>(argv: &[*mut RedisModuleString]) -> SmallVec<[&'a [u8]; 16]> {
    argv.iter().map(|&a| ffi::bytes(a)).collect()
}

pub(crate) fn wrongtype() -> String {
    "WRONGTYPE Operation against a key holding the wrong kind of value".into()
}

/// Open keys and the values of type `T` they hold (None: no key).
pub(crate) struct Loaded<T> {
    keys: SmallVec<[Key; INLINE]>,
    values: SmallVec<[Option<NonNull<T>>; INLINE]>,
}

/// Opens `names` and reads each as a `T`; WRONGTYPE, before anything is
/// written, if one holds something else.
pub(crate) fn load<T: Value>(ctx: Ctx, names: &[*mut RedisModuleString], write: bool) -> Result<Loaded<T>, String> {
    let ty = store::handle::<T>();
    let keys: SmallVec<[Key; INLINE]> = names.iter().map(|&n| Key::open(ctx, n, write)).collect();
    let mut values = SmallVec::new();
    for key in &keys {
        values.push(match key.held::<T>(ty) {
            Held::Nothing => None,
            Held::Ours(v) => Some(v),
            Held::Other => return Err(wrongtype()),
        });
    }
    Ok(Loaded { keys, values })
}

impl<T: Value> Loaded<T> {
    pub fn get(&self, i: usize) -> Option<&T> {
        // SAFETY: the value belongs to the open key and lives while it does.
        self.values[i].map(|v| unsafe { v.as_ref() })
    }

    /// The value of key `i` to change, created by `new` if the key has none.
    pub fn get_or_create(&mut self, i: usize, new: impl FnOnce() -> T) -> Result<&mut T, String> {
        self.keys[i].mark_written();
        let v = match self.values[i] {
            Some(v) => v,
            None => {
                let ty = store::handle::<T>();
                if !self.keys[i].set_value(ty, Box::new(new())) {
                    return Err("ERR could not create the key".into());
                }
                let Held::Ours(v) = self.keys[i].held::<T>(ty) else {
                    return Err("ERR could not read back the new key".into());
                };
                self.values[i] = Some(v);
                v
            }
        };
        // SAFETY: as in `get`; the command holds the only reference.
        Ok(unsafe { &mut *v.as_ptr() })
    }

    /// Writes `value` to key `i` (in place when it exists) and its expiry.
    pub fn store(&mut self, i: usize, value: T, expires_at_ms: u64) -> Result<(), String> {
        match self.values[i] {
            Some(v) => {
                self.keys[i].mark_written();
                // SAFETY: as in `get`.
                unsafe { *v.as_ptr() = value }
            }
            None => {
                self.get_or_create(i, || value)?;
            }
        }
        self.keys[i].set_expire_at(expires_at_ms as i64);
        Ok(())
    }

    /// Sets key `i`'s expiry; u64::MAX: none.
    pub fn expire_at(&self, i: usize, expires_at_ms: u64) {
        self.keys[i].set_expire_at(i64::try_from(expires_at_ms).unwrap_or(-1));
    }

    pub fn remove(&mut self, i: usize) {
        self.keys[i].delete();
        self.values[i] = None;
    }

    /// After a refusal: keeps every existing key until its state is worth
    /// nothing under the parameters of this call (`keep_until[i]`, ms).
    ///
    /// A key's TTL was set for the parameters of its last write. If they
    /// changed since (a limit lowered live, a longer window), the key could
    /// expire while it still holds debits, and come back full. So a
    /// refusal moves such an expiry later, and replicates that; with
    /// unchanged parameters it never has to, and writes nothing.
    pub fn keep_until(&self, ctx: Ctx, names: &[*mut RedisModuleString], keep_until: impl Iterator<Item = u64>) {
        for (i, until) in keep_until.enumerate() {
            let Some(at) = self.values[i].and_then(|_| self.keys[i].expire_at()) else { continue };
            if (at as u64) < until {
                self.keys[i].set_expire_at(until as i64);
                let mut digits = [0u8; 20];
                let until = ctx.create_string(decimal(until, &mut digits));
                ctx.replicate(c"PEXPIREAT", &[names[i], until]);
                ctx.free_string(until);
            }
        }
    }
}

/// The six-integer reply: `[first, remaining, retry_after_ms, reset_after_ms,
/// limit, binding]`, `first` being allowed (0/1) or the tokens granted.
pub(crate) fn reply_decision(ctx: Ctx, d: &rl_core::Reply, first: i64) {
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
    /// An EXACT log took an admission.
    LogAppend { key: *mut RedisModuleString, append: Append, expires_at_ms: u64 },
}

/// Replicates the writes of one call: stores and removals as one
/// `RL.SET key blob pxat [...]`, log appends as one `RL.LOGADD key
/// drop_before at count pxat [...]`. Absolute values only, so a replica never
/// re-runs a decision on its own clock. (A call makes one kind of write, so
/// one command, without a MULTI/EXEC wrapper.)
pub(crate) fn replicate(ctx: Ctx, effects: &[Effect]) {
    // The hot path: one stored key.
    if let [Effect::Store { key, blob, expires_at_ms }] = effects {
        ctx.replicate_key_blob_at(c"RL.SET", *key, blob, *expires_at_ms as i64);
        return;
    }
    let mut set: SmallVec<[*mut RedisModuleString; 12]> = SmallVec::new();
    let mut logadd: SmallVec<[*mut RedisModuleString; 12]> = SmallVec::new();
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
        }
    }
    if !set.is_empty() {
        ctx.replicate(c"RL.SET", &set);
    }
    if !logadd.is_empty() {
        ctx.replicate(c"RL.LOGADD", &logadd);
    }
    created.into_iter().for_each(|s| ctx.free_string(s));
}

/// `v` in decimal, written into `buf`.
pub(crate) fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
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
