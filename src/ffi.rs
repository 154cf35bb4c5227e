//! The raw module API calls the commands make, each wrapped once.
//!
//! The hot path talks to the raw API directly instead of through the
//! redis-module crate's `Context`/`RedisKey` wrappers: those allocate a `Vec`
//! of arguments and box every key, which measured a third of a call's cost.
//! Most unsafe code is here; the rest stands next to the rule that makes it
//! sound: the native types' callbacks in `store/mod.rs`, the values of open
//! keys in `store/keys.rs`, registration in `commands/mod.rs` and `info.rs`,
//! the clock pointers in `clock.rs` and the module options in `lib.rs`.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString, RedisModuleType};

pub const OK: c_int = raw::REDISMODULE_OK as c_int;

/// Calls a module API function that every supported server (7.0+) exports.
/// The server fills these pointers before `OnLoad` runs; a missing one is a
/// server older than the module supports, which `OnLoad` refuses early.
macro_rules! api {
    ($name:ident) => {{
        #[allow(unused_unsafe)]
        let f = unsafe { raw::$name };
        match f {
            Some(f) => f,
            None => panic!(concat!("module API ", stringify!($name), " is missing")),
        }
    }};
}

/// The command's arguments, `argv[0]` being the command name.
pub fn args<'a>(argv: *mut *mut RedisModuleString, argc: c_int) -> &'a [*mut RedisModuleString] {
    if argv.is_null() || argc <= 0 {
        return &[];
    }
    // SAFETY: Redis passes argc valid string pointers that outlive the call.
    unsafe { std::slice::from_raw_parts(argv, argc as usize) }
}

/// The bytes of a module string (valid while the string lives).
pub fn bytes<'a>(s: *const RedisModuleString) -> &'a [u8] {
    let mut len = 0usize;
    // SAFETY: s is a live module string; the pointer stays valid with it.
    unsafe {
        let p = api!(RedisModule_StringPtrLen)(s, &mut len);
        if p.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        }
    }
}

/// A command invocation's context.
#[derive(Clone, Copy)]
pub struct Ctx(pub *mut RedisModuleCtx);

impl Ctx {
    pub fn reply_error(&self, msg: &str) {
        // NUL would end the C string early; newlines would break RESP.
        let clean: String = msg.chars().map(|c| if c == '\0' || c == '\r' || c == '\n' { ' ' } else { c }).collect();
        let msg = CString::new(clean).unwrap_or_default();
        unsafe { api!(RedisModule_ReplyWithError)(self.0, msg.as_ptr()) };
    }

    pub fn reply_array(&self, len: usize) {
        unsafe { api!(RedisModule_ReplyWithArray)(self.0, len as _) };
    }

    pub fn reply_integer(&self, v: i64) {
        unsafe { api!(RedisModule_ReplyWithLongLong)(self.0, v) };
    }

    pub fn reply_bulk(&self, bytes: &[u8]) {
        unsafe { api!(RedisModule_ReplyWithStringBuffer)(self.0, bytes.as_ptr().cast(), bytes.len()) };
    }

    pub fn reply_ok(&self) {
        unsafe { api!(RedisModule_ReplyWithSimpleString)(self.0, c"OK".as_ptr()) };
    }

    /// True when the server only asks which arguments are keys (`getkeys-api`).
    pub fn is_keys_position_request(&self) -> bool {
        unsafe { api!(RedisModule_IsKeysPositionRequest)(self.0) != 0 }
    }

    /// Fills `buf` with random hex characters from the server's generator
    /// (seeded from /dev/urandom): ids a client cannot guess.
    pub fn random_hex(&self, buf: &mut [u8]) {
        unsafe { api!(RedisModule_GetRandomHexChars)(buf.as_mut_ptr().cast(), buf.len()) };
    }

    /// True while the server loads its AOF or RDB (not for a client's call).
    pub fn is_loading(&self) -> bool {
        let flags = unsafe { api!(RedisModule_GetContextFlags)(self.0) };
        flags as u32 & raw::REDISMODULE_CTX_FLAGS_LOADING != 0
    }

    /// Declares `argv[pos]` a key; only in a keys position request, and only
    /// for a position below argc (the caller checks).
    pub fn key_at_pos(&self, pos: usize) {
        unsafe { api!(RedisModule_KeyAtPos)(self.0, pos as c_int) };
    }

    /// Fires a keyspace notification (`kind`: a REDISMODULE_NOTIFY_* class)
    /// for a key this call wrote; the server drops it unless
    /// notify-keyspace-events asks for that class.
    pub fn notify(&self, kind: c_int, event: &CStr, key: *mut RedisModuleString) {
        unsafe { api!(RedisModule_NotifyKeyspaceEvent)(self.0, kind, event.as_ptr(), key) };
    }

