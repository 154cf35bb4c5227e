//! The native data types that hold limiter state in the keyspace:
//! `rl-bucket` (a token bucket), `rl-window` (SLIDING and FIXED counters),
//! `rl-winlog` (an EXACT log) and `rl-flight` (requests in flight).
//!
//! Every way a value leaves memory (RDB, AOF rewrite, DUMP/MIGRATE, the
//! digest) goes through the one versioned blob of `rl_core::codec`, the same
//! bytes the replicated `RL.SET` carries. The callbacks are written once,
//! generic over the stored value.

use std::ffi::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::raw::{self, RedisModuleDigest, RedisModuleIO, RedisModuleString, RedisModuleType};
use rl_core::codec::{self, Decoded, PackedBucket, PackedWindow};
use rl_core::exact_log::Log;
use rl_core::inflight::Slots;
use smallvec::SmallVec;

use crate::ffi::api;

pub mod keys;

/// RDB encoding version of every type. The blob inside carries its own
/// format version too; this one changes only if the RDB framing does.
pub const ENCODING_VERSION: i32 = 1;

/// A value one of the native types stores.
pub trait Value: Sized + Clone {
    /// The versioned blob of `rl_core::codec`.
    fn blob(&self) -> SmallVec<[u8; 32]>;
    /// The value of a decoded blob, if it is of this type.
    fn from_stored(s: Decoded) -> Option<Self>;
    /// Bytes this value holds, for MEMORY USAGE.
    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
    }
    /// The native type that holds this value, and its name.
    fn native_type() -> &'static RedisType;
    const TYPE_NAME: &'static str;
    /// Called when the server frees the value.
    fn freed(&self) {}
}

impl Value for PackedBucket {
    const TYPE_NAME: &'static str = "rl-bucket";
    fn blob(&self) -> SmallVec<[u8; 32]> {
        SmallVec::from_slice(&self.to_blob())
    }
    fn from_stored(s: Decoded) -> Option<Self> {
        match s {
            Decoded::Bucket(p) => Some(p),
            _ => None,
        }
    }
    fn native_type() -> &'static RedisType {
        &BUCKET_TYPE
    }
}

impl Value for PackedWindow {
    const TYPE_NAME: &'static str = "rl-window";
    fn blob(&self) -> SmallVec<[u8; 32]> {
        SmallVec::from_slice(&self.to_blob())
    }
    fn from_stored(s: Decoded) -> Option<Self> {
        match s {
            Decoded::Window(p) => Some(p),
            _ => None,
        }
    }
    fn native_type() -> &'static RedisType {
        &WINDOW_TYPE
    }
}

impl Value for Log {
    const TYPE_NAME: &'static str = "rl-winlog";
    fn blob(&self) -> SmallVec<[u8; 32]> {
        SmallVec::from_vec(codec::log_blob(self))
    }
    fn from_stored(s: Decoded) -> Option<Self> {
        match s {
            Decoded::Log(l) => Some(l),
            _ => None,
        }
    }
    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.heap_bytes()
    }
    fn native_type() -> &'static RedisType {
        &LOG_TYPE
    }
}

impl Value for Slots {
    const TYPE_NAME: &'static str = "rl-flight";
    fn blob(&self) -> SmallVec<[u8; 32]> {
        SmallVec::from_vec(codec::inflight_blob(self))
    }
    fn from_stored(s: Decoded) -> Option<Self> {
        match s {
            Decoded::Inflight(v) => Some(v),
            _ => None,
        }
    }
    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.heap_bytes()
    }
    fn native_type() -> &'static RedisType {
        &INFLIGHT_TYPE
    }
    fn freed(&self) {
        // Slots still held when the key goes (it expired at its latest
        // deadline, or was deleted) and past their deadline: releases that
        // never came.
        crate::stats::INFLIGHT_HEALED.add(self.expired(crate::clock::system_ms()));
    }
}

pub static BUCKET_TYPE: RedisType =
    RedisType::new(PackedBucket::TYPE_NAME, ENCODING_VERSION, methods::<PackedBucket>());
pub static WINDOW_TYPE: RedisType =
    RedisType::new(PackedWindow::TYPE_NAME, ENCODING_VERSION, methods::<PackedWindow>());
pub static LOG_TYPE: RedisType = RedisType::new(Log::TYPE_NAME, ENCODING_VERSION, methods::<Log>());
pub static INFLIGHT_TYPE: RedisType = RedisType::new(Slots::TYPE_NAME, ENCODING_VERSION, methods::<Slots>());