    /// Propagates `argv` as-is to replicas and the AOF (its arguments are
    /// absolute already) and marks the dataset dirty.
    pub fn replicate_verbatim(&self) {
        unsafe { api!(RedisModule_ReplicateVerbatim)(self.0) };
    }

    /// Propagates `cmd` with the given arguments as one command (no
    /// MULTI/EXEC wrapper) and marks the dataset dirty.
    pub fn replicate(&self, cmd: &CStr, args: &[*mut RedisModuleString]) {
        unsafe { api!(RedisModule_Replicate)(self.0, cmd.as_ptr(), c"v".as_ptr(), args.as_ptr(), args.len()) };
    }

    /// Propagates `cmd key blob at`: one key's state and expiry, the common
    /// case of RL.SET, without creating module strings for the arguments.
    pub fn replicate_key_blob_at(&self, cmd: &CStr, key: *mut RedisModuleString, blob: &[u8], at: i64) {
        unsafe {
            api!(RedisModule_Replicate)(
                self.0,
                cmd.as_ptr(),
                c"sbl".as_ptr(),
                key,
                blob.as_ptr().cast::<c_char>(),
                blob.len(),
                at,
            )
        };
    }

    /// Propagates `PEXPIREAT key at`: a refusal that keeps a key alive
    /// longer, from buffers like the other effects.
    pub fn replicate_pexpireat(&self, key: *mut RedisModuleString, at: i64) {
        unsafe { api!(RedisModule_Replicate)(self.0, c"PEXPIREAT".as_ptr(), c"sl".as_ptr(), key, at) };
    }

    /// Propagates `SET key value PXAT at`: CL.THROTTLE's effect, from
    /// buffers (module strings for the arguments cost a third of it).
    pub fn replicate_set_pxat(&self, key: *mut RedisModuleString, value: &[u8], at: i64) {
        unsafe {
            api!(RedisModule_Replicate)(
                self.0,
                c"SET".as_ptr(),
                c"sbcl".as_ptr(),
                key,
                value.as_ptr().cast::<c_char>(),
                value.len(),
                c"PXAT".as_ptr(),
                at,
            )
        };
    }

    /// `RL.SLOT key expired_at id deadline count pxat`, from buffers.
    pub fn replicate_slot(&self, key: *mut RedisModuleString, c: &rl_core::inflight::Change, at: u64) {
        unsafe {
            api!(RedisModule_Replicate)(
                self.0,
                c"RL.SLOT".as_ptr(),
                c"slblll".as_ptr(),
                key,
                c.expired_at_ms as i64,
                c.id.as_ptr().cast::<c_char>(),
                c.id.len(),
                c.deadline_ms as i64,
                c.count as i64,
                at as i64,
            )
        };
    }

    /// A new module string the caller frees with `free_string`.
    pub fn create_string(&self, bytes: &[u8]) -> *mut RedisModuleString {
        unsafe { api!(RedisModule_CreateString)(self.0, bytes.as_ptr().cast::<c_char>(), bytes.len()) }
    }

    pub fn free_string(&self, s: *mut RedisModuleString) {
        unsafe { api!(RedisModule_FreeString)(self.0, s) };
    }
}

/// What an opened key holds, seen from one native type.
pub enum Held<T> {
    Nothing,
    Ours(NonNull<T>),
    Other,
}

/// An open key, closed on drop.
///
/// The module asks the server not to signal every key opened for writing
/// (a refusal writes nothing, so it must not break a WATCH or invalidate
/// client-side caches): a key that was written signals itself when closed.
pub struct Key {
    ptr: *mut RedisModuleKey,
    ctx: Ctx,
    name: *mut RedisModuleString,
    written: Cell<bool>,
}

impl Key {
    pub fn open(ctx: Ctx, name: *mut RedisModuleString, write: bool) -> Key {
        let mode = if write { raw::REDISMODULE_READ | raw::REDISMODULE_WRITE } else { raw::REDISMODULE_READ };
        let ptr = unsafe { api!(RedisModule_OpenKey)(ctx.0, name, mode as c_int) };
        Key { ptr, ctx, name, written: Cell::new(false) }
    }

    /// The absolute expiry in ms, None if the key has none (or no key).
    pub fn expire_at(&self) -> Option<i64> {
        // Redis 8 dereferences the value: never ask about an empty key.
        if self.ptr.is_null()
            || unsafe { api!(RedisModule_KeyType)(self.ptr) } == raw::REDISMODULE_KEYTYPE_EMPTY as c_int
        {
            return None;
        }
        let at = unsafe { api!(RedisModule_GetAbsExpire)(self.ptr) };
        (at >= 0).then_some(at)
    }

    /// The native type of a module key; None for no key; Err for a key of
    /// a built-in type.
    pub fn module_type(&self) -> Result<Option<*mut RedisModuleType>, ()> {
        if self.ptr.is_null() {
            return Ok(None);
        }
        unsafe {
            let kind = api!(RedisModule_KeyType)(self.ptr);
            if kind == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
                Ok(None)
            } else if kind == raw::REDISMODULE_KEYTYPE_MODULE as c_int {
                Ok(Some(api!(RedisModule_ModuleTypeGetType)(self.ptr)))
            } else {
                Err(())
            }
        }
    }

    /// The key's value if it is of native type `ty`.
    pub fn held<T>(&self, ty: *mut RedisModuleType) -> Held<T> {
        if self.ptr.is_null() {
            return Held::Nothing;
        }
        unsafe {
            let kind = api!(RedisModule_KeyType)(self.ptr);
            match kind {
                _ if kind == raw::REDISMODULE_KEYTYPE_EMPTY as c_int => Held::Nothing,
                _ if kind == raw::REDISMODULE_KEYTYPE_MODULE as c_int
                    && api!(RedisModule_ModuleTypeGetType)(self.ptr) == ty =>
                {
                    match NonNull::new(api!(RedisModule_ModuleTypeGetValue)(self.ptr).cast::<T>()) {
                        Some(v) => Held::Ours(v),
                        None => Held::Other,
                    }
                }
                _ => Held::Other,
            }
        }
    }

    /// What a key of another kind holds: `Ok(None)` for no key, the bytes of
    /// a string key, `Err(())` for any other type.
    pub fn string(&self) -> Result<Option<&[u8]>, ()> {
        if self.ptr.is_null() {
            return Ok(None);
        }
        unsafe {
            let kind = api!(RedisModule_KeyType)(self.ptr);
            if kind == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
                return Ok(None);
            }
            if kind != raw::REDISMODULE_KEYTYPE_STRING as c_int {
                return Err(());
            }
            let mut len = 0usize;
            let p = api!(RedisModule_StringDMA)(self.ptr, &mut len, raw::REDISMODULE_READ as c_int);
            if p.is_null() {
                return Ok(Some(&[]));
            }
            Ok(Some(std::slice::from_raw_parts(p.cast::<u8>(), len)))
        }
    }

    /// Makes the key a string holding `value`. The string is written in the
    /// raw encoding, so that reading it back (StringDMA) does not re-encode
    /// the value on every call. A string key is rewritten in place (its TTL
    /// stays: set the new one after); a key of another type is replaced.
    pub fn set_string(&self, value: &[u8]) -> bool {
        self.written.set(true);
        unsafe {
            let kind = api!(RedisModule_KeyType)(self.ptr);
            if kind != raw::REDISMODULE_KEYTYPE_EMPTY as c_int && kind != raw::REDISMODULE_KEYTYPE_STRING as c_int {
                api!(RedisModule_DeleteKey)(self.ptr);
            }
            if api!(RedisModule_StringTruncate)(self.ptr, value.len()) != OK {
                return false;
            }
            let mut len = 0usize;
            let p = api!(RedisModule_StringDMA)(self.ptr, &mut len, raw::REDISMODULE_WRITE as c_int);
            if p.is_null() || len != value.len() {
                return false;
            }
            std::ptr::copy_nonoverlapping(value.as_ptr(), p.cast::<u8>(), len);
        }
        true
    }

    /// Stores a new boxed value of type `ty` (this clears any TTL).
    pub fn set_value<T>(&self, ty: *mut RedisModuleType, value: Box<T>) -> bool {
        self.written.set(true);
        let ptr = Box::into_raw(value);
        let status = unsafe { api!(RedisModule_ModuleTypeSetValue)(self.ptr, ty, ptr.cast::<c_void>()) };
        if status != OK {
            // The server did not take ownership.
            drop(unsafe { Box::from_raw(ptr) });
            return false;
        }
        true
    }

    /// Sets the absolute expiry, ms since the Unix epoch.
    pub fn set_expire_at(&self, at_ms: i64) {
        self.written.set(true);
        unsafe { api!(RedisModule_SetAbsExpire)(self.ptr, at_ms) };
    }

    pub fn delete(&self) {
        self.written.set(true);
        unsafe { api!(RedisModule_DeleteKey)(self.ptr) };
    }

    /// Notes a change made through a value pointer (in place).
    pub fn mark_written(&self) {
        self.written.set(true);
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if self.written.get() {
            unsafe { api!(RedisModule_SignalModifiedKey)(self.ctx.0, self.name) };
        }
        if !self.ptr.is_null() {
            unsafe { api!(RedisModule_CloseKey)(self.ptr) };
        }
    }
}

pub(crate) use api;