/// The server's handle of `T`'s type, set when the module loaded.
pub fn handle<T: Value>() -> *mut RedisModuleType {
    *T::native_type().raw_type.borrow()
}

const fn methods<T: Value>() -> raw::RedisModuleTypeMethods {
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load::<T>),
        rdb_save: Some(rdb_save::<T>),
        aof_rewrite: Some(aof_rewrite::<T>),
        mem_usage: Some(mem_usage::<T>),
        digest: Some(digest::<T>),
        free: Some(free::<T>),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(copy::<T>),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    }
}

/// SAFETY (for all callbacks): the server passes a value this type created,
/// a `Box<T>` turned into a raw pointer.
fn value<'a, T>(v: *const c_void) -> &'a T {
    unsafe { &*v.cast::<T>() }
}

unsafe extern "C" fn rdb_load<T: Value>(rdb: *mut RedisModuleIO, encver: c_int) -> *mut c_void {
    let type_name = T::TYPE_NAME;
    if encver > ENCODING_VERSION {
        refused(rdb, &format!("{type_name} RDB encoding {encver} is newer than this module's {ENCODING_VERSION}"));
        return std::ptr::null_mut();
    }
    let Ok(buf) = raw::load_string_buffer(rdb) else {
        refused(rdb, &format!("{type_name} value could not be read"));
        return std::ptr::null_mut();
    };
    let blob = buf.as_ref();
    // What the module could have written, read on this server's clock: the
    // rule RESTORE, an RDB and RL.SET share.
    match codec::decode_at(blob, crate::clock::system_ms()) {
        Ok(decoded) => match T::from_stored(decoded) {
            Some(v) => Box::into_raw(Box::new(v)).cast(),
            None => {
                refused(rdb, &format!("{type_name} holds a blob of another kind ('{}')", blob[0] as char));
                std::ptr::null_mut()
            }
        },
        Err(e) => {
            let (kind, version) = (blob.first().copied().unwrap_or(0), blob.get(1).copied().unwrap_or(0));
            let what = format!("{type_name} blob (kind '{}', version {version}): {e}", kind.escape_ascii());
            refused(rdb, &what);
            std::ptr::null_mut()
        }
    }
}

/// Logs, before the load is refused, which key could not be loaded and why:
/// a server that stops on an RDB it cannot read must say what to fix
/// (typically a newer module's encoding: roll the module forward again).
unsafe fn refused(rdb: *mut RedisModuleIO, why: &str) {
    let key = raw::RedisModule_GetKeyNameFromIO
        .map(|f| f(rdb))
        .filter(|k| !k.is_null())
        .map(|k| crate::args::shown(crate::ffi::bytes(k)))
        .unwrap_or_else(|| "?".into());
    let Ok(line) = std::ffi::CString::new(format!("rl: cannot load key '{key}': {why}")) else { return };
    if let Some(log) = raw::RedisModule_LogIOError {
        log(rdb, c"warning".as_ptr(), c"%s".as_ptr(), line.as_ptr());
    }
}

unsafe extern "C" fn rdb_save<T: Value>(rdb: *mut RedisModuleIO, v: *mut c_void) {
    raw::save_slice(rdb, &value::<T>(v).blob());
}

/// AOF rewrite emits the internal `RL.SET key blob 0`; the server follows it
/// with the key's PEXPIREAT.
unsafe extern "C" fn aof_rewrite<T: Value>(aof: *mut RedisModuleIO, key: *mut RedisModuleString, v: *mut c_void) {
    let blob = value::<T>(v).blob();
    api!(RedisModule_EmitAOF)(aof, c"RL.SET".as_ptr(), c"sbl".as_ptr(), key, blob.as_ptr(), blob.len(), 0i64);
}

unsafe extern "C" fn mem_usage<T: Value>(v: *const c_void) -> usize {
    value::<T>(v).bytes()
}

unsafe extern "C" fn digest<T: Value>(md: *mut RedisModuleDigest, v: *mut c_void) {
    let blob = value::<T>(v).blob();
    api!(RedisModule_DigestAddStringBuffer)(md, blob.as_ptr().cast(), blob.len());
    api!(RedisModule_DigestEndSequence)(md);
}

unsafe extern "C" fn free<T: Value>(v: *mut c_void) {
    let v = Box::from_raw(v.cast::<T>());
    v.freed();
    drop(v);
}

unsafe extern "C" fn copy<T: Value>(
    _from: *mut RedisModuleString,
    _to: *mut RedisModuleString,
    v: *const c_void,
) -> *mut c_void {
    Box::into_raw(Box::new(value::<T>(v).clone())).cast()
}
